#pragma once

// One cgroup per sandboxed command. Two host shapes are supported:
//  - kUnified: memory, pids and cpu are available in the cgroup v2 hierarchy; one v2 cgroup
//    per job carries limits, accounting, tracking and cgroup.kill.
//  - kHybrid: those controllers are bound to v1 hierarchies; v1 job cgroups carry the limits
//    and their accounting, a v2 job cgroup (no controllers needed) carries tracking
//    (CLONE_INTO_CGROUP, cgroup.events) and cgroup.kill, plus CPU time from its core cpu.stat.
// Every root comes from the CgroupLayout, so unit tests run on a temp dir laid out like
// cgroupfs. Job cgroups live in "<cordon's own cgroup in that hierarchy>/cordon/<job>".

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"

namespace cordon::sandbox {

enum class CgroupMode { kUnified, kHybrid };

/// "unified" or "hybrid", for `cordon doctor` and logs.
std::string_view to_string(CgroupMode mode);

struct CgroupLimits {
  uint64_t memory_bytes = 0;  // 0 = unset
  uint64_t pids = 0;          // 0 = unset
  double cpus = 0;            // 0 = unset; 1.5 = one and a half CPUs of quota per period
};

struct CgroupLayout {
  CgroupMode mode = CgroupMode::kUnified;
  std::string v2_parent;  // where job cgroups are created in the v2 (unified) hierarchy
  std::string v1_memory_parent, v1_pids_parent, v1_cpu_parent;  // hybrid only
};

/// Decides the layout from the text of /proc/self/cgroup, /proc/self/mountinfo and the
/// cgroup.controllers file of our own v2 cgroup (empty when unreadable). Pure: no syscalls.
/// Errors (kUnsupported) name what is missing: no cgroup2 mount, a controller on neither
/// hierarchy, our cgroup not visible through any mount.
[[nodiscard]] Result<CgroupLayout> detect_cgroup_layout(std::string_view proc_self_cgroup,
                                                        std::string_view proc_self_mountinfo,
                                                        std::string_view v2_own_controllers);
/// The directory of our own cgroup in the v2 hierarchy, from the same two texts; pure.
[[nodiscard]] Result<std::string> own_v2_cgroup_dir(std::string_view proc_self_cgroup,
                                                    std::string_view proc_self_mountinfo);
/// Reads /proc/self/{cgroup,mountinfo} and our v2 cgroup.controllers, then decides as above.
[[nodiscard]] Result<CgroupLayout> detect_cgroup_layout();

/// The leaf of cordon's own v2 cgroup that cordon moves itself into on a pure v2 host, so its
/// own cgroup can pass controllers on (below). A process found in `<own>/cordon-self` counts
/// `<own>` as its own cgroup, so every cordon process of that cgroup agrees on the layout.
inline constexpr std::string_view kSelfLeafName = "cordon-self";

/// What cgroup v2's no-internal-process rule asks of cordon's own cgroup (the job parent's
/// parent) on kUnified: a cgroup other than the hierarchy's root can enable controllers for its
/// children only while no process is in it, and cordon is in it.
struct V2Delegation {
  std::string own;  // our own cgroup's directory (kUnified)
  /// `<own>/cordon-self`, which prepare_parents moves this process into before it passes the
  /// controllers on; empty when nothing needs to move (hybrid, the root, or the three already
  /// passed on).
  std::string leaf;
  /// This process is in the leaf already, not in `<own>` (started there by an earlier cordon
  /// or systemd's DelegateSubgroup=): nothing moves, and a failure leaves it there.
  bool in_leaf = false;
};

/// Reads what V2Delegation says. Refuses, naming the reason and what to run instead (a cgroup
/// of cordon's own, delegated to it), when our own cgroup is not a `domain` cgroup, when it is
/// a systemd unit's without Delegate=yes (no `trusted.delegate`/`user.delegate` xattr), or when
/// it holds any process but this one (named: moving someone else's processes is not cordon's
/// to do). Reads only; an error for anything unreadable.
[[nodiscard]] Result<V2Delegation> check_v2_delegation(const CgroupLayout& layout);

/// Creates the layout's parent dirs (only those; an existing one is reused) and, on kUnified,
/// enables memory, pids and cpu in the parent's cgroup.subtree_control. When our own cgroup
/// holds only this process and does not pass the three on yet (a systemd unit or scope with
/// Delegate=yes), first moves it into `<own>/cordon-self` and enables the three in our own
/// cgroup's cgroup.subtree_control (what a delegated cgroup's owner does), undoing the move when
/// that fails. Fails with a message naming the controllers when our own cgroup does not get
/// them from its parent.
[[nodiscard]] Result<void> prepare_parents(const CgroupLayout& layout);

struct CgroupUsage {
  uint64_t peak_memory_bytes = 0;  // v2 memory.peak / v1 memory.max_usage_in_bytes
  uint64_t cpu_usec = 0;           // the v2 job cgroup's cpu.stat usage_usec (both modes)
  uint64_t oom_kills = 0;          // v2 memory.events oom_kill / v1 memory.oom_control oom_kill
  uint64_t pids_max_hits = 0;      // pids.events max (forks refused at pids.max)
};

/// A job's cgroups. Move-only RAII: the destructor kills, waits for empty and removes every
/// directory the job created (errors there are dropped; call destroy() to see them).
class JobCgroup {
 public:
  /// How long destroy() waits for a killed cgroup to empty before giving up.
  static constexpr std::chrono::milliseconds kEmptyTimeout{5000};

