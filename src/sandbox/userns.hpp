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

/// A host uid (== gid) leased for one sandbox: an flock'd file in `lock_dir` holds it for
/// as long as this object lives (and the kernel drops the lock if cordon dies).
class HostIdLease {
 public:
  static Result<HostIdLease> acquire(const std::string& lock_dir, uid_t base = kHostIdBase,
                                     uid_t count = kHostIdCount);
  uid_t id() const { return id_; }

 private:
  HostIdLease(uid_t id, UniqueFd lock) : id_(id), lock_(std::move(lock)) {}
  uid_t id_;
  UniqueFd lock_;
};

/// Writes uid_map and gid_map of `pid` ("inside host 1"), as the privileged parent.
[[nodiscard]] Result<void> write_id_maps(pid_t pid, uid_t inside_uid, gid_t inside_gid,
                                         uid_t host_uid, gid_t host_gid);

/// A user namespace whose only mapping is disk owner → host id, for MOUNT_ATTR_IDMAP: files
/// owned by `disk_uid` appear owned by `host_uid`, and what `host_uid` creates lands on disk
/// owned by `disk_uid`.
[[nodiscard]] Result<UniqueFd> make_idmap_userns(uid_t disk_uid, gid_t disk_gid, uid_t host_uid,
                                                 gid_t host_gid);

/// Checks the reserved range against /etc/passwd, /etc/group and /etc/sub{u,g}id; returns the
/// conflicts found ("" when clean). Used by doctor.
[[nodiscard]] std::string host_id_range_conflicts(uid_t base = kHostIdBase,
                                                  uid_t count = kHostIdCount);

}  // namespace cordon::sandbox
