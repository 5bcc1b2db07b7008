#pragma once

// Which host directories may become a sandbox's working root (or a --ro path): never a
// system directory itself, never a home directory's root, never anything that contains or
// lies inside cordon's own files (its state, policy, socket, seccomp profiles, binaries) —
// a job could otherwise rewrite what the next job runs under.

#include <map>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"

namespace cordon::policy {

/// Resolves absolute paths through their symlinks as the kernel would, the longest existing
/// part (the rest appended), one readlink per component not seen before: the guard resolves
/// ~70 paths sharing their prefixes, and glibc's realpath spent ~250 readlinks on them.
class PathResolver {
 public:
  /// `path` resolved; relative paths are returned as given.
  std::string resolve(const std::string& path);

 private:
  static constexpr int kMaxLinks = 40;  // as the kernel's MAXSYMLINKS
  struct Resolved {
    std::string path;
    bool exists = false;
  };
  // `path`: absolute, without "." or ".." components.
  Resolved resolve_path(const std::string& path, int depth);
  Resolved walk(Resolved from, const std::string& rel, int depth);
  std::map<std::string, Resolved> memo_;
};

struct HostPathGuard {
  // cordon's own files and directories, each as given and as it resolves now (a symlink on the
  // way: a state dir given as a link into a project was not protected before session 29)
  std::vector<std::string> protected_paths;
  std::vector<std::string> home_dirs;  // from the passwd database, as given and resolved
  // Where each system directory the guard names resolves, when a symlink on its way leads
  // elsewhere (/home -> /data/home): a root is refused under either name. from_system fills it.
  std::map<std::string, std::string> system_resolved;
  // Must not lie in a directory jobs can write (the daemon's socket directory: a job there
  // could unlink the socket and bind its own, and the next client would talk to the job);
  // a working root inside one of them is fine.
  std::vector<std::string> job_unwritable;

  /// Reads home directories from `passwd_path` (default /etc/passwd). Every path it guards is
  /// resolved now (the longest existing part, through its symlinks): the roots it checks are.
  static HostPathGuard from_system(std::vector<std::string> protected_paths,
                                   const std::string& passwd_path = "/etc/passwd");

  /// Protects `path` (absolute) as written and as it resolves now.
  void protect(const std::string& path, PathResolver* resolver = nullptr);
  /// `what` names the option in the refusal ("--root", "--ro"). `resolved` is absolute and
  /// symlink-free (the kernel's path of an opened fd).
  [[nodiscard]] Result<void> check(const std::string& resolved, const std::string& what) const;

  /// check(), for a directory jobs can write (cwdRoot): also refuses one that contains or is
  /// a `job_unwritable` path (as given, or as it resolves).
  [[nodiscard]] Result<void> check_writable(const std::string& resolved,
                                            const std::string& what) const;
};

/// A host path opened to be bound into sandboxes, and the kernel's name for it.
struct BindPath {
  UniqueFd fd;
  std::string path;
};

/// Opens `path` (a working root, a `--ro` path, git.repoRoot; `flags` beside O_PATH), following
/// a symlink on its way only where no job can have made it: in a directory no cordon takes as
/// a working root (a system directory, a home directory, one holding either: `/lib64`,
/// `/var/run`, Fedora's `/home`). One elsewhere is refused, named with its text and never
/// followed: in a directory some earlier job could write (a working root of another run, the
/// parent of a per-run root) it would let that job choose what the next sandbox binds,
/// another user's private directory idmapped to the sandbox user (a red-team review, session
/// 40). `what` names the option.
[[nodiscard]] Result<BindPath> open_bind_path(const std::string& path, int flags,
                                              const std::string& what);

/// `path` (absolute, normalized) as it resolves now: the realpath of its longest existing
/// leading part, the rest appended. Unchanged when nothing of it resolves.
[[nodiscard]] std::string resolve_existing_part(const std::string& path);

}  // namespace cordon::policy
