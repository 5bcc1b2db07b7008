#include "sandbox/etc_watch.hpp"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "base/strings.hpp"

namespace cordon::sandbox {
namespace {

// Everything that can change what a mask was made for: a child created, removed or renamed
// (the path now names another inode, or names one at all), written or its attributes changed
// (the ctime compared), a watched directory moved or removed. IN_IGNORED, IN_UNMOUNT and
// IN_Q_OVERFLOW come without asking; each is an event like the others.
constexpr uint32_t kEvents = IN_ATTRIB | IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM |
                             IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF;

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

// A watch on `path` (following symlinks, as the lookups of the masks do). A path that does
// not exist (ENOENT), or a directory on the way that is none (ENOTDIR), is no failure: its
// appearance is an event of the nearest existing directory, watched before.
bool EtcWatch::watch(const std::string& path, uint32_t extra) {
  if (::inotify_add_watch(fd_.get(), path.c_str(), kEvents | extra) >= 0) {
    return true;
  }
  return errno == ENOENT || errno == ENOTDIR;
}

bool EtcWatch::watch_way(const std::string& base, const std::string& path) {
  if (!path_within(path, base)) {
    return false;  // nothing outside `base` is ever asked for: refuse rather than guess
  }
  std::string way = base;
  if (!watch(way, IN_ONLYDIR)) {
    return false;
  }
  for (const auto& part : split(path.substr(base.size()), '/')) {
    if (part.empty()) {
      continue;
    }
    way += "/" + part;
    if (way == path) {
      break;
    }
    if (!watch(way, IN_ONLYDIR)) {
      return false;
    }
  }
  if (way != base && !watch(way, 0)) {
    return false;
  }
  // A symlinked secret is masked where it points (etc_masks): that file's way is watched
  // too. A dangling one may start to point somewhere at any time: never "unchanged".
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr) {
      return false;
    }
    return !path_within(real, base) || real == path || watch_way(base, real);
  }
  return true;
}

uint64_t EtcWatch::arm(const std::string& base, const std::vector<std::string>& paths) {
  if (!fd_ || broken_) {
    return 0;
  }
  drain();  // what happened before this mark belongs to the marks before it
  for (const auto& p : paths) {
    if (!watch_way(base, p)) {
      return 0;
    }
  }
  return broken_ ? 0 : changes_;
}

bool EtcWatch::unchanged_since(uint64_t mark) {
  if (mark == 0 || !fd_ || broken_) {
    return false;
  }
  drain();
  return !broken_ && mark == changes_;
}

}  // namespace cordon::sandbox
