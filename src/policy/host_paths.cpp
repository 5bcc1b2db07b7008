#include "policy/host_paths.hpp"

#include "base/strings.hpp"

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

// cordon's host-wide runtime directory: the host-id leases of every cordon on the host
// (sandbox::kHostIdLeaseDir, /run/cordon/uids) and the daemon's usual socket. Always
// protected. Failure fixed (a review, session 12): `--root /run/cordon` was accepted, and its
// command removed its own lease and the other sandboxes' ones, so a later sandbox got a host
// uid a running one still had.
const char* const kCordonRuntimeDir = "/run/cordon";

}  // namespace

HostPathGuard HostPathGuard::from_system(std::vector<std::string> protected_paths,
                                         const std::string& passwd_path) {
  HostPathGuard g;
  protected_paths.emplace_back(kCordonRuntimeDir);
  for (auto& p : protected_paths) {
    std::string n = normalize_path(p);
    if (!n.empty()) {
      g.protected_paths.push_back(n);
    }
  }
  if (auto text = read_small_file(passwd_path)) {
    for (const auto& line : split(*text, '\n')) {
      auto f = split(line, ':');
      if (f.size() >= 6) {
        std::string home = normalize_path(f[5]);
        if (!home.empty() && home != "/" && home != "/nonexistent") {
          g.home_dirs.push_back(home);
        }
      }
    }
  }
  return g;
}

Result<void> HostPathGuard::check(const std::string& resolved, const std::string& what) const {
  std::string p = normalize_path(resolved);
  if (p.empty()) {
    return refusal("{} `{}` must be an absolute path", what, resolved);
  }
  for (const char* dir : kSystemDirs) {
    if (p == dir) {
      return refusal(
          "{} `{}` is a system directory; pass a project directory instead "
          "(a sandbox must never get all of `{}`)",
          what, p, dir);
    }
  }
  bool project_place = false;
  for (const char* place : kProjectPlacesInSystemTrees) {
    project_place = project_place || path_within(p, place);
  }
  for (const char* tree : kSystemTrees) {
    if (!project_place && path_within(p, tree)) {
      return refusal(
          "{} `{}` lies inside the host's system tree `{}`; the sandbox already sees what it "
          "needs of it read-only (the secrets of /etc masked), and a path there would become "
          "writable or uncover a masked file. Use a project directory elsewhere (/usr/src and "
          "/usr/local/src are fine)",
          what, p, tree);
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
  for (const auto& dir : job_unwritable) {
    if (path_within(normalize_path(dir), p)) {
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
