#pragma once

// Identity: every sandbox runs as its own unprivileged host uid/gid from a reserved range,
// seen inside as the requested uid. The user namespace is created owned by that host uid, so
// per-user kernel limits (inotify instances, user namespaces…) are charged to it, not to root.

#include <sys/types.h>

#include <string>

#include "base/error.hpp"
#include "base/unique_fd.hpp"

namespace cordon::sandbox {

inline constexpr uid_t kHostIdBase = 0x70000000;  // 1879048192: far above subuid ranges
inline constexpr uid_t kHostIdCount = 65536;
/// Where every cordon on the host leases its host ids, whatever its state dir: the leases
/// are the host's, so two engines (or a daemon and a `cordon run`) with different state dirs
/// never hand one host uid to two sandboxes. On /run (a tmpfs on most hosts): nothing to keep
/// across a boot.
inline constexpr const char* kHostIdLeaseDir = "/run/cordon/uids";

/// Whether sandboxes may run as the host ids [base, base + count): not empty, above the host's
/// system and login ids (base >= 65536), and below (uid_t)-2, which the kernel reserves. A
/// refusal saying what to pass when they may not. The CLI's --host-ids and Engine::open both
/// check it: an embedder's count 0 divided by zero at the first start, a base of 0 ran a
/// sandbox as host uid 44, and a range past 2^32 wrapped to 3604 (a red-team review, session
/// 39).
Result<void> check_host_id_range(uint64_t base, uint64_t count);

/// A host uid (== gid) leased for one sandbox: an flock'd file in `lock_dir`, named by the id,
/// holds it for as long as this object lives (and the kernel drops the lock if cordon dies).
/// The file is removed on release, so the dir (on tmpfs) holds about as many files as there
/// are sandboxes; one left by a dead cordon is simply locked again by the next.
class HostIdLease {
 public:
  /// `lock_dir` is created (0700, its parent 0755) when missing and must belong to us and be
  /// writable by no one else: whoever could write there could hold or fake our leases.
  static Result<HostIdLease> acquire(const std::string& lock_dir = kHostIdLeaseDir,
                                     uid_t base = kHostIdBase, uid_t count = kHostIdCount);
  HostIdLease(HostIdLease&& other) noexcept = default;
  HostIdLease& operator=(HostIdLease&& other) noexcept;
  HostIdLease(const HostIdLease&) = delete;
  HostIdLease& operator=(const HostIdLease&) = delete;
  /// Releases: removes the file while still holding its lock, then unlocks.
  ~HostIdLease();
  uid_t id() const { return id_; }
  /// Removes the files of `lock_dir` no one holds (left by a cordon that died with its lease),
  /// each under its lock as a release does; returns how many. Run when an engine opens.
  [[nodiscard]] static Result<size_t> sweep(const std::string& lock_dir = kHostIdLeaseDir);

 private:
  HostIdLease(uid_t id, UniqueFd lock, std::string path)
      : id_(id), lock_(std::move(lock)), path_(std::move(path)) {}
  void release();
  uid_t id_ = 0;
  UniqueFd lock_;
  std::string path_;
};

/// Writes uid_map and gid_map of `pid` ("inside host 1"), as the privileged parent.
[[nodiscard]] Result<void> write_id_maps(pid_t pid, uid_t inside_uid, gid_t inside_gid,
                                         uid_t host_uid, gid_t host_gid);

/// Switches this thread's effective uid/gid to `id` for its life (raw syscalls: only this
/// thread's credentials change), so a user namespace cloned meanwhile is owned by that
/// unprivileged id: per-user kernel limits are charged there, not to root, and no process of
/// the caller's own euid holds capabilities over the namespace's members (an owner's
/// namespace would give every process of that euid, even one without any capability,
/// CAP_SYS_PTRACE over them: the child's memory, its descriptors, its namespace).
/// SECBIT_NO_SETUID_FIXUP keeps the effective capabilities across the switch, which
/// CLONE_INTO_CGROUP needs (write access to the common ancestor's cgroup.procs). Needs root;
/// restoring root's ids cannot fail while the saved ids are 0 (if it did: abort). Side effects
/// of the kernel's at any change of the effective ids, for whoever embeds this: the process
/// turns non-dumpable for good (`fs.suid_dumpable`, 0 on most hosts; cordon wants that) and
/// the switching thread's own PR_SET_PDEATHSIG is cleared (cordon's processes set none).
class EffectiveIdSwitch {
 public:
  [[nodiscard]] static Result<EffectiveIdSwitch> to(uid_t id);
  EffectiveIdSwitch(EffectiveIdSwitch&& o) noexcept
      : old_bits_(o.old_bits_), uid_switched_(o.uid_switched_), gid_switched_(o.gid_switched_) {
    o.old_bits_ = -1;
    o.uid_switched_ = o.gid_switched_ = false;
  }
  EffectiveIdSwitch& operator=(EffectiveIdSwitch&&) = delete;
  ~EffectiveIdSwitch();

 private:
  explicit EffectiveIdSwitch(int old_bits) : old_bits_(old_bits) {}
  int old_bits_;
  bool uid_switched_ = false;
  bool gid_switched_ = false;
};

/// A user namespace whose only mapping is disk owner → host id, for MOUNT_ATTR_IDMAP: files
/// owned by `disk_uid` appear owned by `host_uid`, and what `host_uid` creates lands on disk
/// owned by `disk_uid`. Made by root, it is owned by `host_uid` (EffectiveIdSwitch).
[[nodiscard]] Result<UniqueFd> make_idmap_userns(uid_t disk_uid, gid_t disk_gid, uid_t host_uid,
                                                 gid_t host_gid);

/// Checks the reserved range against /etc/passwd, /etc/group and /etc/sub{u,g}id; returns the
/// conflicts found ("" when clean). Used by doctor.
[[nodiscard]] std::string host_id_range_conflicts(uid_t base = kHostIdBase,
                                                  uid_t count = kHostIdCount);

}  // namespace cordon::sandbox