  /// Creates "<parent>/<name>" in every hierarchy of the layout (an existing one is an error:
  /// it may hold someone else's processes), then applies `limits`. On failure nothing is left.
  [[nodiscard]] static Result<JobCgroup> create(const CgroupLayout& layout, const std::string& name,
                                                const CgroupLimits& limits);
  /// Takes over existing job cgroups (crash recovery): v2 and v1 dirs are told apart by statfs.
  [[nodiscard]] static Result<JobCgroup> adopt(const std::vector<std::string>& paths);
  /// The directories create() would make for `name`, so a record can be written first.
  [[nodiscard]] static Result<std::vector<std::string>> paths_for(const CgroupLayout& layout,
                                                                  const std::string& name);

  JobCgroup(JobCgroup&& other) noexcept;
  JobCgroup& operator=(JobCgroup&& other) noexcept;
  JobCgroup(const JobCgroup&) = delete;
  JobCgroup& operator=(const JobCgroup&) = delete;
  ~JobCgroup();

  /// Writes the limits (unset fields are left as they are). Separate from create() so a
  /// pre-created cgroup can receive the final limits when its job starts.
  [[nodiscard]] Result<void> set_limits(const CgroupLimits& limits);
  /// O_DIRECTORY|O_CLOEXEC fd of the v2 job cgroup, for clone_args.cgroup; owned by this object.
  int v2_dirfd() const { return v2_.fd.get(); }
  /// O_DIRECTORY|O_CLOEXEC fds of the v1 job cgroups (one per unique hierarchy; empty on
  /// kUnified), owned by this object: where a new sandbox moves itself (their `tasks`).
  std::vector<int> v1_dirfds() const {
    std::vector<int> fds;
    for (const Dir& d : v1_) {
      fds.push_back(d.fd.get());
    }
    return fds;
  }
  /// Hybrid: moves `pid` into each v1 job cgroup, exactly one cgroup.procs write per
  /// hierarchy (each write can cost an RCU grace period, ~11 ms). No-op on kUnified.
  [[nodiscard]] Result<void> place_v1(pid_t pid);
  /// cgroup.kill on v2 (atomic against forks); falls back to SIGKILL of each listed pid
  /// when cgroup.kill is missing (< 5.14), and SIGKILLs anything left in the v1 cgroups.
  [[nodiscard]] Result<void> kill();
  /// Whether any process is in the v2 job cgroup (cgroup.events); a removed cgroup is empty.
  [[nodiscard]] Result<bool> populated() const;
  [[nodiscard]] Result<CgroupUsage> usage() const;
  /// Kills, waits until empty (POLLPRI on cgroup.events, pidfds for v1 stragglers, bounded by
  /// kEmptyTimeout) and removes every job cgroup. Idempotent; afterwards the object is empty.
  [[nodiscard]] Result<void> destroy();
  /// Every directory this job created (v2 first), for records.
  std::vector<std::string> paths() const;

