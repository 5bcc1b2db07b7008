#include "sandbox/executable.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "base/strings.hpp"
#include "sandbox/spec.hpp"
#include "sys/fs.hpp"

namespace cordon::sandbox {
namespace {

// Whether the sandbox shows `path` masked: an empty file or directory.
bool is_hidden(const std::string& path, const std::vector<std::string>& hidden) {
  return std::any_of(hidden.begin(), hidden.end(),
                     [&](const std::string& h) { return path_within(path, h); });
}

bool is_visible(const std::string& path, const std::vector<std::string>& visible,
                const std::vector<std::string>& hidden) {
  if (is_hidden(path, hidden)) {
    return false;
  }
  for (const auto& v : visible) {
    if (path_within(path, v)) {
      return true;
    }
  }
  return false;
}

// Whether the sandbox shows `path`, or a directory on the way to what it shows (`/`, or `/home`
// for a root at /home/u/src), where it shows only the names on that way.
bool on_the_way(const std::string& path, const std::vector<std::string>& visible,
                const std::vector<std::string>& hidden) {
  if (is_hidden(path, hidden)) {
    return false;
  }
  for (const auto& v : visible) {
    if (path_within(path, v) || path_within(v, path)) {
      return true;
    }
  }
  return false;
}

struct Opened {
  UniqueFd fd;
  std::string resolved;  // kernel's path of what was opened
};

Result<Opened> check_program(UniqueFd fd, const std::string& path);

// Opens `path` (absolute, outside the root) on the host for exec, one component at a time,
// following its symlinks by hand, and looks up only names the sandbox itself could: a `#!`
// line is the job's to write, and a lookup of any other name is a host effect the sandbox
// cannot have. It would trigger an automount (autofs `/net/<name>` or `/home/<name>` asks the
// host's resolver or directory for any name the job writes), wait on a hung FUSE or NFS mount
// in the spawner, or ask a FUSE server of another user. Names are looked up in a directory
// the sandbox shows whole; in one on the way to what it shows (`/`, `/home` for a root at
// /home/u/src) only the names on that way and the system trees' own symlinks (`/bin`).
// Until session 38 the spawner opened the whole path and only then checked that the sandbox
// sees it. nullopt: not visible (the host's answer for it is not passed on).
Result<std::optional<Opened>> open_visible(const std::string& path,
                                           const std::vector<std::string>& visible,
                                           const std::vector<std::string>& hidden) {
  constexpr int kMaxLinks = 40;  // the kernel's own bound (ELOOP)
  std::vector<std::string> todo = split(path.substr(1), '/');
  std::reverse(todo.begin(), todo.end());  // the next component is at the back
  CORDON_TRY(cur, sys::open_fd("/", O_PATH | O_DIRECTORY));
  std::string cur_path = "/";
  int links = 0;
  while (!todo.empty()) {
    std::string name = std::move(todo.back());
    todo.pop_back();
    if (name.empty() || name == ".") {
      continue;
    }
    if (name == "..") {
      int up = ::openat(cur.get(), "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (up < 0) {
        return sys_error("openat `{}/..`", cur_path);
      }
      cur = UniqueFd(up);
      CORDON_TRY(up_path, sys::fd_path(cur.get()));
      cur_path = std::move(up_path);
      continue;
    }
    std::string next = cur_path == "/" ? "/" + name : cur_path + "/" + name;
    std::string target;
    if (on_the_way(next, visible, hidden)) {
      int fd = ::openat(cur.get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) {
        return std::unexpected(
            Error(ErrorCode::kNotFound, ENOENT, fmt::format("`{}` does not exist", path)));
      }
      if (fd < 0) {
        return sys_error("openat `{}`", next);
      }
      UniqueFd opened(fd);
      CORDON_TRY(st, sys::fstat_fd(opened.get()));
      if (!S_ISLNK(st.st_mode)) {
        cur = std::move(opened);
        cur_path = std::move(next);
        continue;
      }
      CORDON_TRY(t, sys::read_link_at(opened.get(), ""));
      target = std::move(t);
    } else {
      // Not shown, unless it is a symlink to what is. Read as one only where the sandbox could
      // read it too: in a directory it shows whole, or a system tree's link it recreates. A
      // job's name in a directory only on the way is never looked up (a review of session 38:
      // `#!/<dir on the way>/<name>/x` still asked for <name>).
      const bool system_link = std::any_of(std::begin(kSystemDirs), std::end(kSystemDirs),
                                           [&](const char* d) { return next == d; });
      if (!system_link && !is_visible(cur_path, visible, hidden)) {
        return std::optional<Opened>();
      }
      auto t = sys::read_link_at(cur.get(), name);
      if (!t) {
        return std::optional<Opened>();
      }
      target = std::move(*t);
    }
    if (++links > kMaxLinks || target.empty()) {
      return refusal("`{}` leads through too many symbolic links", path);
    }
    std::vector<std::string> parts = split(target, '/');
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      todo.push_back(std::move(*it));
    }
    if (target[0] == '/') {
      CORDON_TRY(top, sys::open_fd("/", O_PATH | O_DIRECTORY));
      cur = std::move(top);
      cur_path.assign(1, '/');
    }
  }
  if (!is_visible(cur_path, visible, hidden)) {
    return std::optional<Opened>();
  }
  CORDON_TRY(opened, check_program(std::move(cur), path));
  return std::optional<Opened>(std::move(opened));
}

// Opens `path` for exec: beneath the root when inside it, else from the host with magic
// links refused. Checks: regular file with an execute bit.
Result<Opened> open_program(const std::string& path, const std::string& root, int root_fd) {
  Result<UniqueFd> fd = std::unexpected(Error::invalid(""));
  if (path_within(path, root)) {
    // Beneath the root, an absolute link back inside followed too (as the policy's check of
    // an allowlisted program there): nothing a link out leads to is looked at.
    fd = sys::open_within(root_fd, root, path, 0);
    if (!fd && fd.error().sys_errno() == EXDEV) {
      return refusal(
          "`{}` leads outside the working root `{}` ({}); run a program inside the root "
          "or a system one by its real path",
          path, root, fd.error().message());
    }
  } else {
    fd = sys::openat2_fd(AT_FDCWD, path, O_PATH, RESOLVE_NO_MAGICLINKS);
  }
  if (!fd) {
    if (fd.error().sys_errno() == ENOENT) {
      return std::unexpected(
          Error(ErrorCode::kNotFound, ENOENT, fmt::format("`{}` does not exist", path)));
    }
    return std::unexpected(std::move(fd.error()));
  }
  return check_program(std::move(*fd), path);
}

// Checks an opened program: a regular file with an execute bit.
Result<Opened> check_program(UniqueFd fd, const std::string& path) {
  CORDON_TRY(st, sys::fstat_fd(fd.get()));
  if (!S_ISREG(st.st_mode)) {
    return refusal("`{}` is not a regular file", path);
  }
  if ((st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) == 0) {
    return std::unexpected(
        Error(ErrorCode::kRefused, EACCES,
              fmt::format("`{}` is not executable (mode {:o})", path, st.st_mode & 07777)));
  }
  CORDON_TRY(resolved, sys::fd_path(fd.get()));
  return Opened{std::move(fd), std::move(resolved)};
}

// Reads the `#!` line; empty interpreter when the file is not a script.
Result<std::pair<std::string, std::string>> read_shebang(int path_fd, const std::string& path) {
  std::string proc = fmt::format("/proc/self/fd/{}", path_fd);
  // O_NONBLOCK: a file in the working root may hold a job's write lease (F_SETLEASE), and a
  // blocking open waits out the lease break (fs.lease-break-time, 45 s) in the spawner, whose
  // every other start waits behind it. Failure fixed (a review, session 35): a job's lease on
  // an allowlisted script in the root held every start of the daemon 45 s, again and again.
  int fd = ::open(proc.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0 && errno == EWOULDBLOCK) {
    return std::unexpected(
        Error(ErrorCode::kRefused, EWOULDBLOCK,
              fmt::format("`{}` is leased by a process that is writing it (fcntl F_SETLEASE); "
                          "run it once that process has let it go",
                          path)));
  }
  if (fd < 0) {
    return sys_error("open `{}` to read its first line", path);
  }
  UniqueFd guard(fd);
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0) {
    return sys_error("read `{}`", path);
  }
  std::string head(buf, static_cast<size_t>(n));
  if (head.size() < 2 || head[0] != '#' || head[1] != '!') {
    return std::pair<std::string, std::string>{};
  }
  size_t eol = head.find('\n');
  if (eol == std::string::npos) {
    return refusal("`{}`: the `#!` line is longer than {} bytes", path, sizeof buf);
  }
  std::string line = head.substr(2, eol - 2);
  auto trim = [](std::string s) {
    size_t b = s.find_first_not_of(" \t\r");
    size_t e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  line = trim(line);
  size_t sp = line.find_first_of(" \t");
  std::string interp = sp == std::string::npos ? line : line.substr(0, sp);
  std::string arg = sp == std::string::npos ? "" : trim(line.substr(sp));
  if (interp.empty()) {
    return refusal("`{}` has an empty `#!` line", path);
  }
  return std::pair{interp, arg};
}

}  // namespace

