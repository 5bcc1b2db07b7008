#include "policy/host_paths.hpp"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <linux/openat2.h>
#include <span>
#include <vector>

#include "base/strings.hpp"
#include "sys/fs.hpp"

namespace cordon::policy {
namespace {

// Refused as a whole; a project directory somewhere beneath most of them is fine.
const char* const kSystemDirs[] = {
    "/",         "/etc",       "/usr",       "/proc",    "/sys",     "/dev",      "/run",
    "/var",      "/tmp",       "/var/tmp",   "/dev/shm", "/boot",    "/bin",      "/sbin",
    "/lib",      "/lib32",     "/lib64",     "/libx32",  "/home",    "/root",     "/var/lib",
    "/var/log",  "/var/cache", "/usr/local", "/usr/bin", "/usr/lib", "/usr/sbin", "/usr/share",
    "/run/user", "/mnt",       "/media",     "/srv",     "/opt",
};

// Refused beneath as well: the sandbox already sees what it needs of them read-only, with the
// secrets of /etc masked. Failure fixed (a review, session 11): `--root /etc/cron.d`,
// `/etc/systemd/system` or `/usr/local/bin` were accepted (and files the command wrote landed
// owned by root there, through the idmapped root), and `--ro /etc/security` was bound over the
// mask on /etc/security/opasswd, showing the host's file. The exceptions hold sources or
// scratch space, never what the host runs.
const char* const kSystemTrees[] = {"/etc",  "/boot", "/proc",  "/sys",   "/dev",    "/bin",
                                    "/sbin", "/lib",  "/lib32", "/lib64", "/libx32", "/usr"};
const char* const kProjectPlacesInSystemTrees[] = {"/usr/src", "/usr/local/src", "/dev/shm"};

// Refused beneath too, though the sandbox does not show them: what the host runs as root from
// files there (package maintainer scripts, unit files, cron tables, container runtimes' state).
// A list of the well-known places, not a proof: a root is the operator's choice, and any
// directory a root-run program reads is as dangerous. Found by a review (session 29):
// `--root /var/lib/dpkg/info` made dpkg's maintainer scripts writable.
const char* const kHostStateTrees[] = {
    "/var/lib/dpkg",   "/var/lib/apt",        "/var/lib/rpm",        "/var/lib/dnf",
    "/var/lib/yum",    "/var/lib/systemd",    "/var/lib/polkit-1",   "/var/lib/sudo",
    "/var/lib/docker", "/var/lib/containerd", "/var/lib/containers", "/var/lib/kubelet",
    "/var/spool/cron", "/var/spool/anacron",  "/var/spool/at",       "/run/systemd",
    "/run/docker",     "/run/docker.sock",    "/run/podman",         "/run/containerd",
    "/run/sudo",       "/run/dbus",           "/var/lib/dkms",       "/var/lib/cloud",
    "/var/lib/lxc",    "/var/lib/incus",      "/var/lib/rancher",
};

// cordon's host-wide runtime directory: the host-id leases of every cordon on the host
// (sandbox::kHostIdLeaseDir, /run/cordon/uids) and the daemon's usual socket. Always
// protected. Failure fixed (a review, session 12): `--root /run/cordon` was accepted, and its
// command removed its own lease and the other sandboxes' ones, so a later sandbox got a host
// uid a running one still had.
const char* const kCordonRuntimeDir = "/run/cordon";

}  // namespace

PathResolver::Resolved PathResolver::resolve_path(const std::string& path, int depth) {
  if (path == "/" || path.empty() || path[0] != '/') {
    return {path.empty() ? "/" : path, true};
  }
  if (auto it = memo_.find(path); it != memo_.end()) {
    return it->second;
  }
  const size_t slash = path.rfind('/');
  const std::string leaf = path.substr(slash + 1);
  const Resolved parent = resolve_path(slash == 0 ? "/" : path.substr(0, slash), depth);
  const std::string at = parent.path == "/" ? "/" + leaf : parent.path + "/" + leaf;
  Resolved out{at, false};
  if (parent.exists) {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink(at.c_str(), buf, sizeof buf - 1);
    if (n < 0) {
      out.exists = errno == EINVAL;  // there, and no symlink; ENOENT, ENOTDIR…: not there
    } else if (depth < kMaxLinks) {
      // From where the link is, or from / when its target is absolute.
      const std::string target(buf, static_cast<size_t>(n));
      out = walk({target[0] == '/' ? "/" : parent.path, true}, target, depth + 1);
    }
  }
  memo_.emplace(path, out);
  return out;
}

// One component at a time from `from` (resolved): ".." is the parent of a resolved prefix,
// as the kernel takes it.
PathResolver::Resolved PathResolver::walk(Resolved from, const std::string& rel, int depth) {
  for (const auto& c : split(rel, '/')) {
    if (c.empty() || c == ".") {
      continue;
    }
    if (c == "..") {
      const size_t up = from.path.rfind('/');
      from.path = up == 0 || up == std::string::npos ? "/" : from.path.substr(0, up);
      continue;
    }
    const std::string next = from.path == "/" ? "/" + c : from.path + "/" + c;
    from = from.exists ? resolve_path(next, depth) : Resolved{next, false};
  }
  return from;
}

std::string PathResolver::resolve(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return path;
  }
  return walk({"/", true}, path, 0).path;
}

