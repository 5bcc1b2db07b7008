#include "sys/fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <optional>

#include "base/strings.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sys {

Result<UniqueFd> open_fd(const std::string& path, int flags, mode_t mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) {
    return sys_error("open `{}`", path);
  }
  return UniqueFd(fd);
}

Result<UniqueFd> openat2_fd(int dirfd, const std::string& path, uint64_t flags, uint64_t resolve,
                            mode_t mode) {
  struct open_how how {};
  how.flags = flags | O_CLOEXEC;
  how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
  how.resolve = resolve;
  int fd;
  do {
    fd = openat2(dirfd, path.c_str(), &how);
  } while (fd < 0 && errno == EAGAIN);  // RESOLVE_BENEATH retries on a concurrent rename
  if (fd < 0) {
    return sys_error("openat2 `{}`", path);
  }
  return UniqueFd(fd);
}

Result<std::vector<std::string>> dir_entries(int dirfd, const std::string& what) {
  int own = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (own < 0) {
    return sys_error("open `{}`", what);
  }
  DIR* dir = ::fdopendir(own);
  if (dir == nullptr) {
    ::close(own);
    return sys_error("fdopendir `{}`", what);
  }
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = ::readdir(dir)) {
    names.emplace_back(e->d_name);
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) {
    return errno_error(err, "readdir `{}`", what);
  }
  return names;
}

Result<struct stat> fstat_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return sys_error("fstat");
  }
  return st;
}

Result<void> write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("write");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

Result<void> writev_all(int fd, std::span<struct iovec> pieces) {
  if (pieces.size() > IOV_MAX) {
    return invalid("writev of {} pieces, more than IOV_MAX", pieces.size());
  }
  while (!pieces.empty()) {
    ssize_t n = ::writev(fd, pieces.data(), static_cast<int>(pieces.size()));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("writev");
    }
    if (n == 0) {
      return errno_error(EIO, "writev wrote nothing of {} pieces left", pieces.size());
    }
    auto left = static_cast<size_t>(n);
    while (!pieces.empty() && left >= pieces.front().iov_len) {
      left -= pieces.front().iov_len;
      pieces = pieces.subspan(1);
    }
    if (!pieces.empty()) {
      pieces.front().iov_base = static_cast<char*>(pieces.front().iov_base) + left;
      pieces.front().iov_len -= left;
    }
  }
  return {};
}

Result<void> write_file(const std::string& path, const std::string& text) {
  return write_file_at(AT_FDCWD, path, text);
}

Result<void> write_file_at(int dirfd, const std::string& name, const std::string& text) {
  int fd = ::openat(dirfd, name.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return sys_error("open `{}`", name);
  }
  UniqueFd guard(fd);
  ssize_t n = ::write(fd, text.data(), text.size());
  if (n < 0) {
    return sys_error("write `{}`", name);
  }
  if (static_cast<size_t>(n) != text.size()) {
    return errno_error(EIO, "write `{}`: short write", name);
  }
  return {};
}

Result<std::string> read_file_at(int dirfd, const std::string& name) {
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return sys_error("open `{}`", name);
  }
  UniqueFd guard(fd);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("read `{}`", name);
    }
    if (n == 0) {
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

Result<void> fill_closed_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) {
      continue;
    }
    const int null = ::open("/dev/null", O_RDWR);
    if (null < 0) {
      return sys_error("fd {} is closed, and /dev/null could not be opened to put there: open", fd);
    }
    if (null != fd) {  // another thread took this one meanwhile: it is open now
      ::close(null);
    }
  }
  return {};
}

Result<std::string> fd_path(int fd) {
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  char buf[4096];
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
  if (n < 0) {
    return sys_error("readlink `{}`", link);
  }
  if (static_cast<size_t>(n) == sizeof buf) {
    return errno_error(ENAMETOOLONG, "readlink `{}`", link);
  }
  return std::string(buf, static_cast<size_t>(n));
}

Result<std::string> read_link_at(int dirfd, const std::string& name) {
  char buf[4096];
  ssize_t n = ::readlinkat(dirfd, name.c_str(), buf, sizeof buf);
  if (n < 0) {
    return sys_error("readlinkat `{}`", name);
  }
  if (static_cast<size_t>(n) == sizeof buf) {
    return errno_error(ENAMETOOLONG, "readlinkat `{}`", name);
  }
  return std::string(buf, static_cast<size_t>(n));
}

