#pragma once

// The one channel between a sandbox and its supervisor: an AF_UNIX SOCK_SEQPACKET pair.
// Supervisor → child: the go byte. Child and init → supervisor: fixed-size records, and the
// pty master as SCM_RIGHTS. EOF alone never means success: the supervisor needs a
// kCommandExited record (or reads init's own wait status) to call a run finished.

#include <signal.h>

#include <cstdint>

namespace cordon::sandbox {

// The signals a caller can send (command_kill's list, but SIGKILL, which the engine sends to
// the cgroup): init forwards each one (a pid namespace's init silently drops a signal it has
// no handler for, so one missing here would never reach the command), and `cordon run`'s
// supervisor passes each one it receives on to init as itself.
inline constexpr int kForwardedSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

enum class RecordKind : uint32_t {
  kSetupError = 1,      // step + err: a step of the recipe failed; nothing was exec'd
  kCommandStarted = 2,  // pid (inside the sandbox's pid namespace) of the command
  kCommandExited = 3,   // wait_status: the command's raw wait status from wait4()
  kPtyMaster = 4,       // carries the pty master fd as SCM_RIGHTS
  kParked = 5,          // a parked init (warm pool) is ready for its job; read by the spawner
};

// Each step of the child recipe and of init, so a failure reads "mount /proc: EPERM".
enum class SetupStep : uint32_t {
  kNone = 0,
  kWaitGo,
  kCgroupNs,
  kMountPrivate,
  kMountRootTmpfs,
  kMountSystem,
  kMountEtc,
  kMountEtcMask,
  kMountProc,
  kMountProcReadOnly,
  kProcSysUser,
  kMountDev,
  kMountDevpts,
  kMountTmp,
  kMountWorkRoot,
  kMountReadOnlyPath,
  kPivotRoot,
  kLoopback,
  kHostname,
  kRlimits,
  kPty,
  kCwd,
  kLandlock,
  kSecurebits,
  kBoundingSet,
  kSetgroups,
  kSetresgid,
  kSetresuid,
  kCapabilities,
  kPdeathsig,
  kFds,
  kExecInit,
  // init (PID 1) steps
  kInitPlan,
  kInitFork,
  kInitConfine,
  kCommandSetsid,
  kCommandCtty,
  kCommandNoNewPrivs,
  kCommandLandlock,
  kCommandSeccomp,
  kCommandExec,
  kCgroupPlace,  // the child moving itself into its v1 job cgroups (hybrid hosts)
  kInitJob,      // a parked init receiving its job (warm pool)
  kSession,      // the child's setsid (a session apart from the caller's terminal)
  kInitWait,     // init's wait for its command failed (wait4: anything but EINTR)
  kNetSysctl,    // the sandbox's own network namespace's settings (tcp_orphan_retries)
  kStepCount,
};

/// A human name for a step ("mount /proc"), for error messages.
const char* step_name(SetupStep step);
/// Appended to a kCwd failure with EACCES: the cwd is entered as the command's user, so a
/// directory that user may not search (or one above it) cannot be the cwd.
inline constexpr const char* kCwdDeniedHint =
    " (the sandbox's user may not search it or a directory above it: give it search "
    "permission, e.g. `chmod u+x`, or choose another working directory)";

/// Why a sandbox whose init the OOM killer chose died without the command's status.
inline constexpr const char* kInitOomCause =
    "the kernel chose the sandbox's init: memory no process maps, such as socket buffers, pipes "
    "or files in /tmp, counts against the limit too";

struct StatusRecord {
  RecordKind kind;
  SetupStep step;
  int32_t err;          // errno for kSetupError
  int32_t wait_status;  // for kCommandExited
  int32_t pid;          // for kCommandStarted
  int32_t flags;        // kExitedAlone for kCommandExited
};
/// kCommandExited: when the command was reaped, init had no other child (wait4 said ECHILD).
/// Every process of the sandbox's pid namespace is init's descendant (nothing enters it by
/// setns), and orphans are reparented to init, so the namespace then held init alone; init
/// closes the channel and exits next. The engine starts the settle on this and waits for
/// init's exit only at its end, so that exit (~0.4 ms here) overlaps the settle's work.
inline constexpr int32_t kExitedAlone = 1;
static_assert(sizeof(StatusRecord) == 24);

// Fixed descriptor numbers in the sandbox between the child recipe and init's exec of the
// command; everything else is closed (close_range) before init is exec'd.
inline constexpr int kFdStatus = 3;        // the SOCK_SEQPACKET channel (CLOEXEC in the command)
inline constexpr int kFdPlan = 4;          // memfd with argv, envp and the BPF programs
inline constexpr int kFdExec = 5;          // O_PATH fd of the command's executable, or -1 slot
inline constexpr int kFdLandlockCmd = 6;   // Landlock ruleset for the command
inline constexpr int kFdLandlockInit = 7;  // empty Landlock ruleset init confines itself with
inline constexpr int kFdFirstFree = 8;

}  // namespace cordon::sandbox