std::string resolve_existing_part(const std::string& path) { return PathResolver().resolve(path); }

Result<BindPath> open_bind_path(const std::string& path, int flags, const std::string& what) {
  std::string abs = path;
  if (abs.empty() || abs[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) == nullptr) {
      return sys_error("getcwd (for {} `{}`)", what, path);
    }
    abs = std::string(cwd) + "/" + path;
  }
  CORDON_TRY_CTX(top, sys::open_fd("/", O_PATH | O_DIRECTORY), "{}", what);
  // A link root made, in a directory only root can write that no configuration makes a
  // working root (system and home directories and those holding them: a directory refused
  // because it holds this cordon's state dir may have been another cordon's root), outside
  // /proc (whose links name places in other mount namespaces). Not one in /tmp or another
  // user's directory: other users make links there (the review of session 40); nor one a
  // job made in a root-owned working root, which is no such directory.
  std::optional<HostPathGuard> system;
  auto host_made = [&](const std::string& dir, int dir_fd, const struct stat& link) {
    struct stat d {};
    if (link.st_uid != 0 || ::fstat(dir_fd, &d) != 0 || d.st_uid != 0 ||
        (d.st_mode & (S_IWGRP | S_IWOTH)) != 0 || path_within(dir, "/proc")) {
      return false;
    }
    if (!system) {
      system = HostPathGuard::from_system({});
    }
    return !system->check(dir, what);
  };
  auto fd = sys::open_within(top.get(), "/", abs, static_cast<uint64_t>(flags), host_made);
  if (!fd && fd.error().sys_errno() == ELOOP && fd.error().code() == ErrorCode::kRefused) {
    return refusal(
        "{} `{}` passes through a symlink where a job could have made it ({}): cordon follows "
        "none there in a path it binds into sandboxes; give the path it leads to",
        what, path, fd.error().message());
  }
  if (!fd) {
    return std::unexpected(std::move(fd.error()).wrap("{}", what));
  }
  CORDON_TRY(real, sys::fd_path(fd->get()));
  return BindPath{std::move(*fd), std::move(real)};
}

namespace {

// `p` and, when a symlink on its way leads elsewhere, where it resolves.
void add_with_resolved(std::vector<std::string>& to, const std::string& p, PathResolver& r) {
  auto add = [&](const std::string& x) {
    if (std::find(to.begin(), to.end(), x) == to.end()) {
      to.push_back(x);
    }
  };
  add(p);
  add(r.resolve(p));
}

}  // namespace

void HostPathGuard::protect(const std::string& path, PathResolver* resolver) {
  std::string n = normalize_path(path);
  if (!n.empty()) {
    PathResolver own;
    add_with_resolved(protected_paths, n, resolver != nullptr ? *resolver : own);
  }
}

HostPathGuard HostPathGuard::from_system(std::vector<std::string> protected_paths,
                                         const std::string& passwd_path) {
  HostPathGuard g;
  PathResolver resolver;  // one for all: the paths share their prefixes (/var, /var/lib, /usr)
  protected_paths.emplace_back(kCordonRuntimeDir);
  for (auto& p : protected_paths) {
    g.protect(p, &resolver);
  }
  if (auto text = read_small_file(passwd_path)) {
    for (const auto& line : split(*text, '\n')) {
      auto f = split(line, ':');
      if (f.size() >= 6) {
        std::string home = normalize_path(f[5]);
        if (!home.empty() && home != "/" && home != "/nonexistent") {
          add_with_resolved(g.home_dirs, home, resolver);
        }
      }
    }
  }
  // Failure fixed (a review, session 29): the guard compared the resolved root with these
  // names as written, so with /home a link to /data/home, `--root /data/home/alice` (or the
  // link's own path) was not a home directory's root.
  // The system trees are system dirs too: the resolver's memo answers them again with no call.
  auto resolve = [&g, &resolver](const char* dir) {
    std::string r = resolver.resolve(dir);
    if (r != dir) {
      g.system_resolved.emplace(dir, std::move(r));
    }
  };
  for (const char* dir : kSystemDirs) {
    resolve(dir);
  }
  for (const char* dir : kSystemTrees) {
    resolve(dir);
  }
  for (const char* dir : kProjectPlacesInSystemTrees) {
    resolve(dir);
  }
  for (const char* dir : kHostStateTrees) {
    resolve(dir);
  }
  return g;
}

