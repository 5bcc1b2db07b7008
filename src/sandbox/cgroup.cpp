#include "sandbox/cgroup.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <optional>
#include <utility>

#include "base/scope_exit.hpp"
#include "base/strings.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {
namespace {

constexpr std::array<std::string_view, 3> kControllers = {"memory", "pids", "cpu"};
constexpr uint64_t kCpuPeriodUsec = 100000;
constexpr uint64_t kMinCpuQuotaUsec = 1000;  // the kernel refuses a cfs quota below 1 ms
constexpr std::string_view kParentName = "cordon";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> split_view(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) {
      return out;
    }
    start = end + 1;
  }
}

bool contains_token(std::string_view list, std::string_view token, char sep) {
  for (std::string_view t : split_view(list, sep)) {
    if (trim(t) == token) {
      return true;
    }
  }
  return false;
}

std::string join_path(std::string_view dir, std::string_view name) {
  std::string out(dir);
  if (out.empty() || out.back() != '/') {
    out += '/';
  }
  out += name;
  return out;
}

struct CgroupMount {
  std::string root;         // the mount's root inside the hierarchy (mountinfo field 4)
  std::string mount_point;  // unescaped
  std::string fstype;       // "cgroup" or "cgroup2"
  std::string super_options;
};

Result<std::vector<CgroupMount>> parse_cgroup_mounts(std::string_view mountinfo) {
  CORDON_TRY(all, sys::parse_mountinfo(mountinfo));
  std::vector<CgroupMount> mounts;
  for (sys::MountInfo& m : all) {
    if (m.fstype == "cgroup" || m.fstype == "cgroup2") {
      mounts.push_back(CgroupMount{std::move(m.root), std::move(m.mount_point), std::move(m.fstype),
                                   std::move(m.super_options)});
    }
  }
  return mounts;
}

// The directory through which `own_path` (from /proc/self/cgroup) is visible on a mount, or
// nullopt when the mount's root does not contain it (a bind mount of another subtree).
std::optional<std::string> dir_through_mount(const CgroupMount& m, std::string_view own_path) {
  std::string own = normalize_path(own_path);
  std::string root = normalize_path(m.root);
  if (own.empty() || root.empty() || !path_within(own, root)) {
    return std::nullopt;
  }
  std::string rest = root == "/" ? own : own.substr(root.size());
  if (rest.empty() || rest == "/") {
    return normalize_path(m.mount_point);
  }
  return normalize_path(m.mount_point + rest);
}

struct CgroupLine {
  std::string controllers;  // "" for the v2 line
  std::string path;
};

Result<std::vector<CgroupLine>> parse_proc_cgroup(std::string_view text) {
  std::vector<CgroupLine> lines;
  for (std::string_view line : split_view(text, '\n')) {
    if (trim(line).empty()) {
      continue;
    }
    size_t c1 = line.find(':');
    size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) {
      return invalid("malformed /proc/self/cgroup line `{}`", line);
    }
    std::string_view path = line.substr(c2 + 1);
    constexpr std::string_view kDeleted = " (deleted)";
    if (path.ends_with(kDeleted)) {
      path.remove_suffix(kDeleted.size());
    }
    lines.push_back(CgroupLine{std::string(line.substr(c1 + 1, c2 - c1 - 1)), std::string(path)});
  }
  return lines;
}

Result<std::string> v2_dir(const std::vector<CgroupLine>& lines,
                           const std::vector<CgroupMount>& mounts) {
  const CgroupLine* v2 = nullptr;
  for (const CgroupLine& l : lines) {
    if (l.controllers.empty()) {
      v2 = &l;
    }
  }
  if (v2 == nullptr) {
    return unsupported(
        "no cgroup v2 line (`0::`) in /proc/self/cgroup: cordon needs the "
        "unified hierarchy for tracking and cgroup.kill");
  }
  bool any_mount = false;
  for (const CgroupMount& m : mounts) {
    if (m.fstype != "cgroup2") {
      continue;
    }
    any_mount = true;
    if (auto dir = dir_through_mount(m, v2->path)) {
      return *dir;
    }
  }
  if (!any_mount) {
    return unsupported(
        "no cgroup2 mount in /proc/self/mountinfo: cordon needs the unified "
        "hierarchy for tracking and cgroup.kill");
  }
  return unsupported("our cgroup `{}` is not visible through any cgroup2 mount", v2->path);
}

// Our directory in the v1 hierarchy that carries `controller`; nullopt when no v1 hierarchy
// carries it; an error when one does but it is not mounted where we can see our cgroup.
Result<std::optional<std::string>> v1_dir(const std::vector<CgroupLine>& lines,
                                          const std::vector<CgroupMount>& mounts,
                                          std::string_view controller) {
  for (const CgroupLine& l : lines) {
    if (l.controllers.empty() || !contains_token(l.controllers, controller, ',')) {
      continue;
    }
    for (const CgroupMount& m : mounts) {
      if (m.fstype == "cgroup" && contains_token(m.super_options, controller, ',')) {
        if (auto dir = dir_through_mount(m, l.path)) {
          return std::optional<std::string>(*dir);
        }
      }
    }
    return unsupported(
        "controller `{}` is bound to a v1 hierarchy, but our cgroup `{}` there "
        "is not visible through any mount",
        controller, l.path);
  }
  return std::optional<std::string>();
}

bool is_missing(const Error& e) {
  return e.code() == ErrorCode::kSystem && e.sys_errno() == ENOENT;
}

Result<uint64_t> keyed_value(std::string_view text, std::string_view key, std::string_view file) {
  for (std::string_view line : split_view(text, '\n')) {
    std::string_view l = trim(line);
    size_t sp = l.find(' ');
    if (sp != std::string_view::npos && l.substr(0, sp) == key) {
      if (auto v = parse_uint(trim(l.substr(sp + 1)))) {
        return *v;
      }
      return invalid("`{}` in `{}` is not a number: `{}`", key, file, l);
    }
  }
  return invalid("no `{}` line in `{}`", key, file);
}

Result<uint64_t> read_keyed(int dirfd, const std::string& file, std::string_view key) {
  CORDON_TRY(text, sys::read_file_at(dirfd, file));
  return keyed_value(text, key, file);
}

Result<uint64_t> read_number(int dirfd, const std::string& file) {
  CORDON_TRY(text, sys::read_file_at(dirfd, file));
  if (auto v = parse_uint(trim(text))) {
    return *v;
  }
  return invalid("`{}` is not a number: `{}`", file, trim(text));
}

