#pragma once

#include <sys/stat.h>
#include <sys/uio.h>

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"

namespace cordon::sys {

/// open(2) with O_CLOEXEC added; the error names the path.
[[nodiscard]] Result<UniqueFd> open_fd(const std::string& path, int flags, mode_t mode = 0);
/// openat2(2) with O_CLOEXEC added and the given resolve flags; the error names the path.
[[nodiscard]] Result<UniqueFd> openat2_fd(int dirfd, const std::string& path, uint64_t flags,
                                          uint64_t resolve, mode_t mode = 0);
[[nodiscard]] Result<struct stat> fstat_fd(int fd);
/// Writes the whole buffer, retrying on EINTR and short writes.
[[nodiscard]] Result<void> write_all(int fd, const void* data, size_t size);
/// writev(2) of every piece, in order, retrying on EINTR and short writes (the pieces are
/// advanced in place). At most IOV_MAX pieces.
[[nodiscard]] Result<void> writev_all(int fd, std::span<struct iovec> pieces);
/// Writes `text` to an existing file (cgroupfs, procfs): one write(2), as those files expect.
[[nodiscard]] Result<void> write_file(const std::string& path, const std::string& text);
[[nodiscard]] Result<void> write_file_at(int dirfd, const std::string& name,
                                         const std::string& text);
/// Reads a whole (small) file relative to dirfd.
[[nodiscard]] Result<std::string> read_file_at(int dirfd, const std::string& name);
/// The names in the directory open at `dirfd` ("." and ".." included), read through a
/// descriptor of its own so `dirfd` keeps its offset; `what` names the dir in errors.
[[nodiscard]] Result<std::vector<std::string>> dir_entries(int dirfd, const std::string& what);
/// Puts /dev/null on each of fds 0, 1 and 2 that is closed (no close-on-exec: they are the
/// process's standard streams), so no descriptor opened later takes one of them: a caller's
/// `>&-` made cordon's own files its stdout (the CLI, session 35), and an embedder with fd 0-2
/// closed had the engine's lock file as fd 0 and its spawner socket as fd 1 (session 39).
/// An error when /dev/null cannot be opened.
[[nodiscard]] Result<void> fill_closed_std_fds();
/// The path the kernel records for an fd (readlink of /proc/self/fd/N).
[[nodiscard]] Result<std::string> fd_path(int fd);
/// readlinkat(2): the target of the symlink `name` in `dirfd` (`""`: the O_PATH|O_NOFOLLOW
/// descriptor's own link); EINVAL when it is no symlink.
[[nodiscard]] Result<std::string> read_link_at(int dirfd, const std::string& name);

/// Opens `path` (absolute inside `root`, or relative to it) as the host resolves it, symlinks
/// followed, an absolute one back inside `root` too, while looking at nothing outside the
/// directory `root_fd` (whose kernel path is `root`): every step is an openat2 beneath it with
/// no symlink on the way. A symlink whose target leaves `root` (absolute elsewhere, or `..`
/// above it) is EXDEV, named with its text, and where it leads is never opened: a job's link
/// to a dead FUSE or NFS mount, or to an automount point, cannot make the caller wait or
/// trigger the mount (a red-team review, session 40), nor tell the job what exists out there.
/// `flags` are added to O_PATH (O_DIRECTORY).
/// `may_follow`, when given, is asked of each symlink met, with the (symlink-free) path of the
/// directory it is in, that directory's descriptor and the link's own stat: one it refuses is
/// ELOOP (ErrorCode::kRefused), named with its text.
using MayFollow =
    std::function<bool(const std::string& link_dir, int dir_fd, const struct stat& link)>;
[[nodiscard]] Result<UniqueFd> open_within(int root_fd, const std::string& root,
                                           const std::string& path, uint64_t flags,
                                           const MayFollow& may_follow = {});

/// One line of /proc/self/mountinfo, its fields unescaped.
struct MountInfo {
  std::string id;             // the mount id (statx's STATX_MNT_ID)
  std::string dev;            // "major:minor" of the file system (not of a btrfs subvolume)
  std::string root;           // the directory of the file system this mount shows
  std::string mount_point;    // where, in our mount namespace
  std::string options;        // this mount's own: "rw,nosuid,relatime", "ro,…"
  std::string fstype;         // "ext4", "cgroup2", "nfs4", …
  std::string source;         // "/dev/vda", "server:/export", …
  std::string super_options;  // the file system's own options
};
/// Parses the text of /proc/self/mountinfo; a line it cannot read is an error.
[[nodiscard]] Result<std::vector<MountInfo>> parse_mountinfo(std::string_view text);
/// /proc/self/mountinfo, read and parsed.
[[nodiscard]] Result<std::vector<MountInfo>> read_mountinfo();

/// Where a path lies on its file system: the file system (mountinfo's device, the same for
/// every mount, subvolume and overlay layer of it) and the path from its root. Two paths
/// reached through different mounts of one file system (a bind mount of a directory
/// elsewhere) compare by these. NFS shows every mount's root as `/`: there the path is taken
/// from the mount's source (`server:/export/dir`), and the file system is the server's.
struct FsPlace {
  std::string dev;
  std::string path;
};
/// Whether the mount, or the file system under it, is read-only.
bool read_only(const MountInfo& m);
/// The place of what `m` shows at its mount point.
FsPlace mount_place(const MountInfo& m);
/// The place of `path` (absolute, no symlink in it: resolved; its last component is not
/// followed), found among `mounts` by statx's mount id.
[[nodiscard]] Result<FsPlace> fs_place(const std::string& path,
                                       const std::vector<MountInfo>& mounts);

/// The wait status of the process behind `pidfd` once its parent (not necessarily us) has
/// reaped it, from PIDFD_GET_INFO (Linux 6.15), asked every 2 ms for at most `max_wait_ms`;
/// nullopt when the kernel does not say (older kernels) or it was not reaped in time.
[[nodiscard]] std::optional<int> reaped_wait_status(int pidfd, int max_wait_ms);
/// Whether the process behind `pidfd` exits (its pidfd becomes readable) within
/// `max_wait_ms`; false also when poll fails.
[[nodiscard]] bool exits_within(int pidfd, int max_wait_ms);

}  // namespace cordon::sys
