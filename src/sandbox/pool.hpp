#pragma once

// The warm pool (DESIGN.md, docs/performance.md): job cgroup sets made ahead of time, each with
// a placeholder process of the spawner parked inside its v1 cgroups. Moving a pid into a v1
// cgroup waits for an RCU grace period (~11 ms when spawns are 20 ms apart); the placeholder
// pays it while nobody waits, and the sandbox it clone3s on request is born inside the v1
// cgroups (fork inherits v1 membership; the v2 cgroup is still CLONE_INTO_CGROUP).
//
// Nothing is shared between jobs: an entry is one fresh cgroup set (no limits until its job
// writes them), one crash record and one placeholder, and it is used by exactly one job, which
// owns the cgroups and the record from then on. The sandbox itself (namespaces, mounts,
// seccomp, Landlock, the leased uid, the pinned executable) is built per job as before.
//
// Cleanup: the cgroups are recorded (CgroupRecords) before they exist, like a job's, so a
// crashed owner's entries are swept; destroying an entry's cgroups SIGKILLs its placeholder
// (it is a member of the v1 cgroups); the placeholders die with the spawner (PDEATHSIG).

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

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
  };

  /// `layout`, `records` and `spawner` are borrowed and must outlive the pool. Empty until
  /// refill().
  WarmPool(CgroupLayout layout, CgroupRecords& records, SpawnerClient& spawner,
           WarmPoolOptions options);
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;
  /// clear().
  ~WarmPool();

  /// The oldest entry (its placeholder most likely placed by now), or nullopt when empty.
  /// The caller owns it: destroy its cgroup and remove its record when the job is done.
  std::optional<Entry> take();
  /// Adds entries until `size` are ready to take. Each costs a few mkdirs, a record and a
  /// fork of the small spawner; the v1 placement happens later, in the placeholder. Stops at
  /// the first error and returns it (what was added stays).
  [[nodiscard]] Result<void> refill();
  /// Destroys every unused entry: its cgroups (which kills its placeholder), then its record.
  /// Returns the first error; the others are still attempted.
  [[nodiscard]] Result<void> clear();
  size_t available() const { return entries_.size(); }
  const WarmPoolOptions& options() const { return options_; }

 private:
  Result<Entry> make_entry();

  CgroupLayout layout_;
  CgroupRecords* records_;
  SpawnerClient* spawner_;
  WarmPoolOptions options_;
  std::deque<Entry> entries_;
};

}  // namespace cordon::sandbox