bool file_exists_at(int dirfd, const char* name) {
  return ::faccessat(dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

Result<UniqueFd> open_dir(const std::string& path) {
  return sys::open_fd(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
}

// mkdir + open; a dir that already exists is an error (it may hold someone else's processes).
Result<UniqueFd> make_job_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) {
    return sys_error("mkdir `{}`", path);
  }
  auto fd = open_dir(path);
  if (!fd) {
    ::rmdir(path.c_str());
    return std::unexpected(std::move(fd.error()));
  }
  return fd;
}

int64_t now_ms() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// The pids listed in a cgroup's cgroup.procs; a removed cgroup lists none.
Result<std::vector<pid_t>> list_procs(int dirfd) {
  auto text = sys::read_file_at(dirfd, "cgroup.procs");
  if (!text) {
    if (is_missing(text.error())) {
      return std::vector<pid_t>();
    }
    return std::unexpected(std::move(text.error()));
  }
  std::vector<pid_t> pids;
  for (std::string_view line : split_view(*text, '\n')) {
    if (auto v = parse_uint(trim(line))) {
      pids.push_back(static_cast<pid_t>(*v));
    }
  }
  return pids;
}

// SIGKILLs each listed process through a pidfd (a pid reused after the listing is not hit
// once the pidfd is open: pidfd_send_signal refuses a dead process) and returns the pidfds.
Result<std::vector<UniqueFd>> kill_listed(int dirfd) {
  CORDON_TRY(pids, list_procs(dirfd));
  std::vector<UniqueFd> pidfds;
  for (pid_t pid : pids) {
    int fd = sys::pidfd_open(pid, 0);
    if (fd < 0) {
      if (errno == ESRCH) {
        continue;
      }
      return sys_error("pidfd_open {}", pid);
    }
    UniqueFd pidfd(fd);
    if (sys::pidfd_send_signal(pidfd.get(), SIGKILL, nullptr, 0) != 0 && errno != ESRCH) {
      return sys_error("pidfd_send_signal {} SIGKILL", pid);
    }
    pidfds.push_back(std::move(pidfd));
  }
  return pidfds;
}

// Waits until cgroup.events says "populated 0": the kernel raises POLLPRI on every change.
Result<void> wait_v2_empty(int dirfd, const std::string& path, int64_t deadline) {
  int fd = ::openat(dirfd, "cgroup.events", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return {};  // the cgroup is gone
    }
    return sys_error("open `{}/cgroup.events`", path);
  }
  UniqueFd events(fd);
  for (;;) {
    char buf[256];
    ssize_t n = ::pread(events.get(), buf, sizeof buf - 1, 0);
    if (n < 0) {
      if (errno == ENODEV || errno == ENOENT) {
        return {};  // removed while we held it open
      }
      return sys_error("read `{}/cgroup.events`", path);
    }
    CORDON_TRY_CTX(
        populated,
        keyed_value(std::string_view(buf, static_cast<size_t>(n)), "populated", "cgroup.events"),
        "cgroup `{}`", path);
    if (populated == 0) {
      return {};
    }
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      return errno_error(ETIMEDOUT, "cgroup `{}` still populated after {} ms", path,
                         JobCgroup::kEmptyTimeout.count());
    }
    struct pollfd p {
      events.get(), POLLPRI, 0
    };
    if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) {
      return sys_error("poll `{}/cgroup.events`", path);
    }
  }
}

// v1 cgroups have no cgroup.events: kill what is listed and wait on each pidfd (a process
// leaves its cgroups in do_exit, before its pidfd becomes readable).
Result<void> wait_v1_empty(int dirfd, const std::string& path, int64_t deadline) {
  for (;;) {
    CORDON_TRY_CTX(pidfds, kill_listed(dirfd), "kill in cgroup `{}`", path);
    if (pidfds.empty()) {
      return {};
    }
    for (UniqueFd& pidfd : pidfds) {
      int64_t left = deadline - now_ms();
      if (left <= 0) {
        return errno_error(ETIMEDOUT, "cgroup `{}` still has processes after {} ms", path,
                           JobCgroup::kEmptyTimeout.count());
      }
      struct pollfd p {
        pidfd.get(), POLLIN, 0
      };
      if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) {
        return sys_error("poll pidfd");
      }
    }
  }
}

// rmdir; false when the cgroup is busy (a process arrived since it was seen empty) and the
// deadline has not passed, for the caller to kill and wait again.
Result<bool> remove_dir_unless_busy(const std::string& path, int64_t deadline) {
  if (::rmdir(path.c_str()) == 0 || errno == ENOENT) {
    return true;
  }
  if (errno == EBUSY && now_ms() < deadline) {
    return false;
  }
  return sys_error("rmdir `{}`", path);
}

// `dir` without a trailing `/cordon-self`: a cordon that moved itself into that leaf of its
// own cgroup (prepare_parents) still counts the cgroup above it as its own.
std::string without_self_leaf(std::string dir) {
  const std::string suffix = "/" + std::string(kSelfLeafName);
  if (dir.size() > suffix.size() && dir.ends_with(suffix)) {
    dir.resize(dir.size() - suffix.size());
  }
  return dir;
}

std::string comm_of(pid_t pid) {
  auto comm = read_small_file(fmt::format("/proc/{}/comm", pid));
  return comm ? std::string(trim(*comm)) : "gone";
}

// The pids in a cgroup.procs text other than this process's: 0 for one outside our pid
// namespace, which the kernel lists as 0. `self_listed`, when given, says whether ours was.
std::vector<pid_t> others_in(std::string_view procs, bool* self_listed = nullptr) {
  std::vector<pid_t> others;
  for (std::string_view line : split(procs, '\n')) {
    auto pid = parse_uint(trim(line));
    if (!pid) {
      continue;
    }
    if (static_cast<pid_t>(*pid) != ::getpid()) {
      others.push_back(static_cast<pid_t>(*pid));
    } else if (self_listed != nullptr) {
      *self_listed = true;
    }
  }
  return others;
}

