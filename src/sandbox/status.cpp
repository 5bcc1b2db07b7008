#include "sandbox/status.hpp"

namespace cordon::sandbox {

const char* step_name(SetupStep step) {
  switch (step) {
    case SetupStep::kNone:
      return "none";
    case SetupStep::kWaitGo:
      return "wait for the go byte";
    case SetupStep::kCgroupNs:
      return "unshare cgroup namespace";
    case SetupStep::kMountPrivate:
      return "make mounts private";
    case SetupStep::kMountRootTmpfs:
      return "mount root tmpfs";
    case SetupStep::kMountSystem:
      return "mount system paths";
    case SetupStep::kMountEtc:
      return "mount /etc";
    case SetupStep::kMountEtcMask:
      return "mask /etc secrets";
    case SetupStep::kMountProc:
      return "mount /proc";
    case SetupStep::kMountProcReadOnly:
      return "make /proc/sys read-only";
    case SetupStep::kProcSysUser:
      return "set /proc/sys/user quotas";
    case SetupStep::kMountDev:
      return "mount /dev";
    case SetupStep::kMountDevpts:
      return "mount /dev/pts";
    case SetupStep::kMountTmp:
      return "mount /tmp";
    case SetupStep::kMountWorkRoot:
      return "mount the working root";
    case SetupStep::kMountReadOnlyPath:
      return "mount a read-only path";
    case SetupStep::kPivotRoot:
      return "pivot_root";
    case SetupStep::kLoopback:
      return "bring up loopback";
    case SetupStep::kHostname:
      return "set hostname";
    case SetupStep::kRlimits:
      return "set rlimits";
    case SetupStep::kPty:
      return "open the pty";
    case SetupStep::kCwd:
      return "enter the working directory";
    case SetupStep::kLandlock:
      return "build the Landlock ruleset";
    case SetupStep::kSecurebits:
      return "lock securebits";
    case SetupStep::kBoundingSet:
      return "empty the bounding set";
    case SetupStep::kSetgroups:
      return "setgroups";
    case SetupStep::kSetresgid:
      return "setresgid";
    case SetupStep::kSetresuid:
      return "setresuid";
    case SetupStep::kCapabilities:
      return "empty the capability sets";
    case SetupStep::kPdeathsig:
      return "set the parent-death signal";
    case SetupStep::kFds:
      return "arrange file descriptors";
    case SetupStep::kExecInit:
      return "exec the sandbox init";
    case SetupStep::kInitPlan:
      return "init: read the plan";
    case SetupStep::kInitFork:
      return "init: start the command";
    case SetupStep::kInitConfine:
      return "init: confine itself";
    case SetupStep::kCommandSetsid:
      return "command: setsid";
    case SetupStep::kCommandCtty:
      return "command: take the controlling tty";
    case SetupStep::kCommandNoNewPrivs:
      return "command: no_new_privs";
    case SetupStep::kCommandLandlock:
      return "command: Landlock";
    case SetupStep::kCommandSeccomp:
      return "command: seccomp";
    case SetupStep::kCgroupPlace:
      return "move into the job's v1 cgroups";
    case SetupStep::kCommandExec:
      return "command: exec";
    case SetupStep::kInitJob:
      return "init: receive the job";
    case SetupStep::kSession:
      return "setsid";
    case SetupStep::kNetSysctl:
      return "set /proc/sys/net of the sandbox's network namespace";
    case SetupStep::kInitWait:
      return "init: wait for the command";
    case SetupStep::kStepCount:
      break;
  }
  return "unknown step";
}

}  // namespace cordon::sandbox