Result<UniqueFd> open_within(int root_fd, const std::string& root, const std::string& path,
                             uint64_t flags, const MayFollow& may_follow) {
  constexpr int kMaxLinks = 40;      // the kernel's MAXSYMLINKS
  constexpr size_t kMaxDepth = 256;  // directories held open at once while walking
  constexpr uint64_t kStep = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  // `path` (absolute) below `root`, as a relative path; nullopt when it is not inside.
  auto below_root = [&](const std::string& abs) -> std::optional<std::string> {
    if (!path_within(abs, root)) {
      return std::nullopt;
    }
    return abs.size() == root.size() ? "" : abs.substr(root == "/" ? 1 : root.size() + 1);
  };
  // A refusal with EXDEV (the kernel's word for it) and no errno name appended.
  auto leaves = [](std::string why) {
    return std::unexpected(Error(ErrorCode::kRefused, EXDEV, std::move(why)));
  };
  std::optional<std::string> start = path;
  if (!path.empty() && path[0] == '/') {
    start = below_root(path);
    if (!start) {
      return leaves(fmt::format("{:?} is outside {:?}", path, root));
    }
  }
  if (!path.empty() && (path.back() == '/' || path.ends_with("/."))) {
    flags |= O_DIRECTORY;  // as the kernel takes a trailing slash
  }
  // One step at a time, each a single name opened beneath the directory walked before (held
  // open): linear in the path, and a component a job swaps after its step changes nothing of
  // what was walked.
  std::vector<UniqueFd> dirs;      // the walk so far, each inside the one before; none: root
  std::vector<std::string> names;  // their names
  std::vector<std::string> todo;   // the components still to walk, the next one last
  auto push = [&](const std::string& rel) {
    auto parts = split(rel, '/');
    todo.insert(todo.end(), parts.rbegin(), parts.rend());
  };
  auto here = [&] {
    std::string out = root;
    for (const auto& n : names) {
      out += (out == "/" ? "" : "/") + n;
    }
    return out;
  };
  push(*start);
  int links = 0;
  std::string via;  // the last symlink followed, for a `..` that then leaves the root
  while (!todo.empty()) {
    std::string c = std::move(todo.back());
    todo.pop_back();
    if (c.empty() || c == ".") {
      continue;
    }
    if (c == "..") {
      if (dirs.empty()) {
        return leaves(via.empty()
                          ? fmt::format("{:?} leads above {:?} through `..`", path, root)
                          : fmt::format("{}, and `..` from there leads above {:?}", via, root));
      }
      dirs.pop_back();
      names.pop_back();
      continue;
    }
    const int at = dirs.empty() ? root_fd : dirs.back().get();
    // As a directory first: O_PATH of a last component triggers no automount unless it asks
    // for a directory (a path through an autofs mount not yet mounted read as missing).
    auto opened = openat2_fd(at, c, O_PATH | O_NOFOLLOW | O_DIRECTORY, kStep);
    if (!opened && opened.error().sys_errno() == ENOTDIR) {
      opened = openat2_fd(at, c, O_PATH | O_NOFOLLOW, kStep);
    }
    if (!opened) {
      return std::unexpected(std::move(opened.error()).wrap("{:?}", path));
    }
    UniqueFd fd = std::move(*opened);
    CORDON_TRY(st, fstat_fd(fd.get()));
    if (S_ISLNK(st.st_mode)) {
      CORDON_TRY(target, read_link_at(fd.get(), ""));
      if (++links > kMaxLinks || target.empty()) {
        return errno_error(ELOOP, "{:?} leads through too many symbolic links", path);
      }
      const std::string dir = here();
      names.push_back(c);
      via = fmt::format("{:?} is a symbolic link to {:?}", here(), target);
      names.pop_back();
      if (may_follow && !may_follow(dir, at, st)) {
        return std::unexpected(Error(ErrorCode::kRefused, ELOOP, via));
      }
      if (target[0] == '/') {
        auto rel = below_root(target);
        if (!rel) {
          return leaves(fmt::format("{}, outside {:?}", via, root));
        }
        dirs.clear();
        names.clear();
        push(*rel);
      } else {
        push(target);
      }
      continue;
    }
    if (dirs.size() >= kMaxDepth) {
      return errno_error(ENAMETOOLONG, "{:?} is more than {} directories deep", path, kMaxDepth);
    }
    dirs.push_back(std::move(fd));
    names.push_back(std::move(c));
  }
  // The last step's descriptor is what the path names; the root's own when it names the root.
  if (dirs.empty()) {
    return openat2_fd(root_fd, ".", O_PATH | flags, kStep);
  }
  if ((flags & O_DIRECTORY) != 0) {
    CORDON_TRY(st, fstat_fd(dirs.back().get()));
    if (!S_ISDIR(st.st_mode)) {
      return errno_error(ENOTDIR, "{:?} is not a directory", here());
    }
  }
  return std::move(dirs.back());
}

