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

/// The Landlock filesystem rights a sandbox handles (refused unless a rule grants them) and
/// the scopes it sets, at Landlock ABI `abi`: everything that ABI knows. Also what
/// spawn_bench's floor confines its child with.
uint64_t landlock_handled_access(int abi);
uint64_t landlock_scopes(int abi);

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
  // A parked init may load profile and fixed before its job (CompiledFilters::init_may_preload).
  bool preload = false;
};

/// A host tree a sandbox shows, as the host resolves it (no symlink on the way) and where the
/// sandbox shows it: /etc, and each of /usr, /bin, /sbin, /lib* that is a directory.
struct ShownTree {
  std::string host, sandbox;
};
/// The trees a sandbox shows, resolved now: with /etc a link into /usr (/etc -> /usr/etc), the
/// same host file shows both in the sandbox's /etc and in its /usr.
[[nodiscard]] Result<std::vector<ShownTree>> shown_trees();
/// Every path at which the sandbox shows the host file whose resolved path is `real` (none
/// when no shown tree holds it). Masks and generated files are placed at each.
[[nodiscard]] std::vector<std::string> shown_at(const std::vector<ShownTree>& shown,
                                                const std::string& real);

/// Which file a masked path named when it was looked at: a mask is a bind over that dentry,
/// and the kernel detaches it (in every namespace) once the path is renamed over or unlinked.
/// The ctime tells a new file that reused a freed inode number from the one masked.
struct MaskedId {
  uint64_t dev = 0, ino = 0;
  int64_t ctime_sec = 0, ctime_nsec = 0;
  bool operator==(const MaskedId&) const = default;
};
/// The /etc entries masked in a sandbox (relative paths: "etc/shadow"), and the identity of
/// each when it was looked at, files then dirs.
struct EtcMasks {
  std::vector<std::string> files, dirs;
  std::vector<MaskedId> ids;
};
/// The /etc paths a sandbox of `spec` masks where they exist: the known secrets, the host's
/// ssh host keys now and `spec.extra_masked_paths`, sorted. `with_key_dir` adds the host keys'
/// directory, where keys of other names may appear (what EtcWatch watches).
[[nodiscard]] Result<std::vector<std::string>> etc_secret_paths(const SandboxSpec& spec,
                                                                bool with_key_dir);
/// Which of the known secrets and `spec.extra_masked_paths` exist on the host now.
[[nodiscard]] Result<EtcMasks> etc_masks(const SandboxSpec& spec);
/// The same, against trees resolved already.
[[nodiscard]] Result<EtcMasks> etc_masks(const SandboxSpec& spec,
                                         const std::vector<ShownTree>& shown);

/// What a parked sandbox (warm pool) was built from, to prepare its job against.
struct ParkedShape {
  std::string root;  // the working root as resolved and bound
  uint64_t root_dev = 0, root_ino = 0;
  uid_t root_uid = 0;  // its owner: the idmapping was made for it
  gid_t root_gid = 0;
  EtcMasks masks;
  std::vector<std::pair<uint64_t, uint64_t>> read_only_ids;  // each --ro path as bound (dev, ino)
  std::vector<std::string> visible;                          // host paths the sandbox shows
  uint64_t landlock_handled = 0;
  // The command's filters its init loaded while parked (kPlanPreloadFilters; both empty
  // without); a job must bring the same two programs, or init refuses it.
  std::vector<struct sock_filter> preloaded_profile, preloaded_fixed;
  bool filters_preloaded() const { return !preloaded_profile.empty(); }
};

class PreparedSandbox {
 public:
  enum class Mode {
    kSpawn,  // the whole sandbox and its command
    // Warm pool: the sandbox without a job (no cwd, no executable, no stdio, a park plan);
    // its init waits for prepare_job()'s part (plan_format.hpp, ParkedJob). No tty.
    kPark,
  };
  /// Opens and checks every source, builds the child plan. `host_id` is the leased host
  /// uid/gid the command runs as; `init_path` the cordon-init binary.
  [[nodiscard]] static Result<std::unique_ptr<PreparedSandbox>> prepare(
      const SandboxSpec& spec, const SeccompPrograms& seccomp, uid_t host_id,
      const std::string& init_path, Mode mode = Mode::kSpawn);
  /// The job of a parked sandbox built from `shape`: resolves the cwd beneath the root and
  /// the executable, writes the job's plan memfd and makes the pipes, owned by `host_id` (the
  /// parked sandbox's leased uid/gid). The caller checked that `spec` has the parked
  /// sandbox's shape (shape_still_holds too).
  [[nodiscard]] static Result<std::unique_ptr<PreparedSandbox>> prepare_job(
      const SandboxSpec& spec, const SeccompPrograms& seccomp, uid_t host_id,
      const ParkedShape& shape);
  /// Whether the host still is as `shape` saw it: the working root and each --ro path resolve
  /// to what was bound (a directory replaced since must not be served by the old bind), the
  /// root has the same owner (the idmapping) and the same /etc secrets exist (the masks).
  /// `masks_unchanged`: an EtcWatch armed before the shape's masks were looked at saw nothing
  /// happen to them since, and they are not looked at again.
  [[nodiscard]] static bool shape_still_holds(const SandboxSpec& spec, const ParkedShape& shape,
                                              bool masks_unchanged = false);
  /// After prepare(kPark).
  ParkedShape parked_shape() const;
  /// After prepare_job(): the job's plan memfd and pinned executable (-1 when by path).
  int job_plan_fd() const { return plan_fd_.get(); }
  int job_exec_fd() const { return exec_fd_.get(); }

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
  Result<void> open_root(const SandboxSpec& spec);
  Result<void> resolve_cwd(const SandboxSpec& spec);
  Result<void> resolve_command(const SandboxSpec& spec, const std::vector<std::string>& visible,
                               const EtcMasks& masks);
  Result<void> prepare_plan_file(const SandboxSpec& spec, const SeccompPrograms& seccomp,
                                 const std::vector<std::string>& argv, const std::string& exec_path,
                                 uint32_t extra_flags = 0);
  // The status socketpair (when `status`) and, with `pipes` and without a tty, the pipes,
  // owned by `host_id`.
  Result<void> prepare_channels(const SandboxSpec& spec, uid_t host_id, bool status, bool pipes);
  const char* keep(std::string s);

  ChildPlan plan_;
  AppliedFeatures applied_;
  std::vector<std::string> argv_;
  std::string exec_path_;  // exec by this path inside the sandbox (empty: the pinned fd)
  // The two programs a park plan with kPlanPreloadFilters carries (empty without).
  std::vector<struct sock_filter> preloaded_profile_, preloaded_fixed_;
  std::string root_;  // resolved working root
  UniqueFd root_fd_;
  std::vector<UniqueFd> fds_;
  std::vector<std::unique_ptr<std::string>> strings_;  // stable storage for plan pointers
  std::vector<TreeMount> system_trees_, user_trees_;
  std::vector<SymlinkEntry> symlinks_;
  std::vector<GeneratedFile> generated_;
  std::vector<const char*> mask_files_, mask_dirs_, dev_nodes_, proc_ro_;
  std::vector<SysctlEntry> sysctls_;
  std::vector<SysctlEntry> net_sysctls_;
  std::vector<LandlockPathRule> landlock_rules_;
  std::vector<Rlimit> rlimits_;
  std::vector<std::string> visible_;
  std::vector<std::pair<uint64_t, uint64_t>> ro_ids_;
  EtcMasks etc_masks_;
  std::vector<int> keep_fds_;
  UniqueFd exec_fd_, init_fd_, plan_fd_;
};

}  // namespace cordon::sandbox