// systemd marks the cgroup of a unit with Delegate=yes by the xattr `trusted.delegate` (and,
// from v251, `user.delegate`) set to "1".
Result<bool> marked_delegated(int dirfd, std::string_view dir) {
  for (const char* name : {"trusted.delegate", "user.delegate"}) {
    char value[8];
    ssize_t n = ::fgetxattr(dirfd, name, value, sizeof value);
    if (n == 1 && value[0] == '1') {
      return true;
    }
    if (n < 0 && errno != ENODATA && errno != EOPNOTSUPP && errno != ERANGE) {
      return sys_error("fgetxattr `{}` of `{}`", name, dir);
    }
  }
  return false;
}

// A systemd unit's own cgroup: systemd names it after the unit, and only services and scopes
// hold processes.
bool is_systemd_unit_cgroup(std::string_view dir) {
  std::string_view base = dir.substr(dir.rfind('/') + 1);
  return base.ends_with(".service") || base.ends_with(".scope");
}

// Moves this process (every thread: "0" in cgroup.procs is the writer) out of our own cgroup
// into its leaf `cordon-self`, then lets our own cgroup pass memory, pids and cpu on to the
// jobs' parent. Undone when it fails: cordon moved back, a leaf it made removed (a review,
// session 17: a failure left cordon in the leaf and the leaf behind).
Result<void> pass_controllers_on(const V2Delegation& d) {
  // A cordon started in the leaf stays there, and a failure leaves it there too (a review,
  // session 17: it was "moved back" into `<own>`, where it had never been).
  const bool in_leaf = d.in_leaf;
  const bool made = ::mkdir(d.leaf.c_str(), 0755) == 0;
  if (!made && errno != EEXIST) {
    return sys_error("mkdir `{}`", d.leaf);
  }
  auto remove_leaf = [&] {
    if (made) {
      (void)::rmdir(d.leaf.c_str());  // best effort: the error being reported matters more
    }
  };
  auto moved = in_leaf ? Result<void>{} : sys::write_file(join_path(d.leaf, "cgroup.procs"), "0");
  if (!moved) {
    remove_leaf();
    return std::unexpected(
        std::move(moved.error()).wrap("move cordon (pid {}) into `{}`", ::getpid(), d.leaf));
  }
  auto passed = sys::write_file(join_path(d.own, "cgroup.subtree_control"), "+memory +pids +cpu");
  if (passed) {
    return {};
  }
  const int err = passed.error().sys_errno();
  auto back = in_leaf ? Result<void>{} : sys::write_file(join_path(d.own, "cgroup.procs"), "0");
  if (back) {
    remove_leaf();
  }
  std::string undone = in_leaf ? "cordon stays in the leaf it started in, nothing is left changed"
                       : back  ? "cordon moved back, nothing is left changed"
                               : "and moving cordon back failed: " + back.error().message();
  return std::unexpected(
      Error(ErrorCode::kSystem, err,
            fmt::format(
                "enable memory, pids and cpu in `{}` (cgroup.subtree_control) once cordon "
                "was in `{}`: {}{}; {}",
                d.own, d.leaf, err != 0 ? errno_name(err) : passed.error().message(),
                err == EBUSY ? " (a process that is not cordon's joined the cgroup meanwhile)" : "",
                undone)));
}

}  // namespace

std::string_view to_string(CgroupMode mode) {
  return mode == CgroupMode::kUnified ? "unified" : "hybrid";
}

Result<void> check_job_name(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return invalid("job name must have 1 to 128 characters, got {}", name.size());
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) {
      return invalid("job name `{}` has a character outside [A-Za-z0-9._-]", name);
    }
  }
  // A leading dot would allow "." and "..", and hides temp files of the records dir.
  if (name.front() == '.') {
    return invalid("job name `{}` starts with `.`", name);
  }
  return {};
}

Result<std::string> own_v2_cgroup_dir(std::string_view proc_self_cgroup,
                                      std::string_view proc_self_mountinfo) {
  CORDON_TRY(lines, parse_proc_cgroup(proc_self_cgroup));
  CORDON_TRY(mounts, parse_cgroup_mounts(proc_self_mountinfo));
  return v2_dir(lines, mounts);
}

Result<CgroupLayout> detect_cgroup_layout(std::string_view proc_self_cgroup,
                                          std::string_view proc_self_mountinfo,
                                          std::string_view v2_own_controllers) {
  CORDON_TRY(lines, parse_proc_cgroup(proc_self_cgroup));
  CORDON_TRY(mounts, parse_cgroup_mounts(proc_self_mountinfo));
  CORDON_TRY(v2_dir_found, v2_dir(lines, mounts));
  const std::string v2_own = without_self_leaf(std::move(v2_dir_found));

  std::array<std::optional<std::string>, kControllers.size()> on_v1;
  std::array<bool, kControllers.size()> on_v2{};
  size_t v1_count = 0;
  size_t v2_count = 0;
  for (size_t i = 0; i < kControllers.size(); ++i) {
    CORDON_TRY(dir, v1_dir(lines, mounts, kControllers[i]));
    on_v1[i] = std::move(dir);
    on_v2[i] = contains_token(trim(v2_own_controllers), kControllers[i], ' ');
    v1_count += on_v1[i] ? 1 : 0;
    v2_count += on_v2[i] ? 1 : 0;
  }

  CgroupLayout layout;
  layout.v2_parent = join_path(v2_own, kParentName);
  if (v1_count == kControllers.size()) {
    layout.mode = CgroupMode::kHybrid;
    layout.v1_memory_parent = join_path(*on_v1[0], kParentName);
    layout.v1_pids_parent = join_path(*on_v1[1], kParentName);
    layout.v1_cpu_parent = join_path(*on_v1[2], kParentName);
    return layout;
  }
  if (v2_count == kControllers.size()) {
    layout.mode = CgroupMode::kUnified;
    return layout;
  }
  std::string where;
  for (size_t i = 0; i < kControllers.size(); ++i) {
    where += fmt::format("{}{}: {}", i == 0 ? "" : ", ", kControllers[i],
                         on_v1[i] ? "v1" : (on_v2[i] ? "v2" : "missing"));
  }
  return unsupported(
      "cgroup controllers memory, pids and cpu must all be available in our v2 cgroup `{}` "
      "(cgroup.controllers) or all be bound to v1 hierarchies; found {}",
      v2_own, where);
}

