#include "sandbox/pool.hpp"

#include <sys/random.h>

#include <cerrno>
#include <utility>

#include "sys/fs.hpp"

namespace cordon::sandbox {
namespace {
// An entry not placed this long after it was made never will be (its placeholder died or
// failed to enter): a placement waits for one RCU grace period, milliseconds even under load.
constexpr std::chrono::seconds kNeverPlaced{10};

// 64 random bits: pool names must not collide with a crashed engine's entries that no sweep
// has removed yet (its pid may be ours now), nor with another engine's.
Result<std::string> random_name() {
  uint64_t v = 0;
  size_t got = 0;
  while (got < sizeof v) {
    ssize_t n = ::getrandom(reinterpret_cast<char*>(&v) + got, sizeof v - got, 0);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return sys_error("getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return fmt::format("{}{:016x}", kPoolCgroupPrefix, v);
}

}  // namespace

WarmPool::WarmPool(CgroupLayout layout, CgroupRecords& records, SpawnerClient& spawner,
                   WarmPoolOptions options)
    : layout_(std::move(layout)),
      records_(&records),
      spawner_(&spawner),
      options_(std::move(options)) {}

WarmPool::~WarmPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
  (void)clear();
}

void WarmPool::start() {
  if (thread_.joinable()) {
    return;
  }
  {
    // Only when the caller's fill fell short: a refill the thread ran late would otherwise
    // top the pool up after a take, which must wait for a settle (see refill_later()).
    std::lock_guard lock(mu_);
    wanted_ = entries_.size() < options_.size;
  }
  thread_ = std::thread([this] { refill_loop(); });
}

void WarmPool::refill_loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return wanted_ || stopping_; });
      if (stopping_) {
        return;
      }
      wanted_ = false;
    }
    // A failure (cgroups, spawner) leaves the pool short: spawns go unpooled until the next
    // request succeeds.
    (void)refill();
  }
}

bool WarmPool::placed(const Entry& e) const {
  // The placeholder enters the v2 cgroup first, then each v1 one in order; once it is a member
  // of the last, its placement is done.
  std::vector<int> v1 = e.cgroup.v1_dirfds();
  int last = layout_.mode == CgroupMode::kHybrid && !v1.empty() ? v1.back() : e.cgroup.v2_dirfd();
  if (last < 0) {
    return true;  // nothing to enter
  }
  auto procs = sys::read_file_at(last, "cgroup.procs");
  return procs && !procs->empty();
}

std::optional<WarmPool::Entry> WarmPool::take() {
  // Failure fixed: an entry taken before its placeholder was placed made the spawner wait for
  // that placement's grace period, serially: 1000 starts at once took 9.5 ms per pooled spawn
  // (the pool refilled on every take and each fresh entry was taken at once). Such an entry
  // stays for a later take, and the caller spawns unpooled meanwhile; a burst no longer
  // refills the pool either (refill_later() when jobs settle does), since each placement holds
  // cgroup_mutex, which the unpooled spawns' cgroup mkdirs need.
  //
  // The first placed entry, not only the front one: an entry whose placeholder died or never
  // got in (its cgroup.procs stays empty) must not block the pool for good. Such an entry is
  // dropped once it is older than any placement takes, and the pool refills.
  std::optional<Entry> out;
  std::deque<Entry> stale;
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (placed(*it)) {
        out.emplace(std::move(*it));
        entries_.erase(it);
        break;
      }
      if (now - it->made > kNeverPlaced) {
        stale.push_back(std::move(*it));
        it = entries_.erase(it);
        continue;
      }
      ++it;
    }
  }
  if (!stale.empty()) {
    (void)destroy_entries(stale);  // a record left behind is swept like a crashed job's
    refill_later();
  }
  return out;
}

void WarmPool::refill_later() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) {
      return;
    }
    wanted_ = true;
  }
  cv_.notify_all();
}

size_t WarmPool::available() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

Result<void> WarmPool::refill() {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || entries_.size() >= options_.size) {
        return {};
      }
    }
    // Made without the lock: take() never waits for a mkdir or a fork.
    CORDON_TRY_CTX(e, make_entry(), "refill the warm pool");
    std::lock_guard lock(mu_);
    entries_.push_back(std::move(e));
  }
}

Result<WarmPool::Entry> WarmPool::make_entry() {
  CORDON_TRY(name, random_name());
  CORDON_TRY(paths, JobCgroup::paths_for(layout_, name));
  // Recorded before the cgroups exist, as a job's are: a crash in between leaves a record
  // whose sweep finds nothing to remove, never a cgroup nobody knows of.
  CORDON_TRY_CTX(record, records_->add(name, paths), "record pool cgroup");
  auto cg = JobCgroup::create(layout_, name, CgroupLimits{});
  if (!cg) {
    (void)record.remove();
    return std::unexpected(std::move(cg.error()).wrap("create pool cgroup"));
  }
  std::vector<int> v1;
  if (layout_.mode == CgroupMode::kHybrid) {
    v1 = cg->v1_dirfds();
  }
  auto slot =
      spawner_->pool_add(options_.seccomp_profile_path, options_.allow_ptrace, cg->v2_dirfd(), v1);
  if (!slot) {
    (void)cg->destroy();
    (void)record.remove();
    return std::unexpected(std::move(slot.error()).wrap("park a placeholder"));
  }
  return Entry{std::move(*cg), std::move(record), slot->id, std::chrono::steady_clock::now()};
}

Result<void> WarmPool::clear() {
  std::deque<Entry> entries;
  {
    std::lock_guard lock(mu_);
    entries.swap(entries_);
  }
  CORDON_CHECK_CTX(destroy_entries(entries), "empty the warm pool");
  return {};
}

Result<void> WarmPool::destroy_entries(std::deque<Entry>& entries) {
  std::optional<Error> first;
  while (!entries.empty()) {
    Entry e = std::move(entries.front());
    entries.pop_front();
    auto destroyed = e.cgroup.destroy();
    if (!destroyed) {
      // The record stays, so a later sweep retries.
      if (!first) {
        first = std::move(destroyed.error());
      }
      continue;
    }
    auto removed = e.record.remove();
    if (!removed && !first) {
      first = std::move(removed.error());
    }
  }
  if (first) {
    return std::unexpected(std::move(*first));
  }
  return {};
}

}  // namespace cordon::sandbox
