#pragma once

// Seccomp: the profile (data, OCI linux.seccomp) and cordon's fixed filter (code), compiled
// to classic BPF with libseccomp in the parent. The sandbox child never links libseccomp at
// run time: it loads the exported programs with seccomp(SECCOMP_SET_MODE_FILTER), profile
// first and fixed second, after PR_SET_NO_NEW_PRIVS.
//
// Why two filters: libseccomp 2.5.4 silently drops a conditional rule when the same filter
// also has an unconditional rule for that syscall (measured for a masked ioctl and for mode
// checks on fchmodat/openat). The kernel runs every stacked filter and takes the most
// restrictive answer, so argument checks in a separate default-ALLOW filter always hold,
// whatever the profile allows. Among answers of the same kind (two ERRNOs) the filter loaded
// last wins, which is why the fixed filter goes second.

#include <linux/filter.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "sandbox/spec.hpp"

namespace cordon::sandbox {

enum class SeccompAction { kAllow, kErrno, kKillProcess, kKillThread, kTrap, kLog };
enum class SeccompOp {
  kNotEqual,
  kLessThan,
  kLessEqual,
  kEqual,
  kGreaterEqual,
  kGreaterThan,
  kMaskedEqual,  // (arg & value) == value_two, as in OCI
};

struct SeccompArg {
  unsigned index = 0;
  SeccompOp op = SeccompOp::kEqual;
  uint64_t value = 0;
  uint64_t value_two = 0;
};

struct SeccompRule {
  std::vector<std::string> names;
  SeccompAction action = SeccompAction::kAllow;
  uint32_t errno_ret = 1;  // only for kErrno; OCI's default is EPERM
  std::vector<SeccompArg> args;
};

struct SeccompProfile {
  SeccompAction default_action = SeccompAction::kErrno;
  uint32_t default_errno_ret = 1;
  std::vector<std::string> architectures;  // SCMP_ARCH_* names; only x86_64 is filtered
  std::vector<SeccompRule> syscalls;
};

struct SeccompOptions {
  // Documented opt-in for sanitizer builds (LeakSanitizer ptraces its own process): the
  // profile's ptrace and process_vm_* rules become ALLOW. The sandbox's pid and user
  // namespaces still confine whom ptrace can reach.
  bool allow_ptrace = false;
  // Opt-in (`--allow-netlink`, policy `allowNetlinkRoute`): NETLINK_ROUTE sockets, which
  // getifaddrs, `ip` and interface listings use. Off, every netlink socket is EAFNOSUPPORT:
  // what the kernel queues on one (its replies) is charged to no memory cgroup, and a
  // `--memory 32M` sandbox pinned 2.7 GB of host memory so (a review, session 29).
  bool allow_netlink_route = false;
  bool operator==(const SeccompOptions&) const = default;
  auto operator<=>(const SeccompOptions&) const = default;
};

/// The options a sandbox of `spec` compiles its filters with.
inline SeccompOptions seccomp_options(const SandboxSpec& spec) {
  return {.allow_ptrace = spec.allow_ptrace, .allow_netlink_route = spec.allow_netlink_route};
}

struct BpfProgram {
  std::vector<struct sock_filter> insns;
};

struct CompiledFilters {
  BpfProgram profile;  // from the profile; load first
  BpfProgram fixed;    // cordon's fixed argument-conditioned filter; always stacked, load second
  std::vector<std::string> warnings;  // skipped rules, unknown names, ignored architectures
  // Both programs allow every syscall a parked init makes from its park to its command's exec
  // (preload_calls), so the init may load them before its job: the command then inherits them
  // instead of loading them on its start (docs/performance.md, "Warm pool").
  bool init_may_preload = false;
};

// Errno values the fixed filter answers with.
inline constexpr uint32_t kErrnoEperm = 1;
inline constexpr uint32_t kErrnoEnosys = 38;
inline constexpr uint32_t kErrnoEafnosupport = 97;
inline constexpr uint32_t kErrnoEprotonosupport = 93;
inline constexpr uint32_t kErrnoEinval = 22;
inline constexpr uint32_t kErrnoEnoprotoopt = 92;
// Success without the call: for advice whose only effect would be on the host (the call is a
// hint, so doing nothing is a correct answer).
inline constexpr uint32_t kErrnoNone = 0;

/// Compiles the profile and the fixed filter; errors name the rule (/syscalls/N) at fault.
[[nodiscard]] Result<CompiledFilters> compile_filters(const SeccompProfile& profile,
                                                      const SeccompOptions& options);
/// The filter PID 1 of a sandbox confines itself with (anything else kills it).
[[nodiscard]] Result<BpfProgram> compile_init_filter();
/// libseccomp's PFC text of the profile filter, for tests and `cordon doctor`.
[[nodiscard]] Result<std::string> profile_pfc(const SeccompProfile& profile,
                                              const SeccompOptions& options);
/// PFC text of the fixed filter.
[[nodiscard]] Result<std::string> fixed_pfc(const SeccompOptions& options = {});
/// PFC text of the init filter.
[[nodiscard]] Result<std::string> init_pfc();

/// The syscalls the init filter allows, for docs and tests.
const std::vector<std::string>& init_allowed_syscalls();

/// Whether both programs allow (SECCOMP_RET_ALLOW, nothing else) every call a parked init
/// and its command's start make once the filters are loaded at park time, with the
/// arguments init.cpp passes. x86-64 only; false elsewhere and for anything the evaluator
/// cannot read.
[[nodiscard]] bool init_may_preload(const BpfProgram& profile, const BpfProgram& fixed);
/// The names of those calls (a test builds a profile of exactly these).
std::vector<std::string> preload_syscall_names();

}  // namespace cordon::sandbox