Result<CgroupLayout> detect_cgroup_layout() {
  auto cgroup = read_small_file("/proc/self/cgroup");
  if (!cgroup) {
    return sys_error("read `/proc/self/cgroup`");
  }
  auto mountinfo = read_small_file("/proc/self/mountinfo");
  if (!mountinfo) {
    return sys_error("read `/proc/self/mountinfo`");
  }
  CORDON_TRY(own_found, own_v2_cgroup_dir(*cgroup, *mountinfo));
  const std::string own = without_self_leaf(std::move(own_found));
  // Unreadable controllers are "none available": the decision then rests on v1 alone.
  std::string controllers = read_small_file(join_path(own, "cgroup.controllers")).value_or("");
  return detect_cgroup_layout(*cgroup, *mountinfo, controllers);
}

Result<V2Delegation> check_v2_delegation(const CgroupLayout& layout) {
  V2Delegation d;
  if (layout.mode != CgroupMode::kUnified) {
    return d;
  }
  size_t slash = layout.v2_parent.rfind('/');
  if (slash == std::string::npos || slash == 0) {
    return invalid("cgroup parent `{}` has no parent cgroup", layout.v2_parent);
  }
  d.own = layout.v2_parent.substr(0, slash);
  CORDON_TRY_CTX(fd, open_dir(d.own), "open our own cgroup");
  CORDON_TRY_CTX(passed, sys::read_file_at(fd.get(), "cgroup.subtree_control"),
                 "read cgroup.subtree_control of `{}`", d.own);
  bool all_passed = true;
  for (std::string_view c : kControllers) {
    all_passed = all_passed && contains_token(trim(passed), c, ' ');
  }
  // The hierarchy's root is the one cgroup without cgroup.type, and the one the rule exempts
  // (a cgroup namespace's root is not: it has the file, and the rule holds there).
  if (!file_exists_at(fd.get(), "cgroup.type")) {
    return d;
  }
  // Only a domain cgroup can hold memory-limited jobs below it: a threaded one (or one the
  // kernel marks invalid) is refused before anything moves.
  CORDON_TRY_CTX(type, sys::read_file_at(fd.get(), "cgroup.type"), "read cgroup.type of `{}`",
                 d.own);
  if (trim(type) != "domain") {
    return unsupported(
        "cordon's own cgroup `{}` is of type `{}` (cgroup.type), and jobs with memory limits "
        "need a `domain` cgroup above them. Start cordon in a domain cgroup of its own, "
        "delegated to it: `systemd-run --scope -p Delegate=yes --quiet -- cordon ...` "
        "(docs/security.md)",
        d.own, trim(type));
  }
  // systemd is the single writer of the cgroups it made for its units unless a unit has
  // Delegate=yes: cordon writes nothing into one without that (a review, session 17).
  // Checked even when the three are passed on already: cordon's jobs' parent would still be
  // made in it (a review, session 17). The xattr is read only for a unit's cgroup: an
  // unexpected errno elsewhere (a container's) must not refuse a cgroup that needs no mark.
  const bool unit = is_systemd_unit_cgroup(d.own);
  bool delegated = false;
  if (unit) {
    CORDON_TRY(marked, marked_delegated(fd.get(), d.own));
    delegated = marked;
  }
  if (unit && !delegated) {
    return unsupported(
        "cordon's own cgroup `{}` is a systemd unit's that is not delegated (no "
        "`trusted.delegate` or `user.delegate` xattr): systemd owns its cgroup.subtree_control, "
        "and jobs under `{}` could get no memory, pids or cpu limits. Set `Delegate=yes` in the "
        "unit (`systemd-run --scope -p Delegate=yes --quiet -- cordon ...` for one command); "
        "cordon then moves itself into `<that cgroup>/{}` and passes memory, pids and cpu on "
        "to its jobs (docs/security.md)",
        d.own, layout.v2_parent, kSelfLeafName);
  }
  if (all_passed) {
    return d;
  }
  // cordon moves only itself: a process of someone else's (the shell that started cordon, a
  // session's other programs) is not cordon's to move, and a pid read here may be reused by
  // the time of a move. One that exited by a second look does not count.
  CORDON_TRY_CTX(procs, sys::read_file_at(fd.get(), "cgroup.procs"), "read cgroup.procs of `{}`",
                 d.own);
  // Not listed in `<own>`: the layout named `<own>` for a cordon in its leaf.
  bool self_listed = false;
  std::vector<pid_t> others = others_in(procs, &self_listed);
  d.in_leaf = !self_listed;
  if (!others.empty()) {
    CORDON_TRY_CTX(again, sys::read_file_at(fd.get(), "cgroup.procs"), "read cgroup.procs of `{}`",
                   d.own);
    std::vector<pid_t> still = others_in(again);
    std::erase_if(others, [&](pid_t p) { return std::ranges::find(still, p) == still.end(); });
  }
  if (others.empty()) {
    d.leaf = join_path(d.own, kSelfLeafName);
    return d;
  }
  std::string named;
  for (size_t i = 0; i < others.size() && i < 5; ++i) {
    named +=
        fmt::format("{}{}", i == 0 ? "" : ", ",
                    others[i] == 0 ? std::string("a process outside cordon's pid namespace")
                                   : fmt::format("pid {} `{}`", others[i], comm_of(others[i])));
  }
  if (others.size() > 5) {
    named += fmt::format(" and {} more", others.size() - 5);
  }
  return unsupported(
      "cordon's own cgroup `{}` holds processes that are not cordon's ({}), and cgroup v2 passes "
      "no controller on from a cgroup that holds processes (the no-internal-process rule), so "
      "jobs under `{}` could get no memory, pids or cpu limits. Start cordon in a cgroup of its "
      "own, delegated to it: `systemd-run --scope -p Delegate=yes --quiet -- cordon ...` for one "
      "command, `Delegate=yes` in the unit of a `cordon serve` service (or from the hierarchy's "
      "root cgroup); cordon then moves itself into `<that cgroup>/{}` and passes memory, pids "
      "and cpu on to its jobs (docs/security.md)",
      d.own, named, layout.v2_parent, kSelfLeafName);
}