Result<void> HostPathGuard::check(const std::string& resolved, const std::string& what) const {
  std::string p = normalize_path(resolved);
  if (p.empty()) {
    return refusal("{} `{}` must be an absolute path", what, resolved);
  }
  // A guarded directory under its own name, or where it resolves.
  auto is = [&](const char* dir) {
    auto r = system_resolved.find(dir);
    return p == dir || (r != system_resolved.end() && p == r->second);
  };
  auto within = [&](const char* dir) {
    auto r = system_resolved.find(dir);
    return path_within(p, dir) || (r != system_resolved.end() && path_within(p, r->second));
  };
  for (const char* dir : kSystemDirs) {
    if (is(dir)) {
      return refusal(
          "{} `{}` is a system directory; pass a project directory instead "
          "(a sandbox must never get all of `{}`)",
          what, p, dir);
    }
  }
  bool project_place = false;
  for (const char* place : kProjectPlacesInSystemTrees) {
    project_place = project_place || within(place);
  }
  for (const char* tree : kSystemTrees) {
    if (!project_place && within(tree)) {
      return refusal(
          "{} `{}` lies inside the host's system tree `{}`; the sandbox already sees what it "
          "needs of it read-only (the secrets of /etc masked), and a path there would become "
          "writable or uncover a masked file. Use a project directory elsewhere (/usr/src and "
          "/usr/local/src are fine)",
          what, p, tree);
    }
  }
  // A root holding one of these trees holds what is in it: `--root /var/spool` holds the cron
  // tables, and with /var/lib/docker a link to /data/docker, `--root /data` holds docker's
  // state (found by a review, session 29).
  auto contains = [&](const char* dir) {
    auto r = system_resolved.find(dir);
    return path_within(dir, p) || (r != system_resolved.end() && path_within(r->second, p));
  };
  using Trees = std::span<const char* const>;
  for (Trees trees : {Trees(kSystemTrees), Trees(kHostStateTrees)}) {
    for (const char* tree : trees) {
      if (contains(tree) && !within(tree)) {
        return refusal(
            "{} `{}` contains `{}`, which the host runs as root from; a job could change it. "
            "Use a project directory that holds none of the host's system or state trees",
            what, p, tree);
      }
    }
  }
  for (const char* tree : kHostStateTrees) {
    if (within(tree)) {
      return refusal(
          "{} `{}` lies inside `{}`, which holds what the host runs as root (package scripts, "
          "unit files, cron tables, container state); a job could change it. Use a project "
          "directory elsewhere",
          what, p, tree);
    }
  }
  // A user's runtime directory is refused whole, as a home is, and its systemd/ beneath:
  // systemd's user manager loads units from there, which would then run as that user outside
  // the sandbox (found by a review, session 29). A project below it is fine.
  if (path_within(p, "/run/user") && p != "/run/user") {
    const std::string rest = p.substr(std::strlen("/run/user/"));
    const std::string uid = rest.substr(0, rest.find('/'));
    const bool numeric = !uid.empty() && uid.find_first_not_of("0123456789") == std::string::npos;
    if (numeric && (rest == uid || path_within(rest, uid + "/systemd"))) {
      return refusal(
          "{} `{}` is a user's runtime directory or its systemd units (run by that user's "
          "service manager); pass a project directory below it instead",
          what, p);
    }
  }
  for (const auto& home : home_dirs) {
    if (p == home) {
      return refusal(
          "{} `{}` is a whole home directory (dotfiles, keys, credentials); pass "
          "the project directory inside it instead",
          what, p);
    }
  }
  for (const auto& prot : protected_paths) {
    if (path_within(prot, p)) {
      return refusal(
          "{} `{}` contains cordon's own `{}`; a job could rewrite what later "
          "jobs run under. Use a directory that does not contain it",
          what, p, prot);
    }
    if (path_within(p, prot)) {
      return refusal(
          "{} `{}` lies inside cordon's own `{}`; use a project directory "
          "elsewhere",
          what, p, prot);
    }
  }
  return {};
}

Result<void> HostPathGuard::check_writable(const std::string& resolved,
                                           const std::string& what) const {
  CORDON_CHECK(check(resolved, what));
  std::string p = normalize_path(resolved);
  for (const auto& given : job_unwritable) {
    std::string dir = normalize_path(given);
    if (path_within(dir, p) || path_within(resolve_existing_part(dir), p)) {
      return refusal(
          "{} `{}` contains the daemon's socket directory `{}`: jobs can write there, so a job "
          "could replace the socket and answer the next client in the daemon's place. Put "
          "--socket outside every directory jobs can write, e.g. /run/cordon/daemon.sock",
          what, p, dir);
    }
  }
  return {};
}

}  // namespace cordon::policy
