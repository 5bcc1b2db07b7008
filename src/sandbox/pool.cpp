#include "sandbox/pool.hpp"

#include <poll.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "sys/fs.hpp"
#include "sys/sigpipe.hpp"
#include "sys/syscalls.hpp"

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
// The seccomp profile and its options (allow_ptrace, allow_netlink_route) too: a parked init may
// have loaded the command's filters already (kPlanPreloadFilters), and the spawner sends a job with
// other ones unpooled.
bool fits(const SpawnerClient::Request& shape, const SpawnerClient::Request& job) {
  return same_sandbox_shape(shape.spec, job.spec) && shape.init_path == job.init_path &&
         shape.cgroupns_at_clone == job.cgroupns_at_clone &&
         shape.seccomp_profile_path == job.seccomp_profile_path &&
         seccomp_options(shape.spec) == seccomp_options(job.spec);
}

// Only what shapes a sandbox: never a job's argv, environment or executable, nor the caller's
// descriptors, host id or slot.
SpawnerClient::Request shape_of(const SpawnerClient::Request& request) {
  SpawnerClient::Request shape = request;
  shape.spec.argv.clear();
  shape.spec.env.clear();
  shape.spec.cwd = shape.spec.root;
  shape.spec.exec_dev = 0;
  shape.spec.exec_ino = 0;
  shape.cgroup_v2_fd = -1;
  shape.cgroup_v1_fds.clear();
  shape.host_id = 0;
  shape.pool_slot = 0;
  return shape;
}

bool same_limits(const CgroupLimits& a, const CgroupLimits& b) {
  return a.memory_bytes == b.memory_bytes && a.pids == b.pids && a.cpus == b.cpus;
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
  thread_ = std::thread([this] {
    sys::block_write_signals_for_thread();  // the library's thread: see sigpipe.hpp
    refill_loop();
  });
}