Result<void> prepare_parents(const CgroupLayout& layout) {
  // Before anything is made: nothing is left in a cgroup that cannot serve (a review, session
  // 12: `<own>/cordon` was made first and stayed in a cgroup cordon does not own).
  CORDON_TRY(delegation, check_v2_delegation(layout));
  if (!delegation.leaf.empty()) {
    CORDON_CHECK(pass_controllers_on(delegation));
  }
  std::vector<std::string> parents = {layout.v2_parent};
  if (layout.mode == CgroupMode::kHybrid) {
    for (const std::string* p :
         {&layout.v1_memory_parent, &layout.v1_pids_parent, &layout.v1_cpu_parent}) {
      if (std::find(parents.begin(), parents.end(), *p) == parents.end()) {
        parents.push_back(*p);
      }
    }
  }
  for (const std::string& p : parents) {
    if (p.empty() || p.front() != '/') {
      return invalid("cgroup parent `{}` is not an absolute path", p);
    }
    if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) {
      return sys_error("mkdir `{}`", p);
    }
  }
  if (layout.mode == CgroupMode::kUnified) {
    CORDON_TRY_CTX(fd, open_dir(layout.v2_parent), "prepare cgroup parent");
    CORDON_TRY_CTX(controllers, sys::read_file_at(fd.get(), "cgroup.controllers"),
                   "read controllers of `{}`", layout.v2_parent);
    std::string missing;
    for (std::string_view c : kControllers) {
      if (!contains_token(trim(controllers), c, ' ')) {
        missing += fmt::format("{}{}", missing.empty() ? "" : " ", c);
      }
    }
    if (!missing.empty()) {
      // We never enable controllers in a cgroup we did not create: delegation is the
      // host's job (systemd Delegate=yes, or the parent's cgroup.subtree_control).
      return unsupported(
          "controllers `{}` are not delegated to `{}`: enable them in the "
          "cgroup.subtree_control of its parent",
          missing, layout.v2_parent);
    }
    CORDON_CHECK_CTX(sys::write_file_at(fd.get(), "cgroup.subtree_control", "+memory +pids +cpu"),
                     "enable controllers in `{}`", layout.v2_parent);
  }
  return {};
}

// --- JobCgroup ----------------------------------------------------------------------------

Result<std::vector<std::string>> JobCgroup::paths_for(const CgroupLayout& layout,
                                                      const std::string& name) {
  CORDON_CHECK(check_job_name(name));
  std::vector<std::string> paths = {join_path(layout.v2_parent, name)};
  if (layout.mode == CgroupMode::kHybrid) {
    for (const std::string* p :
         {&layout.v1_memory_parent, &layout.v1_pids_parent, &layout.v1_cpu_parent}) {
      std::string path = join_path(*p, name);
      if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
        paths.push_back(std::move(path));
      }
    }
  }
  return paths;
}

Result<JobCgroup> JobCgroup::create(const CgroupLayout& layout, const std::string& name,
                                    const CgroupLimits& limits) {
  CORDON_CHECK(check_job_name(name));
  JobCgroup job;  // from here on its destructor removes whatever was made
  job.mode_ = layout.mode;
  std::string v2_path = join_path(layout.v2_parent, name);
  CORDON_TRY_CTX(v2_fd, make_job_dir(v2_path), "create cgroup `{}`", v2_path);
  job.v2_ = Dir{v2_path, std::move(v2_fd)};
  if (layout.mode == CgroupMode::kHybrid) {
    std::array<std::pair<const std::string*, int*>, 3> wanted = {{
        {&layout.v1_memory_parent, &job.v1_memory_},
        {&layout.v1_pids_parent, &job.v1_pids_},
        {&layout.v1_cpu_parent, &job.v1_cpu_},
    }};
    for (auto [parent, index] : wanted) {
      std::string path = join_path(*parent, name);
      auto same = std::find_if(job.v1_.begin(), job.v1_.end(),
                               [&](const Dir& d) { return d.path == path; });
      if (same != job.v1_.end()) {
        *index = static_cast<int>(same - job.v1_.begin());
        continue;
      }
      CORDON_TRY_CTX(fd, make_job_dir(path), "create cgroup `{}`", path);
      job.v1_.push_back(Dir{path, std::move(fd)});
      *index = static_cast<int>(job.v1_.size() - 1);
    }
  }
  CORDON_CHECK(job.set_limits(limits));
  return job;
}

Result<JobCgroup> JobCgroup::adopt(const std::vector<std::string>& paths) {
  JobCgroup job;
  for (const std::string& path : paths) {
    auto fd = open_dir(path);
    if (!fd) {
      if (is_missing(fd.error())) {
        continue;  // already removed
      }
      return std::unexpected(std::move(fd.error()).wrap("adopt cgroup"));
    }
    struct statfs fs {};
    if (::fstatfs(fd->get(), &fs) != 0) {
      return sys_error("fstatfs `{}`", path);
    }
    if (fs.f_type == CGROUP2_SUPER_MAGIC) {
      if (job.v2_.fd.valid()) {
        return invalid("adopt cgroups: two v2 cgroups `{}` and `{}`", job.v2_.path, path);
      }
      job.v2_ = Dir{path, std::move(*fd)};
    } else if (fs.f_type == CGROUP_SUPER_MAGIC) {
      job.mode_ = CgroupMode::kHybrid;
      job.v1_.push_back(Dir{path, std::move(*fd)});
    } else {
      // Records are trusted only this far: nothing off cgroupfs is ever killed or removed.
      return refusal("adopt cgroups: `{}` is not on a cgroup filesystem", path);
    }
  }
  return job;
}

JobCgroup::JobCgroup(JobCgroup&& other) noexcept
    : mode_(other.mode_),
      v2_(Dir{std::exchange(other.v2_.path, {}), std::move(other.v2_.fd)}),
      v1_(std::exchange(other.v1_, {})),
      v1_memory_(std::exchange(other.v1_memory_, -1)),
      v1_pids_(std::exchange(other.v1_pids_, -1)),
      v1_cpu_(std::exchange(other.v1_cpu_, -1)) {}

JobCgroup& JobCgroup::operator=(JobCgroup&& other) noexcept {
  if (this != &other) {
    (void)destroy();
    mode_ = other.mode_;
    v2_ = Dir{std::exchange(other.v2_.path, {}), std::move(other.v2_.fd)};
    v1_ = std::exchange(other.v1_, {});
    v1_memory_ = std::exchange(other.v1_memory_, -1);
    v1_pids_ = std::exchange(other.v1_pids_, -1);
    v1_cpu_ = std::exchange(other.v1_cpu_, -1);
  }
  return *this;
}

JobCgroup::~JobCgroup() { (void)destroy(); }

