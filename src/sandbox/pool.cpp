#include "sandbox/pool.hpp"

#include <sys/random.h>

#include <cerrno>
#include <utility>

namespace cordon::sandbox {
namespace {

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

std::optional<WarmPool::Entry> WarmPool::take() {
  std::optional<Entry> e;
  bool empty = false;
  {
    std::lock_guard lock(mu_);
    if (!entries_.empty()) {
      e.emplace(std::move(entries_.front()));
      entries_.pop_front();
    }
    empty = entries_.empty();
  }
  if (empty) {
    refill_later();  // a burst: refill now rather than when a job settles
  }
  return e;
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
  return Entry{std::move(*cg), std::move(record), slot->id};
}

Result<void> WarmPool::clear() {
  std::deque<Entry> entries;
  {
    std::lock_guard lock(mu_);
    entries.swap(entries_);
  }
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
    return std::unexpected(std::move(*first).wrap("empty the warm pool"));
  }
  return {};
}

}  // namespace cordon::sandbox
