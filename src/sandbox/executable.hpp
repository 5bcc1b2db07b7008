#pragma once

#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"

namespace cordon::sandbox {

/// How the command's program is started inside the sandbox.
struct ResolvedExecutable {
  UniqueFd fd;                    // pinned O_PATH fd (execveat AT_EMPTY_PATH); invalid → by path
  std::string exec_path;          // path inside the sandbox when not pinned
  std::vector<std::string> argv;  // final argv (a `#!` interpreter is prepended)
  std::string interpreter;        // set for `#!` scripts
  bool pinned = false;
};

/// Resolves argv[0] (absolute) for a sandbox whose writable root is `root` (resolved path,
/// with `root_fd` open on it). Outside the root the file is opened once, verified and pinned.
/// Inside the root it is verified beneath the root and exec'd by path (any job can rewrite the
/// root, so pinning its content would promise nothing). `#!` scripts: cordon reads the line
/// itself and pins the interpreter; `visible` lists the host paths the sandbox can see, so an
/// interpreter or script it cannot see is refused by name instead of failing with ENOENT.
/// With expected_dev/ino (the identity a policy check saw), a different file is refused.
/// `hidden`: paths under `visible` that the sandbox shows masked (the /etc secrets), which
/// count as not visible.
[[nodiscard]] Result<ResolvedExecutable> resolve_executable(
    const std::vector<std::string>& argv, const std::string& root, int root_fd,
    const std::vector<std::string>& visible, uint64_t expected_dev = 0, uint64_t expected_ino = 0,
    const std::vector<std::string>& hidden = {});

}  // namespace cordon::sandbox