Result<void> JobCgroup::set_limits(const CgroupLimits& limits) {
  uint64_t quota = 0;
  if (limits.cpus != 0) {
    if (!std::isfinite(limits.cpus) || limits.cpus < 0 ||
        limits.cpus * static_cast<double>(kCpuPeriodUsec) > 1e15) {
      return invalid("cpus must be a positive number, got {}", limits.cpus);
    }
    quota = static_cast<uint64_t>(std::llround(limits.cpus * static_cast<double>(kCpuPeriodUsec)));
    if (quota < kMinCpuQuotaUsec) {
      return invalid("cpus {} is below the kernel's minimum of 0.01", limits.cpus);
    }
  }
  auto write = [](const Dir& d, const char* file, const std::string& text) -> Result<void> {
    CORDON_CHECK_CTX(sys::write_file_at(d.fd.get(), file, text), "set limit in cgroup `{}`",
                     d.path);
    return {};
  };
  if (mode_ == CgroupMode::kUnified) {
    if (limits.memory_bytes != 0) {
      CORDON_CHECK(write(v2_, "memory.max", std::to_string(limits.memory_bytes)));
      // Without swap off the limit only moves the job's memory to swap (absent: no swap).
      if (file_exists_at(v2_.fd.get(), "memory.swap.max")) {
        CORDON_CHECK(write(v2_, "memory.swap.max", "0"));
      }
    }
    if (limits.pids != 0) {
      CORDON_CHECK(write(v2_, "pids.max", std::to_string(limits.pids)));
    }
    if (quota != 0) {
      CORDON_CHECK(write(v2_, "cpu.max", fmt::format("{} {}", quota, kCpuPeriodUsec)));
    }
    return {};
  }
  if (v1_memory_ < 0 || v1_pids_ < 0 || v1_cpu_ < 0) {
    return invalid("set limits: adopted cgroups do not know their v1 controllers");
  }
  const Dir& mem = v1_[static_cast<size_t>(v1_memory_)];
  if (limits.memory_bytes != 0) {
    std::string bytes = std::to_string(limits.memory_bytes);
    bool memsw = file_exists_at(mem.fd.get(), "memory.memsw.limit_in_bytes");
    auto first = write(mem, "memory.limit_in_bytes", bytes);
    if (!first && memsw && first.error().sys_errno() == EINVAL) {
      // Raising the limit above memsw is refused: memsw must stay >= the limit, so raise it
      // first and retry.
      CORDON_CHECK(write(mem, "memory.memsw.limit_in_bytes", bytes));
      CORDON_CHECK(write(mem, "memory.limit_in_bytes", bytes));
    } else if (!first) {
      return std::unexpected(std::move(first.error()));
    }
    if (memsw) {  // memory+swap = memory: no swapping out of the limit
      CORDON_CHECK(write(mem, "memory.memsw.limit_in_bytes", bytes));
    }
    // v1 counts TCP socket buffers apart, and only once this limit is written (v2 counts
    // them in memory.max). Failure fixed (a review, session 14): without it a sandbox under
    // --memory 32M queued 1.1 GiB in loopback connections it never read.
    if (file_exists_at(mem.fd.get(), "memory.kmem.tcp.limit_in_bytes")) {
      CORDON_CHECK(write(mem, "memory.kmem.tcp.limit_in_bytes", bytes));
    }
  }
  if (limits.pids != 0) {
    CORDON_CHECK(
        write(v1_[static_cast<size_t>(v1_pids_)], "pids.max", std::to_string(limits.pids)));
  }
  if (quota != 0) {
    const Dir& cpu = v1_[static_cast<size_t>(v1_cpu_)];
    CORDON_CHECK(write(cpu, "cpu.cfs_period_us", std::to_string(kCpuPeriodUsec)));
    CORDON_CHECK(write(cpu, "cpu.cfs_quota_us", std::to_string(quota)));
  }
  return {};
}

Result<void> JobCgroup::place_v1(pid_t pid) {
  std::string text = std::to_string(pid);
  for (const Dir& d : v1_) {
    CORDON_CHECK_CTX(sys::write_file_at(d.fd.get(), "cgroup.procs", text),
                     "move pid {} into cgroup `{}`", pid, d.path);
  }
  return {};
}

Result<void> JobCgroup::kill() {
  if (v2_.fd.valid()) {
    auto killed = sys::write_file_at(v2_.fd.get(), "cgroup.kill", "1");
    if (killed) {
      // cgroup.kill reaches every member, a fork in flight included. On a hybrid host the
      // v1 job cgroups hold the very same processes (every one was born inside both sets
      // and a sandbox cannot move itself out), so listing and signalling them again would
      // only cost a read and a pidfd per member per hierarchy — most of a kill's time.
      return {};
    }
    if (!is_missing(killed.error())) {
      return std::unexpected(std::move(killed.error()).wrap("kill cgroup `{}`", v2_.path));
    }
    // No cgroup.kill (kernel < 5.14): signal each member; a member forking meanwhile is
    // caught by the wait loop in destroy(), which signals again.
    CORDON_TRY_CTX(pidfds, kill_listed(v2_.fd.get()), "kill cgroup `{}`", v2_.path);
  }
  for (const Dir& d : v1_) {
    CORDON_TRY_CTX(pidfds, kill_listed(d.fd.get()), "kill cgroup `{}`", d.path);
  }
  return {};
}

Result<bool> JobCgroup::populated() const {
  if (!v2_.fd.valid()) {
    return false;
  }
  auto text = sys::read_file_at(v2_.fd.get(), "cgroup.events");
  if (!text) {
    if (is_missing(text.error()) || text.error().sys_errno() == ENODEV) {
      return false;  // removed
    }
    return std::unexpected(std::move(text.error()).wrap("cgroup `{}`", v2_.path));
  }
  CORDON_TRY_CTX(value, keyed_value(*text, "populated", "cgroup.events"), "cgroup `{}`", v2_.path);
  return value != 0;
}

