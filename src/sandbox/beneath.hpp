#pragma once

// mkdir -p and create-a-file beneath a directory fd, one component at a time through fds, for
// the sandbox's setup child (async-signal-safe: syscalls and a stack buffer, no allocation).
//
// Failure fixed (a review, session 11): the child walked the mount targets of the working root
// and the --ro paths by their path strings, before pivot_root, while it still sees the host's
// tree. A job sharing the working root could swap a component for a symlink between the
// parent's check (openat2 RESOLVE_NO_SYMLINKS) and the walk; an absolute symlink then led into
// the host's tree, and the child created directories (or empty files) there as the sandbox's
// host uid (13 runs of a swapping job put one in the host's /dev/shm). Here no component may be
// a symlink (ELOOP), nothing resolves above the start directory, and the caller mounts on the
// returned fd, not on a path.

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cordon::sandbox {

namespace beneath_detail {

inline int open_component(int dirfd, const char* name, int flags) {
  struct open_how how {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);  // RESOLVE_NO_SYMLINKS: the last too
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, name, &how, sizeof how));
}

}  // namespace beneath_detail

/// `rel` opened beneath `dirfd` with `flags` (O_CLOEXEC added), no component a symlink, the
/// last one neither: an fd, or -errno (ELOOP at a symlink, EXDEV for a way leading above).
inline int open_beneath(int dirfd, const char* rel, int flags) {
  int fd = beneath_detail::open_component(dirfd, rel, flags);
  return fd < 0 ? -errno : fd;
}

/// Makes the directories of `rel` (relative, '/'-separated) beneath `dirfd` as needed (mode
/// 0755; existing ones, also on read-only mounts, are fine) and returns an O_PATH fd of the last
/// one, or -errno (ELOOP: a component is a symlink; ENAMETOOLONG). `count` components of `rel`
/// are walked, all of them when negative (`rel` "a/b/c" with count 2 stops at "a/b").
inline int make_dirs_beneath(int dirfd, const char* rel, int count = -1) {
  char buf[4096];
  size_t len = std::strlen(rel);
  if (len >= sizeof buf) {
    return -ENAMETOOLONG;
  }
  std::memcpy(buf, rel, len + 1);
  int cur = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (cur < 0) {
    return -errno;
  }
  char* p = buf;
  for (int walked = 0; *p != '\0' && (count < 0 || walked < count);) {
    char* end = std::strchr(p, '/');
    if (end != nullptr) {
      *end = '\0';
    }
    if (*p != '\0' && std::strcmp(p, ".") != 0) {
      if (std::strcmp(p, "..") == 0) {
        ::close(cur);
        return -EXDEV;
      }
      if (::mkdirat(cur, p, 0755) != 0 && errno != EEXIST) {
        int err = errno;
        ::close(cur);
        return -err;
      }
      int next = beneath_detail::open_component(cur, p, O_PATH | O_DIRECTORY);
      int err = errno;
      ::close(cur);
      if (next < 0) {
        return -err;
      }
      cur = next;
      ++walked;
    }
    if (end == nullptr) {
      break;
    }
    p = end + 1;
  }
  return cur;
}

/// The file `rel` beneath `dirfd`, its directories made as above and the file created empty
/// (mode 0444) when missing; returns an O_PATH fd of it, or -errno. The last component may not
/// be a symlink either.
inline int make_file_beneath(int dirfd, const char* rel) {
  const char* slash = std::strrchr(rel, '/');
  int parent;
  const char* name = rel;
  if (slash == nullptr) {
    parent = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    if (parent < 0) {
      return -errno;
    }
  } else {
    int components = 0;
    for (const char* c = rel; c < slash; ++c) {
      components += *c == '/' ? 1 : 0;
    }
    parent = make_dirs_beneath(dirfd, rel, components + 1);
    if (parent < 0) {
      return parent;
    }
    name = slash + 1;
  }
  int fd = ::openat(parent, name, O_CREAT | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (fd >= 0) {
    ::close(fd);
  } else if (errno != EEXIST && errno != EROFS && errno != EACCES) {
    int err = errno;
    ::close(parent);
    return -err;
  }
  int target = beneath_detail::open_component(parent, name, O_PATH);
  int err = errno;
  ::close(parent);
  return target < 0 ? -err : target;
}

}  // namespace cordon::sandbox