 private:
  struct Dir {
    std::string path;
    UniqueFd fd;
  };
  JobCgroup() = default;

  CgroupMode mode_ = CgroupMode::kUnified;
  Dir v2_;
  std::vector<Dir> v1_;  // unique v1 job dirs (co-mounted controllers share one)
  int v1_memory_ = -1;   // index into v1_ of each controller's dir, -1 on kUnified
  int v1_pids_ = -1;
  int v1_cpu_ = -1;
};

/// A held record lock: the flock on the record file, kept for the job's lifetime. Dropping
/// it (or the process dying) leaves the record for a sweep; remove() deletes it.
/// The fd is O_CLOEXEC: a fork without exec would inherit the lock and keep it alive.
class RecordLock {
 public:
  RecordLock() = default;
  RecordLock(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  /// Deletes the record (call after the job's cgroups are destroyed) and releases the lock.
  [[nodiscard]] Result<void> remove();
  /// Renames the record to `<name>.cgroups` in its directory (never replacing one), keeping
  /// the lock: a warm-pool entry's record becomes its job's. Its paths keep their names.
  [[nodiscard]] Result<void> rename(const std::string& name);
  const std::string& path() const { return path_; }
  bool held() const { return fd_.valid(); }

 private:
  std::string path_;
  UniqueFd fd_;
};

/// Warm-pool cgroups are named this prefix + 16 lower-case hex digits (sandbox/pool.hpp).
inline constexpr std::string_view kPoolCgroupPrefix = "pool-";
/// Whether `name` is such a name.
bool is_pool_cgroup_name(std::string_view name);
/// The processes of the warm-pool entries recorded in `records_dir` that no job has taken
/// (their record still has its pool name): the parked sandboxes, which run no job. For
/// accounting that counts jobs' processes (tests, the soak tool).
[[nodiscard]] std::vector<pid_t> parked_pool_pids(const std::string& records_dir);

/// Crash-safe records of live jobs' cgroups: <dir>/<name>.cgroups lists a job's cgroup
/// directories, and its owner holds an flock on it. A record whose lock can be taken belongs
/// to a dead owner and its cgroups are swept. A record names cgroups called after itself, or
/// warm-pool cgroups (a job that took a pool entry renames the entry's record after itself).
class CgroupRecords {
 public:
  /// mkdir -p `dir` with mode 0700; refuses a dir another user owns or others can write.
  [[nodiscard]] static Result<CgroupRecords> open(const std::string& dir);
  /// Writes the record atomically (temp, fsync, flock, rename without replace, fsync dir) and
  /// returns its lock. An existing record with that name is an error (EEXIST).
  [[nodiscard]] Result<RecordLock> add(const std::string& name,
                                       const std::vector<std::string>& paths);
  /// For each record whose lock can be taken: kill through the cgroups, wait empty, rmdir,
  /// delete the record. Only paths on cgroupfs whose last component is the record's name are
  /// touched. Returns how many records were swept.
  [[nodiscard]] Result<size_t> sweep();
  const std::string& dir() const { return dir_; }

 private:
  explicit CgroupRecords(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

/// Job and record names: [A-Za-z0-9_-][A-Za-z0-9._-]{0,127}; no '/', never "." or "..".
[[nodiscard]] Result<void> check_job_name(std::string_view name);

}  // namespace cordon::sandbox