Result<CgroupUsage> JobCgroup::usage() const {
  CgroupUsage u;
  if (!v2_.fd.valid()) {
    return invalid("usage: no v2 job cgroup");
  }
  int v2 = v2_.fd.get();
  CORDON_TRY_CTX(cpu, read_keyed(v2, "cpu.stat", "usage_usec"), "usage of `{}`", v2_.path);
  u.cpu_usec = cpu;
  if (mode_ == CgroupMode::kUnified) {
    // memory.peak appeared in 5.19; older kernels report 0 rather than failing the job.
    auto peak = read_number(v2, "memory.peak");
    if (!peak && !is_missing(peak.error())) {
      return std::unexpected(std::move(peak.error()).wrap("usage of `{}`", v2_.path));
    }
    u.peak_memory_bytes = peak.value_or(0);
    CORDON_TRY_CTX(oom, read_keyed(v2, "memory.events", "oom_kill"), "usage of `{}`", v2_.path);
    CORDON_TRY_CTX(pmax, read_keyed(v2, "pids.events", "max"), "usage of `{}`", v2_.path);
    u.oom_kills = oom;
    u.pids_max_hits = pmax;
    return u;
  }
  if (v1_memory_ < 0 || v1_pids_ < 0) {
    return invalid("usage: adopted cgroups do not know their v1 controllers");
  }
  const Dir& mem = v1_[static_cast<size_t>(v1_memory_)];
  const Dir& pids = v1_[static_cast<size_t>(v1_pids_)];
  CORDON_TRY_CTX(peak, read_number(mem.fd.get(), "memory.max_usage_in_bytes"), "usage of `{}`",
                 mem.path);
  CORDON_TRY_CTX(oom, read_keyed(mem.fd.get(), "memory.oom_control", "oom_kill"), "usage of `{}`",
                 mem.path);
  CORDON_TRY_CTX(pmax, read_keyed(pids.fd.get(), "pids.events", "max"), "usage of `{}`", pids.path);
  u.peak_memory_bytes = peak;
  u.oom_kills = oom;
  u.pids_max_hits = pmax;
  return u;
}

Result<void> JobCgroup::destroy() {
  if (v2_.path.empty() && v1_.empty()) {
    return {};
  }
  int64_t deadline = now_ms() + kEmptyTimeout.count();
  // A process can still arrive after the cgroup was seen empty: the spawner of an engine that
  // was killed may be finishing a spawn into the very cgroups a new engine's sweep is
  // destroying (the sandbox is born into the v2 cgroup and moves itself into the v1 ones).
  // Its rmdir then fails with EBUSY; kill and wait again until the deadline. Failure fixed
  // (session 15): the sweep gave up, and the record stayed until the next engine's open.
  for (;;) {
    CORDON_CHECK_CTX(kill(), "destroy job cgroup");
    if (v2_.fd.valid()) {
      CORDON_CHECK_CTX(wait_v2_empty(v2_.fd.get(), v2_.path, deadline), "destroy job cgroup");
    }
    for (const Dir& d : v1_) {
      CORDON_CHECK_CTX(wait_v1_empty(d.fd.get(), d.path, deadline), "destroy job cgroup");
    }
    // v1 first: a retry after a failure then still has the v2 cgroup that tracks the job.
    bool busy = false;
    while (!v1_.empty() && !busy) {
      CORDON_TRY_CTX(removed, remove_dir_unless_busy(v1_.back().path, deadline),
                     "destroy job cgroup");
      if (removed) {
        v1_.pop_back();
      } else {
        busy = true;
      }
    }
    if (!busy && !v2_.path.empty()) {
      CORDON_TRY_CTX(removed, remove_dir_unless_busy(v2_.path, deadline), "destroy job cgroup");
      if (removed) {
        v2_ = Dir{};
      } else {
        busy = true;
      }
    }
    if (!busy) {
      break;
    }
    ::usleep(1000);  // not a spin, should the cgroup stay busy for another reason
  }
  v1_memory_ = v1_pids_ = v1_cpu_ = -1;
  return {};
}

std::vector<std::string> JobCgroup::paths() const {
  std::vector<std::string> out;
  if (!v2_.path.empty()) {
    out.push_back(v2_.path);
  }
  for (const Dir& d : v1_) {
    out.push_back(d.path);
  }
  return out;
}

// --- records ------------------------------------------------------------------------------

namespace {

constexpr std::string_view kRecordSuffix = ".cgroups";
constexpr std::string_view kTempSuffix = ".tmp";

Result<void> mkdir_p(const std::string& dir, mode_t mode) {
  std::string norm = normalize_path(dir);
  if (norm.empty()) {
    return invalid("records dir `{}` is not an absolute path", dir);
  }
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = norm.find('/', pos + 1);
    std::string prefix = norm.substr(0, pos);
    if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) {
      return sys_error("mkdir `{}`", prefix);
    }
  }
  return {};
}

Result<UniqueFd> open_records_dir(const std::string& dir) {
  CORDON_TRY(fd, open_dir(dir));
  CORDON_TRY(st, sys::fstat_fd(fd.get()));
  // Whoever can write here can make a sweep kill and remove cgroups: only we may.
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    return refusal("records dir `{}` must be owned by uid {} and not writable by others", dir,
                   ::geteuid());
  }
  return fd;
}

// Takes the lock of one record; nullopt when a live owner holds it or the name no longer
// refers to the file we opened (another sweeper removed it between open and flock).
Result<std::optional<UniqueFd>> lock_record(int dirfd, const std::string& name) {
  int raw = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (raw < 0) {
    if (errno == ENOENT) {
      return std::optional<UniqueFd>();
    }
    return sys_error("open record `{}`", name);
  }
  UniqueFd fd(raw);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return std::optional<UniqueFd>();
    }
    return sys_error("flock record `{}`", name);
  }
  CORDON_TRY(held, sys::fstat_fd(fd.get()));
  struct stat now {};
  if (::fstatat(dirfd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != held.st_ino ||
      now.st_dev != held.st_dev) {
    return std::optional<UniqueFd>();
  }
  if (!S_ISREG(held.st_mode) || held.st_uid != ::geteuid()) {
    return refusal("record `{}` is not a regular file owned by uid {}", name, ::geteuid());
  }
  return std::optional<UniqueFd>(std::move(fd));
}

}  // namespace

Result<void> RecordLock::remove() {
  if (!fd_.valid()) {
    return {};
  }
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return sys_error("unlink record `{}`", path_);
  }
  fd_.reset();
  return {};
}

Result<void> RecordLock::rename(const std::string& name) {
  CORDON_CHECK(check_job_name(name));
  if (!fd_.valid()) {
    return invalid("rename record `{}`: not held", path_);
  }
  std::string dir = path_.substr(0, path_.rfind('/'));
  std::string to = dir + "/" + name + std::string(kRecordSuffix);
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) != 0) {
    return sys_error("rename record `{}` to `{}`", path_, to);
  }
  path_ = std::move(to);
  return {};
}