Result<ResolvedExecutable> resolve_executable(const std::vector<std::string>& argv,
                                              const std::string& root, int root_fd,
                                              const std::vector<std::string>& visible,
                                              uint64_t expected_dev, uint64_t expected_ino,
                                              const std::vector<std::string>& hidden) {
  if (argv.empty() || argv[0].empty() || argv[0][0] != '/') {
    return refusal("the program must be an absolute path");
  }
  std::string path = normalize_path(argv[0]);
  CORDON_TRY(prog, open_program(path, root, root_fd));
  if (expected_dev != 0 || expected_ino != 0) {
    // The caller checked this path (owner, mode, a sha256 pin); a file swapped in since is
    // refused rather than run.
    CORDON_TRY(st, sys::fstat_fd(prog.fd.get()));
    if (static_cast<uint64_t>(st.st_dev) != expected_dev ||
        static_cast<uint64_t>(st.st_ino) != expected_ino) {
      return refusal(
          "`{}` changed after it was checked (another file is at that path now); "
          "retry the start",
          path);
    }
  }
  CORDON_TRY(shebang, read_shebang(prog.fd.get(), path));

  ResolvedExecutable out;
  if (shebang.first.empty()) {
    out.argv = argv;
    if (path_within(prog.resolved, root)) {
      out.exec_path = prog.resolved;
    } else {
      out.fd = std::move(prog.fd);
      out.pinned = true;
    }
    return out;
  }

  // A script: the kernel would look the interpreter up by path and could not exec a
  // close-on-exec fd, so cordon execs the interpreter itself with the script's path.
  const std::string& interp = shebang.first;
  if (interp[0] != '/') {
    return refusal("`{}`: the `#!` interpreter `{}` is not an absolute path", path, interp);
  }
  if (!is_visible(prog.resolved, visible, hidden)) {
    return refusal(
        "the script `{}` is not visible inside the sandbox; put it under the "
        "working root or add its directory to the read-only paths (`--ro DIR`, or the policy's "
        "readOnlyPaths for a daemon)",
        path);
  }
  auto not_visible = [&] {
    return refusal(
        "`{}`: its `#!` interpreter `{}` is not visible inside the sandbox; add it to the "
        "read-only paths (`--ro PATH`, or the policy's readOnlyPaths for a daemon) or run the "
        "interpreter explicitly",
        path, interp);
  };
  const std::string interp_path = normalize_path(interp);
  // The host's answer for a path the sandbox cannot see (missing, its mode, not a file) is
  // not passed on: a job that writes the `#!` line would learn of host paths it cannot see
  // from the refusal its next caller reads (a red-team review, session 36: `#!` naming a file
  // in a root-only directory gave "is not executable (mode 600)").
  std::optional<Opened> found;
  if (path_within(interp_path, root)) {
    CORDON_TRY_CTX(in_root, open_program(interp_path, root, root_fd), "`{}`: `#!` interpreter",
                   path);
    found = std::move(in_root);
  } else {
    CORDON_TRY_CTX(outside, open_visible(interp_path, visible, hidden), "`{}`: `#!` interpreter",
                   path);
    if (!outside) {
      return not_visible();
    }
    found = std::move(outside);
  }
  Opened& ip = *found;
  if (!is_visible(ip.resolved, visible, hidden)) {
    return not_visible();
  }
  CORDON_TRY(nested, read_shebang(ip.fd.get(), interp));
  if (!nested.first.empty()) {
    return refusal("`{}`: the `#!` interpreter `{}` is itself a script; name a binary", path,
                   interp);
  }
  out.interpreter = ip.resolved;
  out.argv.push_back(interp);
  if (!shebang.second.empty()) {
    out.argv.push_back(shebang.second);
  }
  out.argv.push_back(prog.resolved);
  out.argv.insert(out.argv.end(), argv.begin() + 1, argv.end());
  if (path_within(ip.resolved, root)) {
    out.exec_path = ip.resolved;
  } else {
    out.fd = std::move(ip.fd);
    out.pinned = true;
  }
  return out;
}

}  // namespace cordon::sandbox
