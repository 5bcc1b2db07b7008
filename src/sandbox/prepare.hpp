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
