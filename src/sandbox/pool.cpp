#include "sandbox/pool.hpp"

#include <sys/random.h>

#include <cerrno>
#include <utility>

#include "sys/fs.hpp"

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

// Whether a sandbox parked for `shape` can run `job` (the spawner checks the same, and the
// host id, again).
bool fits(const SpawnerClient::Request& shape, const SpawnerClient::Request& job) {
  return same_sandbox_shape(shape.spec, job.spec) && shape.init_path == job.init_path &&
         shape.cgroupns_at_clone == job.cgroupns_at_clone;
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
  thread_ = std::thread([this] { refill_loop(); });
}

void WarmPool::refill_loop() {
  for (;;) {
    std::deque<Entry> stale;
    bool refill_now = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return wanted_ || !stale_.empty() || stopping_; });
      if (stopping_) {
        return;
      }
      stale.swap(stale_);
      refill_now = wanted_;
      wanted_ = false;
    }
    (void)destroy_entries(stale);  // a record left behind is swept like a crashed job's
    if (refill_now) {
      // A failure (cgroups, a lease, the spawner) leaves the pool short: spawns go unpooled
      // until the next request succeeds.
      (void)refill();
    }
  }
}

std::optional<WarmPool::Entry> WarmPool::take(const SpawnerClient::Request& request) {
  if (request.spec.tty) {
    return std::nullopt;
  }
  std::optional<Entry> out;
  {
    std::lock_guard lock(mu_);
    if (!shape_ || !fits(*shape_, request)) {
      // The last job's shape is the one the next jobs most likely have (an agent works in
      // one root): the pool follows it. Its descriptors are the caller's, never kept.
      shape_ = request;
      shape_->cgroup_v2_fd = -1;
      shape_->cgroup_v1_fds.clear();
      shape_->host_id = 0;
      shape_->pool_slot = 0;
      ++generation_;
      for (auto& e : entries_) {
        stale_.push_back(std::move(e));
      }
      entries_.clear();
    } else if (!entries_.empty()) {
      out.emplace(std::move(entries_.front()));
      entries_.pop_front();
    }
  }
  cv_.notify_all();  // stale entries to destroy, if any
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
    SpawnerClient::Request shape;
    uint64_t generation = 0;
    {
      std::lock_guard lock(mu_);
      if (stopping_ || !shape_ || entries_.size() >= options_.size) {
        return {};
      }
      shape = *shape_;
      generation = generation_;
    }
    // Made without the lock: take() never waits for a mkdir or a sandbox build.
    CORDON_TRY_CTX(e, make_entry(shape), "refill the warm pool");
    std::lock_guard lock(mu_);
    if (generation != generation_) {
      stale_.push_back(std::move(e));  // the shape changed meanwhile
      return {};
    }
    entries_.push_back(std::move(e));
  }
}

Result<WarmPool::Entry> WarmPool::make_entry(const SpawnerClient::Request& shape) {
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
  auto undo = [&](Error e, const char* what) -> Result<Entry> {
    (void)cg->destroy();  // kills a sandbox that may have been cloned
    (void)record.remove();
    return std::unexpected(std::move(e).wrap("{}", what));
  };
  auto lease =
      HostIdLease::acquire(options_.lease_dir, options_.host_id_base, options_.host_id_count);
  if (!lease) {
    return undo(std::move(lease.error()), "lease a host id for the pool");
  }
  SpawnerClient::Request req = shape;
  req.host_id = lease->id();
  req.cgroup_v2_fd = cg->v2_dirfd();
  if (layout_.mode == CgroupMode::kHybrid) {
    req.cgroup_v1_fds = cg->v1_dirfds();
  }
  auto slot = spawner_->park(req);
  if (!slot) {
    return undo(std::move(slot.error()), "park a sandbox");
  }
  return Entry{std::move(*cg), std::move(record), std::move(*lease), slot->id};
}

Result<void> WarmPool::clear() {
  std::deque<Entry> entries;
  {
    std::lock_guard lock(mu_);
    entries.swap(entries_);
    for (auto& e : stale_) {
      entries.push_back(std::move(e));
    }
    stale_.clear();
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
