#include "sandbox/etc_watch.hpp"

#include <linux/magic.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "base/strings.hpp"

namespace cordon::sandbox {
namespace {

// Everything that can change what a mask was made for: a child created, removed or renamed
// (the path now names another inode, or names one at all), written or its attributes changed
// (the ctime compared), a watched entry moved or removed, its link count changed (an event
// only the entry's own watch gets). IN_IGNORED, IN_UNMOUNT and IN_Q_OVERFLOW come without
// asking; each is an event like the others.
constexpr uint32_t kEvents = IN_ATTRIB | IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM |
                             IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;

// Filesystems whose every change goes through this kernel's VFS, so inotify sees it. A
// network, FUSE or host-shared filesystem (NFS, 9p, virtiofs, CIFS) can change under us
// without an event, and overlayfs when its layers are written directly: those scan.
bool local_filesystem(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) {
    return false;
  }
  switch (static_cast<unsigned long>(fs.f_type)) {
    case EXT4_SUPER_MAGIC:  // ext2, ext3 and ext4 share it
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case F2FS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case RAMFS_MAGIC:
    case SQUASHFS_MAGIC:  // read-only
    case EROFS_SUPER_MAGIC_V1:
      return true;
    default:
      return false;
  }
}

bool has_dot_part(const std::string& path) {
  for (const auto& part : split(path, '/')) {
    if (part == "." || part == "..") {
      return true;
    }
  }
  return false;
}

}  // namespace

EtcWatch::EtcWatch() : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {}

void EtcWatch::drain() {
  alignas(struct inotify_event) char buf[4096];
  bool any = false;
  for (;;) {
    ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n > 0) {
      any = true;
      continue;
    }
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && errno == EAGAIN) {
      break;
    }
    broken_ = true;  // never seen; from now on every answer is "changed"
    break;
  }
  if (any) {
    ++changes_;
  }
}

// Watches `path` (no symlink: the caller lstat'ed it after its parent was watched, so a
// symlink put there since is an event) and records the inode it resolves to.
bool EtcWatch::add(const std::string& path, bool dir, Mark& mark) {
  // The ways share their directories (/etc on every one): each is watched and recorded once.
  if (std::any_of(mark.entries.begin(), mark.entries.end(),
                  [&](const Mark::Entry& e) { return e.path == path; })) {
    return true;
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT;  // gone since: an event of its parent
  }
  if (!local_filesystem(path)) {
    return false;
  }
  uint32_t flags = kEvents | IN_DONT_FOLLOW | (dir ? IN_ONLYDIR : 0);
  if (::inotify_add_watch(fd_.get(), path.c_str(), flags) < 0) {
    return errno == ENOENT;
  }
  mark.entries.push_back({path, st.st_dev, st.st_ino});
  return true;
}

bool EtcWatch::watch_way(const std::string& base, const std::string& path, bool allow_link,
                         Mark& mark) {
  if (!path_within(path, base) || path == base || has_dot_part(path)) {
    return false;  // nothing else is ever asked for: refuse rather than guess
  }
  struct stat st {};
  if (::lstat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || !add(base, true, mark)) {
    return false;
  }
  std::string way = base;
  for (const auto& part : split(path.substr(base.size()), '/')) {
    if (part.empty()) {
      continue;
    }
    way += "/" + part;
    const bool last = way == path;
    if (::lstat(way.c_str(), &st) != 0) {
      // Nothing from here on exists: its appearance is an event of the directory before.
      return errno == ENOENT || errno == ENOTDIR;
    }
    if (S_ISLNK(st.st_mode)) {
      return last && allow_link && follow_link(base, way, mark);
    }
    if (!last && !S_ISDIR(st.st_mode)) {
      return true;  // the path cannot exist; a directory put here is an event before it
    }
    if (!add(way, !last, mark)) {
      return false;
    }
  }
  return true;
}

// A symlinked secret is masked where it points (etc_masks): the way of a target reached in
// one hop, without symlinks on it, is watched; whatever else a link does scans.
bool EtcWatch::follow_link(const std::string& base, const std::string& link, Mark& mark) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) == sizeof buf) {
    return false;
  }
  std::string target(buf, static_cast<size_t>(n));
  if (target[0] != '/') {
    target = link.substr(0, link.rfind('/') + 1) + target;
  }
  return watch_way(base, target, false, mark);
}

EtcWatch::Mark EtcWatch::arm(const std::string& base, const std::vector<std::string>& paths) {
  Mark mark;
  if (!fd_ || broken_) {
    return mark;
  }
  drain();  // what happened before this mark belongs to the marks before it
  for (const auto& p : paths) {
    if (!watch_way(base, p, true, mark)) {
      mark.entries.clear();
      return mark;
    }
  }
  mark.generation = broken_ ? 0 : changes_;
  return mark;
}

uint64_t EtcWatch::confirm(const Mark& mark) const {
  for (const auto& e : mark.entries) {
    struct stat st {};
    if (::lstat(e.path.c_str(), &st) != 0 || st.st_dev != e.dev || st.st_ino != e.ino) {
      return 0;
    }
  }
  return mark.generation;
}

bool EtcWatch::unchanged_since(uint64_t generation) {
  if (generation == 0 || !fd_ || broken_) {
    return false;
  }
  drain();
  return !broken_ && generation == changes_;
}

}  // namespace cordon::sandbox
