#pragma once

// The warm pool (DESIGN.md, docs/performance.md): job cgroup sets made ahead of time, each with
// a placeholder process of the spawner parked inside them. Moving a pid into a cgroup waits
// for an RCU grace period (~11 ms when spawns are 20 ms apart) while holding cgroup_mutex; the
// placeholder pays it while nobody waits, and the sandbox it clone3s on request is born inside
// every job cgroup (fork inherits membership), with no cgroup operation on the spawn path.
//
// Nothing is shared between jobs: an entry is one fresh cgroup set (no limits until its job
// writes them), one crash record and one placeholder, and it is used by exactly one job, which
// owns the cgroups and the record from then on. The sandbox itself (namespaces, mounts,
// seccomp, Landlock, the leased uid, the pinned executable) is built per job as before.
//
// Cleanup: the cgroups are recorded (CgroupRecords) before they exist, like a job's, so a
// crashed owner's entries are swept; destroying an entry's cgroups kills its placeholder (a
// member); the placeholders die with the spawner (PDEATHSIG).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "base/error.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/spawner.hpp"

namespace cordon::sandbox {

struct WarmPoolOptions {
  size_t size = 4;                   // entries kept ready
  std::string seccomp_profile_path;  // compiled by the spawner before each placeholder forks
  bool allow_ptrace = false;         // which variant of that profile
};

class WarmPool {
 public:
  // Pool cgroups and records are named kPoolCgroupPrefix + 16 random hex digits (cgroup.hpp).

  struct Entry {
    JobCgroup cgroup;   // fresh; the job writes its own limits (set_limits) before spawning
    RecordLock record;  // the held crash record of those cgroups (rename it after the job)
    uint64_t slot = 0;  // SpawnerClient::Request::pool_slot
    std::chrono::steady_clock::time_point made{};  // an entry never placed is dropped later
  };

  /// `records` and `spawner` are borrowed and must outlive the pool (both are safe to use
  /// from the refill thread). Empty until refill() or start().
  WarmPool(CgroupLayout layout, CgroupRecords& records, SpawnerClient& spawner,
           WarmPoolOptions options);
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;
  /// Stops the refill thread, then clear().
  ~WarmPool();

  /// Starts the background refill thread and asks it to fill the pool. Its work (mkdirs, a
  /// record, a fork of the spawner per entry) then never runs on a caller's path.
  void start();
  /// The oldest entry once its placeholder is placed, or nullopt (empty, or that placement
  /// still running: spawn unpooled rather than wait for it). The caller owns it: destroy its
  /// cgroup and remove its record when the job is done. Thread-safe; never asks for a refill
  /// (refill_later() when jobs settle does).
  std::optional<Entry> take();
  /// Asks the refill thread to top the pool up (no-op without start()). Call when a job's own
  /// cgroup work is done: a new placeholder's placement holds cgroup_mutex for a grace period,
  /// which would hold up a running job's cgroup.kill and rmdir.
  void refill_later();
  /// Adds entries until `size` are ready to take, on the calling thread. Stops at the first
  /// error and returns it (what was added stays).
  [[nodiscard]] Result<void> refill();
  /// Destroys every unused entry: its cgroups (which kills its placeholder), then its record.
  /// Returns the first error; the others are still attempted.
  [[nodiscard]] Result<void> clear();
  size_t available() const;
  const WarmPoolOptions& options() const { return options_; }

 private:
  Result<Entry> make_entry();
  // Destroys each entry's cgroups (killing its placeholder), then its record; a record whose
  // cgroups could not be removed stays for a later sweep. Returns the first error.
  static Result<void> destroy_entries(std::deque<Entry>& entries);
  // Whether the entry's placeholder is in all its cgroups (reads the last one's cgroup.procs).
  bool placed(const Entry& e) const;
  void refill_loop();

  const CgroupLayout layout_;
  CgroupRecords* const records_;
  SpawnerClient* const spawner_;
  const WarmPoolOptions options_;
  mutable std::mutex mu_;  // guards entries_, wanted_, stopping_
  std::condition_variable cv_;
  std::deque<Entry> entries_;
  bool wanted_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cordon::sandbox