void WarmPool::refill_loop() {
  for (;;) {
    std::deque<Entry> stale;
    bool refill_now = false;
    {
      std::unique_lock lock(mu_);
      auto due = [this] { return wanted_ || !stale_.empty() || stopping_; };
      if (entries_.empty()) {
        cv_.wait(lock, due);
      } else {
        // The oldest entry is the front one: wake when it expires.
        cv_.wait_until(lock, entries_.front().made + options_.max_age, due);
      }
      if (stopping_) {
        return;
      }
      // Expired or dead entries are replaced at once, so an idle engine keeps fresh ones
      // ready (those of an old shape wait for a settle, like any refill).
      bool dropped = drop_unusable_locked(std::chrono::steady_clock::now());
      stale.swap(stale_);
      refill_now = wanted_ || dropped;
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

bool WarmPool::drop_unusable_locked(std::chrono::steady_clock::time_point now) {
  bool dropped = false;
  for (auto it = entries_.begin(); it != entries_.end();) {
    struct pollfd p {
      it->init.get(), POLLIN, 0
    };
    bool dead = it->init && ::poll(&p, 1, 0) == 1;
    // Its spawner died and was replaced: the slot is unknown to the new one, and its init dies
    // of PDEATHSIG (maybe not yet, so its pidfd alone could still look alive).
    bool orphaned = it->generation != spawner_->generation();
    if (dead || orphaned || now - it->made >= options_.max_age) {
      stale_.push_back(std::move(*it));
      it = entries_.erase(it);
      dropped = true;
    } else {
      ++it;
    }
  }
  return dropped;
}

std::optional<WarmPool::Entry> WarmPool::take(const SpawnerClient::Request& request,
                                              const CgroupLimits& limits) {
  if (request.spec.tty) {
    return std::nullopt;
  }
  std::optional<Entry> out;
  bool work_for_thread = false;
  {
    std::lock_guard lock(mu_);
    if (shape_ && fits(*shape_, request) && same_limits(shape_limits_, limits)) {
      candidate_misses_ = std::max(0, candidate_misses_ - 1);
      // A dropped entry is replaced by the pool's thread at once, as an expired one is.
      wanted_ = drop_unusable_locked(std::chrono::steady_clock::now()) || wanted_;
      if (!entries_.empty()) {
        out.emplace(std::move(entries_.front()));
        entries_.pop_front();
      }
    } else {
      if (candidate_ && fits(*candidate_, request) && same_limits(candidate_limits_, limits)) {
        ++candidate_misses_;
      } else {
        candidate_ = shape_of(request);
        candidate_limits_ = limits;
        candidate_misses_ = 1;
      }
      if (!shape_ || candidate_misses_ >= kSwitchAfterMisses) {
        // The shape asked for more often than the pool's own becomes it (an agent works in
        // one root). Only what shapes the sandbox is kept: never a job's argv or environment,
        // nor the caller's descriptors.
        shape_ = shape_of(request);
        shape_limits_ = limits;
        candidate_.reset();
        candidate_misses_ = 0;
        ++generation_;
        for (auto& e : entries_) {
          stale_.push_back(std::move(e));
        }
        entries_.clear();
      }
    }
    work_for_thread = wanted_ || !stale_.empty();
  }
  // Only when the pool's thread has something to do (stale entries to destroy, a dropped one
  // to replace): a wake-up for nothing took a core from the start that is taking the entry.
  if (work_for_thread) {
    cv_.notify_all();
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
  // As many entries as are missing now, no more: a take() while this builds leaves its entry
  // for the next refill (a settle), so a build never competes with the start that just took
  // one, and a pool seen full from outside stays full until a take.
  size_t missing = 0;
  {
    std::lock_guard lock(mu_);
    missing = options_.size - std::min(entries_.size(), options_.size);
  }
  for (; missing > 0; --missing) {
    SpawnerClient::Request shape;
    CgroupLimits limits;
    uint64_t generation = 0;
    {
      std::lock_guard lock(mu_);
      if (stopping_ || !shape_ || entries_.size() >= options_.size) {
        return {};
      }
      shape = *shape_;
      limits = shape_limits_;
      generation = generation_;
    }
    // Made without the lock: take() never waits for a mkdir or a sandbox build.
    CORDON_TRY_CTX(e, make_entry(shape, limits), "refill the warm pool");
    std::lock_guard lock(mu_);
    if (generation != generation_) {
      stale_.push_back(std::move(e));  // the shape changed meanwhile
      return {};
    }
    entries_.push_back(std::move(e));
  }
  return {};
}

Result<WarmPool::Entry> WarmPool::make_entry(const SpawnerClient::Request& shape,
                                             const CgroupLimits& limits) {
  CORDON_TRY(name, random_name());
  CORDON_TRY(paths, JobCgroup::paths_for(layout_, name));
  // Recorded before the cgroups exist, as a job's are: a crash in between leaves a record
  // whose sweep finds nothing to remove, never a cgroup nobody knows of.
  CORDON_TRY_CTX(record, records_->add(name, paths), "record pool cgroup");
  // The shape's limits, written now: a job that takes the entry has exactly these (take()).
  auto cg = JobCgroup::create(layout_, name, limits);
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
  // The engine is not the init's parent (the spawner is), but a pidfd still says when it
  // died. (Were the init already dead and its pid reused, the entry would only look alive:
  // the spawner still knows the slot is gone, and the job falls back.)
  UniqueFd init(sys::pidfd_open(slot->init, 0));
  if (!init) {
    // ESRCH: it died at once (the spawner drops its slot when it reaps it).
    return undo(Error::sys(errno, "pidfd_open the parked init"), "park a sandbox");
  }
  return Entry{std::move(*cg),
               std::move(record),
               std::move(*lease),
               slot->id,
               std::move(init),
               slot->generation,
               std::chrono::steady_clock::now()};
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
      // The record stays, so a later sweep retries; the host id stays ours, since the
      // sandbox may still run as it.
      std::lock_guard lock(mu_);  // the refill thread and clear() may both be here
      held_.push_back(std::move(e.lease));
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