bool is_pool_cgroup_name(std::string_view name) {
  if (!name.starts_with(kPoolCgroupPrefix) || name.size() != kPoolCgroupPrefix.size() + 16) {
    return false;
  }
  return std::all_of(name.begin() + kPoolCgroupPrefix.size(), name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::vector<pid_t> parked_pool_pids(const std::string& records_dir) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(records_dir, ec)) {
    std::string name = e.path().filename();
    if (!name.ends_with(".cgroups") || !is_pool_cgroup_name(name.substr(0, name.size() - 8))) {
      continue;
    }
    auto record = read_small_file(e.path());
    if (!record) {
      continue;  // taken (renamed) meanwhile
    }
    std::string first = record->substr(0, record->find('\n'));
    auto procs = read_small_file(first + "/cgroup.procs");
    if (first.empty() || !procs) {
      continue;
    }
    size_t at = 0;
    while (at < procs->size()) {
      size_t end = procs->find('\n', at);
      if (end == std::string::npos) end = procs->size();
      if (auto pid = parse_uint(procs->substr(at, end - at))) {
        out.push_back(static_cast<pid_t>(*pid));
      }
      at = end + 1;
    }
  }
  return out;
}

Result<CgroupRecords> CgroupRecords::open(const std::string& dir) {
  CORDON_CHECK(mkdir_p(dir, 0700));
  std::string norm = normalize_path(dir);
  CORDON_TRY(fd, open_records_dir(norm));
  return CgroupRecords(norm);
}

Result<RecordLock> CgroupRecords::add(const std::string& name,
                                      const std::vector<std::string>& paths) {
  CORDON_CHECK(check_job_name(name));
  std::string text;
  for (const std::string& p : paths) {
    if (normalize_path(p) != p || p.find('\n') != std::string::npos) {
      return invalid("record `{}`: `{}` is not a normalised absolute path", name, p);
    }
    text += p;
    text += '\n';
  }
  CORDON_TRY(dirfd, open_records_dir(dir_));
  std::string final_name = name + std::string(kRecordSuffix);
  std::string temp_name = fmt::format(".{}.{}{}", name, ::getpid(), kTempSuffix);
  int raw = ::openat(dirfd.get(), temp_name.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (raw < 0) {
    return sys_error("create record `{}/{}`", dir_, temp_name);
  }
  UniqueFd fd(raw);
  ScopeExit drop_temp([&] { ::unlinkat(dirfd.get(), temp_name.c_str(), 0); });
  // Locked before it is visible under its final name, so a sweep never sees it unlocked.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return sys_error("flock record `{}/{}`", dir_, temp_name);
  }
  CORDON_CHECK_CTX(sys::write_all(fd.get(), text.data(), text.size()), "write record `{}/{}`", dir_,
                   temp_name);
  // No fsync: a record describes cgroups, which live in memory and vanish with the machine,
  // so it only has to survive the death of this process — and the page cache does that.
  // (Two fsyncs cost ~8 ms per spawn on this disk.)
  if (::renameat2(dirfd.get(), temp_name.c_str(), dirfd.get(), final_name.c_str(),
                  RENAME_NOREPLACE) != 0) {
    return sys_error("rename record to `{}/{}`", dir_, final_name);
  }
  drop_temp.release();
  return RecordLock(dir_ + "/" + final_name, std::move(fd));
}

Result<size_t> CgroupRecords::sweep() {
  CORDON_TRY(dirfd, open_records_dir(dir_));
  CORDON_TRY(names, sys::dir_entries(dirfd.get(), dir_));

  size_t swept = 0;
  std::optional<Error> first_error;
  size_t failed = 0;
  auto note = [&](Error e) {
    ++failed;
    if (!first_error) {
      first_error = std::move(e);
    }
  };
  for (const std::string& entry : names) {
    // A temp record whose writer died before the rename: no cgroup was made for it yet.
    if (entry.starts_with('.') && entry.ends_with(kTempSuffix) && entry != "." && entry != "..") {
      auto lock = lock_record(dirfd.get(), entry);
      if (lock && *lock) {
        ::unlinkat(dirfd.get(), entry.c_str(), 0);
      }
      continue;
    }
    if (!entry.ends_with(kRecordSuffix)) {
      continue;
    }
    std::string job = entry.substr(0, entry.size() - kRecordSuffix.size());
    if (!check_job_name(job)) {
      continue;
    }
    auto lock = lock_record(dirfd.get(), entry);
    if (!lock) {
      note(std::move(lock.error()));
      continue;
    }
    if (!*lock) {
      continue;  // a live cordon owns it
    }
    auto text = sys::read_file_at(dirfd.get(), entry);
    if (!text) {
      note(std::move(text.error()).wrap("read record `{}/{}`", dir_, entry));
      continue;
    }
    std::vector<std::string> paths;
    std::optional<Error> bad;
    for (const std::string& p : split(*text, '\n')) {
      if (p.empty()) {
        continue;
      }
      // Only a job cgroup by the record's own name (or a warm-pool cgroup its job took),
      // never a path with `..` or a parent.
      std::string leaf = p.substr(p.rfind('/') + 1);
      if (normalize_path(p) != p || (leaf != job && !is_pool_cgroup_name(leaf))) {
        bad = Error::refused(fmt::format("record `{}/{}` names `{}`, not a cgroup of job `{}`",
                                         dir_, entry, p, job));
        break;
      }
      paths.push_back(p);
    }
    if (bad) {
      note(std::move(*bad));
      continue;
    }
    auto cg = JobCgroup::adopt(paths);
    if (!cg) {
      note(std::move(cg.error()).wrap("sweep record `{}/{}`", dir_, entry));
      continue;
    }
    if (auto d = cg->destroy(); !d) {
      note(std::move(d.error()).wrap("sweep record `{}/{}`", dir_, entry));
      continue;
    }
    if (::unlinkat(dirfd.get(), entry.c_str(), 0) != 0 && errno != ENOENT) {
      note(Error::sys(errno, fmt::format("unlink record `{}/{}`", dir_, entry)));
      continue;
    }
    ++swept;
  }
  if (first_error) {
    return std::unexpected(
        std::move(*first_error)
            .wrap("sweep `{}`: {} swept, {} failed, first failure", dir_, swept, failed));
  }
  return swept;
}

}  // namespace cordon::sandbox
