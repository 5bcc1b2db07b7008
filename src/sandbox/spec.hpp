#pragma once

// What a caller asks the sandbox for, after validation (argv, root, cwd and paths are
// absolute and checked by the policy layer or the CLI). The sandbox layer turns a SandboxSpec
// into a prepared plan (parent side, may allocate) and a spawned child.

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cordon::sandbox {

/// The system's program trees: each bound read-only where the host has a directory, recreated
/// as the host's symlink where it has one (merged /usr: /bin -> usr/bin).
inline constexpr const char* kSystemDirs[] = {"/usr",   "/bin",   "/sbin",  "/lib",
                                              "/lib32", "/lib64", "/libx32"};

enum class NetworkMode { kNone, kHost };

/// The walls a test-only build may remove one at a time, for security-probe controls.
enum class Wall : uint32_t {
  kNone = 0,
  kSeccompProfile = 1 << 0,
  kSeccompFixed = 1 << 1,
  kLandlock = 1 << 2,
  kPidNamespace = 1 << 3,
  kNetNamespace = 1 << 4,
  kCapDrop = 1 << 5,
  kEtcMask = 1 << 6,
  kProcReadOnly = 1 << 7,
  kUserQuotas = 1 << 8,
  kNoNewPrivs = 1 << 9,
  kDumpable = 1 << 10,
  kCloseFds = 1 << 11,
  kReadOnlyPaths = 1 << 12,  // --ro trees (and a read-only root) bound read-write (Landlock stays)
  kIpcNamespace = 1 << 13,   // the host's SysV IPC and POSIX message queue namespace
  kUtsNamespace = 1 << 14,   // the host's hostname (the child then sets none)
  kCgroupPlacement = 1 << 15,  // the sandbox stays in cordon's own cgroups (no job placement)
  kTcpOrphans = 1 << 16,       // the network namespace keeps the kernel's tcp_orphan_retries
};

struct Rlimit {
  int resource;
  rlim_t soft;
  rlim_t hard;
};

struct SandboxSpec {
  std::vector<std::string> argv;  // argv[0]: absolute path of the executable
  std::vector<std::string> env;   // final NAME=VALUE list
  // Paths are absolute and already resolved (no symlinks; the caller checked them with
  // policy::HostPathGuard): prepare() refuses a symlink appearing in them since.
  std::string root;  // working root, bound read-write at its own path
  // The working root bound read-only instead (mount flag and Landlock): the git tools' jobs,
  // whose repository a hostile config must not be able to change.
  bool root_read_only = false;
  // Reads (Landlock) only beneath the system's program trees (kSystemDirs), the working root and
  // the device nodes: nothing of /etc, /proc or a --ro path. The git tools' jobs: a symlink in
  // a hostile repository's git directory (info/grafts -> /etc/…) cannot make git read, and quote
  // in an error, a file outside the repository.
  bool reads_root_and_system_only = false;
  std::string cwd;                           // inside root
  std::vector<std::string> read_only_paths;  // host paths bound read-only at their own path
  // For each read_only_paths entry, the (device, inode) it must be when bound, or {0, 0}: a
  // policy's entry inside the working root, which a job can move (policy.hpp).
  std::vector<std::pair<uint64_t, uint64_t>> read_only_ids;
  std::vector<std::string> extra_masked_paths;  // under /etc, hidden in addition to the defaults
  NetworkMode network = NetworkMode::kNone;
  uid_t inside_uid = 1000;
  gid_t inside_gid = 1000;
  bool tty = false;
  // The pty's size from its birth: set on the master before the command can exist, so a
  // program that asks at once (stty size, curses) never sees 0x0.
  uint16_t tty_cols = 120, tty_rows = 30;
  std::string hostname = "cordon";
  // What /tmp and /dev/shm may hold together: directories of the root tmpfs, which is this size
  // plus 4 MiB for the root's own files (prepare.cpp).
  uint64_t tmp_size_bytes = 1ULL << 30;
  uint64_t inotify_instances = 32;  // per-sandbox quota (user.max_inotify_instances)
  uint64_t inotify_watches = 8192;
  // No core dumps (they would land in the root), bounded fds, locked memory, message queues,
  // queued signals, no raised priorities. RLIMIT_NPROC is per uid and left to the pids cgroup.
  // RLIMIT_SIGPENDING also bounds POSIX timers (each holds a queued signal): the host's
  // default (~96,000 here) let one command fill the kernel's one hash of timers, and every
  // timer call on the host took 10–20 times as long (a red-team review, session 37).
  std::vector<Rlimit> rlimits = {
      {RLIMIT_CORE, 0, 0},
      {RLIMIT_NOFILE, 4096, 4096},
      {RLIMIT_MEMLOCK, 64 << 10, 64 << 10},
      {RLIMIT_MSGQUEUE, 800 << 10, 800 << 10},
      {RLIMIT_SIGPENDING, 1024, 1024},
      {RLIMIT_NICE, 0, 0},
      {RLIMIT_RTPRIO, 0, 0},
  };
  // The identity (device, inode) of argv[0] as the caller checked it (policy identity check,
  // sha256 pin); the sandbox refuses a different file at that path. 0/0: not checked.
  uint64_t exec_dev = 0, exec_ino = 0;
  bool allow_ptrace = false;         // documented opt-in for sanitizer builds
  bool allow_netlink_route = false;  // documented opt-in: SeccompOptions::allow_netlink_route
  uint32_t disabled_walls = 0;       // honoured only in the test-walls build (CORDON_TEST_WALLS)
};

/// Whether two specs build the same sandbox up to its job: what a parked sandbox (warm pool)
/// is made of before its job is known — the mounts, the identity, the network, the quotas, the
/// rlimits. argv, env, cwd, the executable's identity and the tty size belong to the job; the
/// seccomp profile and its options are compared with the request (pool.cpp `fits`, and the
/// spawner for a parked init that loaded the filters). Never a tty: a pty is made with the
/// sandbox.
/// The refusal of a start whose read-only path in the working root is no longer the inode
/// read_only_ids names: the start's check and the spawner's say the same.
inline std::string moved_read_only_path(const std::string& path) {
  return "readOnlyPaths entry `" + path +
         "` lies in the working root and is no longer what the policy bound when cordon "
         "started: a job moved or replaced it, or a directory above it. Nothing was started; "
         "the operator must check the working root, then restart cordon";
}

inline bool same_sandbox_shape(const SandboxSpec& a, const SandboxSpec& b) {
  auto same_rlimits = [&] {
    if (a.rlimits.size() != b.rlimits.size()) {
      return false;
    }
    for (size_t i = 0; i < a.rlimits.size(); ++i) {
      const Rlimit &x = a.rlimits[i], &y = b.rlimits[i];
      if (x.resource != y.resource || x.soft != y.soft || x.hard != y.hard) {
        return false;
      }
    }
    return true;
  };
  return !a.tty && !b.tty && a.root == b.root && a.root_read_only == b.root_read_only &&
         a.reads_root_and_system_only == b.reads_root_and_system_only &&
         a.read_only_paths == b.read_only_paths && a.read_only_ids == b.read_only_ids &&
         a.extra_masked_paths == b.extra_masked_paths && a.network == b.network &&
         a.inside_uid == b.inside_uid && a.inside_gid == b.inside_gid && a.hostname == b.hostname &&
         a.tmp_size_bytes == b.tmp_size_bytes && a.inotify_instances == b.inotify_instances &&
         a.inotify_watches == b.inotify_watches && a.disabled_walls == b.disabled_walls &&
         same_rlimits();
}

}  // namespace cordon::sandbox