Result<std::vector<MountInfo>> parse_mountinfo(std::string_view text) {
  // "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue": id,
  // parent, device, root, mount point, options, optional fields up to " - ", then the file
  // system's type, source and options.
  std::vector<MountInfo> out;
  for (const std::string& line : split(text, '\n')) {
    if (line.empty()) {
      continue;
    }
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) {
      return invalid("mountinfo line without ` - `: `{}`", line);
    }
    std::vector<std::string> head = split(line.substr(0, dash), ' ');
    std::vector<std::string> tail = split(line.substr(dash + 3), ' ');
    if (head.size() < 6 || tail.size() < 3) {
      return invalid("short mountinfo line: `{}`", line);
    }
    out.push_back(MountInfo{head[0], head[2], unescape_mount_field(head[3]),
                            unescape_mount_field(head[4]), head[5], tail[0],
                            unescape_mount_field(tail[1]), tail[2]});
  }
  return out;
}

Result<std::vector<MountInfo>> read_mountinfo() {
  auto text = read_small_file("/proc/self/mountinfo");
  if (!text) {
    return sys_error("read /proc/self/mountinfo");
  }
  return parse_mountinfo(*text);
}

bool read_only(const MountInfo& m) {
  for (const std::string* options : {&m.options, &m.super_options}) {
    for (const std::string& option : split(*options, ',')) {
      if (option == "ro") {
        return true;
      }
    }
  }
  return false;
}

FsPlace mount_place(const MountInfo& m) {
  if (m.fstype.starts_with("nfs")) {
    const size_t colon = m.source.find(":/");
    if (colon != std::string::npos) {
      return FsPlace{m.source.substr(0, colon),
                     normalize_path(m.source.substr(colon + 1) + "/" + m.root)};
    }
  }
  return FsPlace{m.dev, normalize_path(m.root)};
}

Result<FsPlace> fs_place(const std::string& path, const std::vector<MountInfo>& mounts) {
  struct statx stx {};
  if (::statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_MNT_ID, &stx) !=
      0) {
    return sys_error("statx `{}`", path);
  }
  if ((stx.stx_mask & STATX_MNT_ID) == 0) {
    return errno_error(EOPNOTSUPP, "statx `{}`: no mount id (before Linux 5.8)", path);
  }
  const std::string id = std::to_string(stx.stx_mnt_id);
  const std::string where = normalize_path(path);
  for (const MountInfo& m : mounts) {
    if (m.id != id) {
      continue;
    }
    if (!path_within(where, m.mount_point)) {
      return invalid("`{}` is on mount {} at `{}`, which does not hold it", path, id,
                     m.mount_point);
    }
    FsPlace place = mount_place(m);
    place.path = normalize_path(place.path + "/" +
                                where.substr(m.mount_point == "/" ? 0 : m.mount_point.size()));
    return place;
  }
  return invalid("`{}`: its mount {} is not in /proc/self/mountinfo", path, id);
}

std::optional<int> reaped_wait_status(int pidfd, int max_wait_ms) {
  for (int waited = 0;; waited += 2) {
    PidfdInfo info{};
    info.mask = kPidfdInfoExit;
    if (::ioctl(pidfd, kPidfdGetInfo, &info) != 0) {
      return std::nullopt;  // before Linux 6.13 (ENOTTY, EINVAL), or reaped before 6.15 (ESRCH)
    }
    if ((info.mask & kPidfdInfoExit) != 0) {
      return info.exit_code;
    }
    if (waited >= max_wait_ms) {
      return std::nullopt;
    }
    struct timespec two_ms = {0, 2'000'000};
    ::nanosleep(&two_ms, nullptr);
  }
}

bool exits_within(int pidfd, int max_wait_ms) {
  struct pollfd p {};
  p.fd = pidfd;
  p.events = POLLIN;
  struct timespec start {};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    struct timespec now {};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t spent = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    int n = ::poll(&p, 1, static_cast<int>(spent >= max_wait_ms ? 0 : max_wait_ms - spent));
    if (n > 0) {
      return true;
    }
    if (n == 0 || errno != EINTR) {
      return false;
    }
  }
}

}  // namespace cordon::sys
