#pragma once

// Parent side of a spawn: everything the child recipe needs, opened, checked and laid out in
// memory before clone3, so the child only applies it.

#include <linux/filter.h>
#include <sys/types.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"
#include "sandbox/child.hpp"
#include "sandbox/spec.hpp"

namespace cordon::sandbox {

/// The stdout/stderr pipes start at the kernel's default (64 KiB, a 1 KiB array of slots) and
/// whoever reads them grows each to kBulkPipeBytes the first time one read drains a full
/// default pipe: a bulk writer then reaches ~2 GB/s instead of ~0.55 (DESIGN.md), while the
/// many jobs that print little never hold a 1 MiB pipe's 16 KiB slot array in the kernel.
inline constexpr size_t kDefaultPipeBytes = size_t{64} << 10;
inline constexpr int kBulkPipeBytes = 1 << 20;
/// Call after each read of `n` bytes from the output pipe `fd`; `grown` remembers it was done.
/// Failure (e.g. above /proc/sys/fs/pipe-max-size when unprivileged) is harmless: it stays.
void grow_output_pipe(int fd, size_t n, bool& grown);

/// Which guarantees were applied to a run (for --json-status and doctor); never silent.
struct AppliedFeatures {
  bool user_namespace = true;
  bool idmapped_root = false;
  std::string idmap_fallback;  // why the root is not idmapped, when it is not
  bool network_namespace = true;
  int landlock_abi = 0;
  bool landlock_scopes = false;
  bool seccomp_profile = true;
  bool seccomp_fixed = true;
  bool pinned_executable = false;
  std::string interpreter;
  std::vector<std::string> warnings;
};

struct SeccompPrograms {
  std::span<const struct sock_filter> profile;
  std::span<const struct sock_filter> fixed;
  std::span<const struct sock_filter> init;
};

class PreparedSandbox {
 public:
  /// Opens and checks every source, builds the child plan. `host_id` is the leased host
  /// uid/gid the command runs as; `init_path` the cordon-init binary.
  [[nodiscard]] static Result<std::unique_ptr<PreparedSandbox>> prepare(
      const SandboxSpec& spec, const SeccompPrograms& seccomp, uid_t host_id,
      const std::string& init_path);

  ChildPlan& plan() { return plan_; }
  const AppliedFeatures& applied() const { return applied_; }
  const std::vector<std::string>& final_argv() const { return argv_; }

  // The supervisor's ends, taken once by spawn().
  UniqueFd status_parent, stdout_read, stderr_read, stdin_write;
  // The child's ends: closed in the parent right after clone3.
  UniqueFd status_child, stdout_write, stderr_write, stdin_read;

  void close_child_ends();
  /// Computes the child's keep list from the plan; call after the plan is complete.
  void finalize_keep_fds();

 private:
  PreparedSandbox() = default;
  Result<void> prepare_mounts(const SandboxSpec& spec, uid_t host_id);
  Result<void> prepare_landlock(const SandboxSpec& spec);
  Result<void> prepare_plan_file(const SandboxSpec& spec, const SeccompPrograms& seccomp,
                                 const std::vector<std::string>& argv,
                                 const std::string& exec_path);
  Result<void> prepare_channels(const SandboxSpec& spec);
  const char* keep(std::string s);

  ChildPlan plan_;
  AppliedFeatures applied_;
  std::vector<std::string> argv_;
  std::string root_;  // resolved working root
  UniqueFd root_fd_;
  std::vector<UniqueFd> fds_;
  std::vector<std::unique_ptr<std::string>> strings_;  // stable storage for plan pointers
  std::vector<TreeMount> system_trees_, user_trees_;
  std::vector<SymlinkEntry> symlinks_;
  std::vector<GeneratedFile> generated_;
  std::vector<const char*> mask_files_, mask_dirs_, dev_nodes_, proc_ro_;
  std::vector<SysctlEntry> sysctls_;
  std::vector<LandlockPathRule> landlock_rules_;
  std::vector<Rlimit> rlimits_;
  std::vector<std::string> visible_;
  std::vector<int> keep_fds_;
  UniqueFd exec_fd_, init_fd_, plan_fd_;
};

}  // namespace cordon::sandbox
