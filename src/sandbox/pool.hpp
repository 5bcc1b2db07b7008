#pragma once

// The warm pool (DESIGN.md, docs/performance.md): whole sandboxes built ahead of time, each
// parked in a fresh job cgroup set until one job takes it. Building a sandbox — clone3 with
// its namespaces, the cgroup placement, the mount tree, pivot_root, the Landlock rulesets, the
// privilege drop, the exec of its init — costs several milliseconds; a pooled start only hands
// the parked init its job (cwd, executable, plan, pipes), and the init forks and execs it.
//
// Nothing is shared between jobs: an entry is one fresh cgroup set (made with the limits of
// the shape's jobs), one crash record, one leased host id and one sandbox built for them, and it is
// used by exactly one job, which owns all of it from then on. Entries are built for one shape
// (sandbox::same_sandbox_shape: the working root, the --ro paths, the network, the identity,
// the quotas): the shape of the last job that asked. A job of another shape spawns unpooled
// and becomes the shape the pool refills with; tty jobs are never pooled.
//
// Cleanup: the cgroups are recorded (CgroupRecords) before they exist, like a job's, so a
// crashed owner's entries are swept; destroying an entry's cgroups kills its sandbox; parked
// sandboxes die with the spawner (it kills its children on EOF; PDEATHSIG otherwise).

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/spawner.hpp"
#include "sandbox/userns.hpp"

namespace cordon::sandbox {

struct WarmPoolOptions {
  size_t size = 4;  // entries kept ready
  // An entry older than this is rebuilt: a parked sandbox shows the host as it was when it
  // was built (the trees mounted under the root, for one), so a job never gets an older view.
  std::chrono::milliseconds max_age{30000};
  std::string lease_dir = kHostIdLeaseDir;  // HostIdLease's lock directory (host-wide)
  uid_t host_id_base = kHostIdBase;
  uid_t host_id_count = kHostIdCount;
};

class WarmPool {
 public:
  static constexpr int kSwitchAfterMisses = 2;
  // Pool cgroups and records are named kPoolCgroupPrefix + 16 random hex digits (cgroup.hpp).

  struct Entry {
    JobCgroup cgroup;         // fresh, made with the shape's limits (which are the job's)
    RecordLock record;        // the held crash record of those cgroups (rename it after the job)
    HostIdLease lease;        // the host id the sandbox was built for: the job's from now on
    uint64_t slot = 0;        // SpawnerClient::Request::pool_slot
    UniqueFd init;            // pidfd of the parked init: a dead one is dropped, not handed out
    uint64_t generation = 0;  // the spawner's (PoolSlot): an entry of a dead one is dropped
    std::chrono::steady_clock::time_point made{};
  };

  /// `records` and `spawner` are borrowed and must outlive the pool (both are safe to use
  /// from the refill thread). Empty until a take() names a shape and a refill follows.
  WarmPool(CgroupLayout layout, CgroupRecords& records, SpawnerClient& spawner,
           WarmPoolOptions options);
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;
  /// Stops the refill thread, then clear().
  ~WarmPool();

  /// Starts the background thread that refills the pool when asked (refill_later) and
  /// destroys the entries of a shape no longer wanted. Its work (mkdirs, a record, a lease and
  /// a sandbox build in the spawner per entry) never runs on a caller's path.
  void start();
  /// An entry whose sandbox fits `request` (its spec's shape, init, cgroup namespace mode)
  /// and whose cgroups were made with exactly `limits` (a job never writes its limits on the
  /// start path: the cpu quota alone is ~0.1 ms), or nullopt. A shape that misses
  /// kSwitchAfterMisses times more than the pool's own shape hits (and is not a tty) becomes the
  /// pool's shape: the old entries go (on the pool's thread) and refills build the new one, so two
  /// shapes that alternate do not rebuild the pool on every start. Thread-safe; never refills by
  /// itself (refill_later() when jobs settle does: a build costs a spawner's and a core's time that
  /// the job being started needs).
  std::optional<Entry> take(const SpawnerClient::Request& request, const CgroupLimits& limits);
  /// Asks the refill thread to top the pool up (no-op without start()). Call when a job's own
  /// cgroup work is done.
  void refill_later();
  /// Adds as many entries of the current shape as are missing from `size` when it is called,
  /// on the calling thread (an entry taken meanwhile waits for the next refill). Stops at the
  /// first error and returns it (what was added stays). Nothing without a shape.
  [[nodiscard]] Result<void> refill();
  /// Destroys every unused entry: its cgroups (which kills its sandbox), then its record and
  /// lease. Returns the first error; the others are still attempted.
  [[nodiscard]] Result<void> clear();
  size_t available() const;
  const WarmPoolOptions& options() const { return options_; }

 private:
  Result<Entry> make_entry(const SpawnerClient::Request& shape, const CgroupLimits& limits);
  // Destroys each entry's cgroups (killing its sandbox), then its record. When the cgroups
  // could not be removed, the record stays for a later sweep and the host-id lease is kept
  // (its sandbox may live on). Returns the first error.
  Result<void> destroy_entries(std::deque<Entry>& entries);
  void refill_loop();
  // Moves entries past max_age, whose init died or whose spawner was replaced, to stale_;
  // true if any. mu_ held.
  bool drop_unusable_locked(std::chrono::steady_clock::time_point now);

  const CgroupLayout layout_;
  CgroupRecords* const records_;
  SpawnerClient* const spawner_;
  const WarmPoolOptions options_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Entry> entries_;
  std::deque<Entry> stale_;  // of an older shape, destroyed by the pool's thread
  std::optional<SpawnerClient::Request> shape_;
  CgroupLimits shape_limits_;
  uint64_t generation_ = 0;  // of shape_: an entry built for an older one is stale
  std::optional<SpawnerClient::Request> candidate_;  // the last shape that missed
  CgroupLimits candidate_limits_;
  int candidate_misses_ = 0;       // less the pool shape's hits since
  std::vector<HostIdLease> held_;  // of entries whose sandbox could not be destroyed
  bool wanted_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cordon::sandbox
