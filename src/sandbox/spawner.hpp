#pragma once

// The spawner: a small single-threaded process, exec'd from its own binary (cordon-spawner),
// that prepares and clone3s sandboxes on behalf of the long-lived, multi-threaded engine.
// The engine never forks or CLONE_VMs itself: fork/clone3 of a 1 GiB process costs ~42 ms,
// posix_spawn ~0.9 ms (DESIGN.md), and a sandboxed PID 1 sharing the engine's address space
// would let a /proc/1/mem write become code execution in the engine.
//
// ## Protocol (AF_UNIX SOCK_SEQPACKET socketpair; one datagram per message)
// The spawner's end is at fd kSpawnerSocketFd. Every message is a fixed header, host byte
// order (both ends are the same build on one machine). Strictly request → reply, in order.
//
//   hello:   engine sends SpawnerRequestHeader{kind = kHello}, no fds;
//            spawner answers SpawnerReplyHeader{kind = kHello, ok = 1, pid = its pid}.
//   spawn:   engine sends SpawnerRequestHeader{kind = kSpawn, request_id, flags, n_cgroup_v1}
//            with SCM_RIGHTS, in this order:
//              [0]   a memfd sealed F_SEAL_WRITE|F_SEAL_GROW|F_SEAL_SHRINK holding the
//                    SpawnRequestBody (spec_codec.hpp), at most kMaxRequestBytes
//                    (argv/env may be far larger than a datagram);
//              [1]   the job's v2 cgroup dirfd when flags & kRequestHasCgroupV2
//                    (CLONE_INTO_CGROUP);
//              [..]  n_cgroup_v1 (≤ kMaxCgroupV1Fds) v1 job cgroup dirfds (hybrid hosts): the
//                    spawner writes the new pid into each one's cgroup.procs before the go
//                    byte.
//            The spawner answers SpawnerReplyHeader{kind = kSpawn, the same request_id}:
//              ok = 0: error_code (cordon::ErrorCode), sys_errno and message (message_len
//                      bytes, truncated to kMaxErrorMessage) rebuild the Error; no fds.
//              ok = 1: pid, and SCM_RIGHTS in ascending bit order of `fds` (ReplyFd): pidfd,
//                      status channel (parent end), stdout read, stderr read, stdin write
//                      (the three pipes only without a tty), then the result memfd when
//                      kReplyResultMemfd is set. The SpawnResultBody (AppliedFeatures and the
//                      final argv) follows the header inline (result_len bytes, at most
//                      kMaxInlineResult), or is in that sealed memfd (at most kMaxResultBytes)
//                      when larger.
//   park (warm pool): engine sends SpawnerRequestHeader{kind = kPark, request_id, flags,
//            n_cgroup_v1} with the same descriptors as a spawn: the memfd holding a
//            SpawnRequestBody whose spec is the sandbox's shape (same_sandbox_shape; argv, env
//            and cwd unused), then the cgroup dirfds of a fresh, unused cgroup set. The spawner
//            builds the whole sandbox now — namespaces, cgroup placement, mounts, pivot_root,
//            Landlock rulesets, the privilege drop — and execs its init, which says kParked on
//            the status channel and waits for its job. The reply is SpawnerReplyHeader{kind =
//            kPark, ok, pid = the parked init}, no descriptors (the spawner keeps them); the
//            slot is named by the request_id of the park.
//   spawn from a slot: a spawn request with kRequestPooled and pool_slot = that id carries
//            only the memfd of the job's SpawnRequestBody. Its spec must have the parked
//            sandbox's shape, the same host id, init and cgroup namespace mode, and its root
//            and --ro paths must still be the directories that were bound. The spawner waits
//            (bounded) for the kParked record, resolves the job's cwd and executable, writes
//            its plan and makes its pipes, sends them to the parked init (ParkedJob,
//            plan_format.hpp), and answers with the usual spawn reply (pidfd, status, pipes,
//            result). A slot is used exactly once and lives as long as its init: an unknown
//            or dead slot, a job of another shape, a changed root or a parked sandbox that
//            failed gets an ok = 0 reply with flags kReplySlotGone, the parked sandbox is
//            killed and reaped, and nothing was started (the client then resends the request
//            unpooled, with the cgroup fds). Any other failure of the job (its cwd, its
//            executable) is the same error an unpooled spawn gives, and the slot is spent.
// A request the spawner cannot parse (bad header, wrong fds, a malformed or oversized body)
// gets an ok = 0 reply (kInvalid) and the spawner keeps serving. Every received descriptor is
// closed once the request is answered; none reaches a sandbox (the clone3 child closes all
// but its plan's descriptors first thing).
//
// ## Lifetime
// The spawner is the parent of every sandbox init and reaps them (signalfd SIGCHLD + a
// waitid(P_ALL, WNOHANG) loop), so no zombie stays; the engine watches pidfds only (poll works
// for non-parents). EOF on the socket (the engine closed its end or died) makes the spawner
// SIGKILL every init it has not reaped, reap them and exit; an init that outlives a SIGKILLed
// spawner is killed by its PDEATHSIG, and as PID 1 of its pid namespace takes the sandbox
// with it. A zero-length datagram reads as EOF (SOCK_SEQPACKET cannot tell them apart): the
// engine never sends one.
//
// A spawner that dies while the engine lives (SIGKILLed by an operator, the OOM killer, a
// crash) takes its sandboxes with it (PDEATHSIG) and is replaced by the client in place
// (SpawnerClient::replace_if_dead, and spawn()/park() before they use it): the dead one is
// reaped and a new one started from the same path. Request ids go on counting across
// replacements, so a pool slot of the dead spawner never names one of its replacement's.
//
// ## Caches
// The seccomp profile is loaded and compiled once per (path, SeccompOptions) and the init
// filter once per spawner; a changed profile file takes effect in a new spawner.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"
#include "sandbox/prepare.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/spec.hpp"

namespace cordon::sandbox {

inline constexpr int kSpawnerSocketFd = 3;
inline constexpr uint32_t kSpawnerMagic = 0x4e505343;  // "CSPN"
inline constexpr uint32_t kSpawnerProtocolVersion = 3;
inline constexpr size_t kMaxRequestBytes = size_t{64} << 20;
inline constexpr uint32_t kMaxCgroupV1Fds = 8;
inline constexpr size_t kMaxErrorMessage = 1024;
inline constexpr size_t kMaxInlineResult = size_t{16} << 10;
inline constexpr size_t kMaxResultBytes = size_t{16} << 20;

enum class SpawnerMessage : uint32_t { kHello = 1, kSpawn = 2, kPark = 3 };

inline constexpr uint32_t kRequestHasCgroupV2 = 1u << 0;
inline constexpr uint32_t kRequestPooled = 1u << 1;  // spawn: into pool_slot's parked sandbox

struct SpawnerRequestHeader {
  uint32_t magic = kSpawnerMagic;
  uint32_t version = kSpawnerProtocolVersion;
  SpawnerMessage kind = SpawnerMessage::kHello;
  uint32_t flags = 0;  // kRequestHasCgroupV2, kRequestPooled
  uint64_t request_id = 0;
  uint32_t n_cgroup_v1 = 0;
  uint32_t body_len = 0;   // always 0 (bodies travel in memfds)
  uint64_t pool_slot = 0;  // spawn with kRequestPooled: the request_id of its pool-add
};
static_assert(sizeof(SpawnerRequestHeader) == 40);

enum ReplyFd : uint32_t {
  kReplyPidfd = 1u << 0,
  kReplyStatus = 1u << 1,
  kReplyStdoutRead = 1u << 2,
  kReplyStderrRead = 1u << 3,
  kReplyStdinWrite = 1u << 4,
  kReplyResultMemfd = 1u << 5,
  kReplyFdMask = (1u << 6) - 1,
};

struct SpawnerReplyHeader {
  uint32_t magic = kSpawnerMagic;
  uint32_t version = kSpawnerProtocolVersion;
  SpawnerMessage kind = SpawnerMessage::kHello;
  uint32_t ok = 0;
  uint64_t request_id = 0;
  int32_t pid = -1;
  uint32_t fds = 0;         // ReplyFd bits
  uint32_t error_code = 0;  // cordon::ErrorCode
  int32_t sys_errno = 0;
  uint32_t message_len = 0;
  uint32_t result_len = 0;  // inline SpawnResultBody bytes after this header
  uint32_t flags = 0;       // kReplySlotGone
  uint32_t reserved = 0;
  char message[kMaxErrorMessage] = {};
};
static_assert(sizeof(SpawnerReplyHeader) == 56 + kMaxErrorMessage);

/// On an ok = 0 reply to a pooled spawn: the slot is unknown, its sandbox is gone or does not
/// fit the job, and nothing was started.
inline constexpr uint32_t kReplySlotGone = 1u << 0;

/// Reads and parses a seccomp profile file (policy::load_seccomp_profile in cordon-spawner;
/// injected because the policy layer sits above this one).
using ProfileLoader = std::function<Result<SeccompProfile>(const std::string& path)>;

class SpawnerClient {
 public:
  /// posix_spawn()s `spawner_path` (own process group, empty environment and signal mask,
  /// stdin/stdout on /dev/null, the socket at kSpawnerSocketFd, nothing else open) and returns
  /// once it answered a hello. Errors name the step; a started spawner is killed on failure.
  [[nodiscard]] static Result<SpawnerClient> start(const std::string& spawner_path);

  struct Request {
    SandboxSpec spec;
    std::string seccomp_profile_path, init_path;
    uid_t host_id = 0;               // leased by the caller (HostIdLease), held while it runs
    int cgroup_v2_fd = -1;           // borrowed; -1 for none
    std::vector<int> cgroup_v1_fds;  // borrowed
    bool cgroupns_at_clone = true;   // pure v2 hosts; false on hybrid (the child unshares)
    // Warm pool: the slot (park()'s return) whose sandbox sits in these cgroups, built for
    // this host id; 0 for none. When the slot turns out to be gone (its sandbox died, or it
    // does not fit), spawn() spawns unpooled into the same cgroups, so the cgroup fds above
    // are still required.
    uint64_t pool_slot = 0;
  };
  struct Reply {
    pid_t pid = -1;  // the sandbox init, in the spawner's (and our) pid namespace
    UniqueFd pidfd, status, stdout_read, stderr_read, stdin_write;
    AppliedFeatures applied;
    std::vector<std::string> argv;
  };

  /// Synchronous request/response; thread-safe (one request at a time). A failed spawn is an
  /// Error with the spawner's code, errno and message. A spawner found dead is replaced first;
  /// one that dies before it read the request (nothing was started) is replaced and the
  /// request sent once more, unpooled. One that dies after (it may have started the sandbox)
  /// is an Error, as is a protocol violation, after which every later call fails at once.
  [[nodiscard]] Result<Reply> spawn(const Request& request);
  /// Sends `body` as the request body exactly as given (spawn() sends encode_spawn_request's
  /// output), without spawn()'s fallback for a gone pool slot. Public so tests can check that
  /// a malformed body is refused.
  [[nodiscard]] Result<Reply> spawn_encoded(std::string_view body, int cgroup_v2_fd,
                                            std::span<const int> cgroup_v1_fds,
                                            uint64_t pool_slot = 0);

  struct PoolSlot {
    uint64_t id = 0;
    pid_t init = -1;          // the parked sandbox's init (the spawner's child)
    uint64_t generation = 0;  // generation() of the spawner that parked it
  };
  /// Warm pool: asks the spawner to build a sandbox of `request`'s shape (spec, host id,
  /// cgroup fds of a fresh, unused set, borrowed) and park it until a spawn names the slot.
  /// Returns once it is cloned; its setup goes on in the sandbox. The slot is spent by one
  /// spawn (Request::pool_slot) and dies with its sandbox (destroying the cgroups kills it).
  [[nodiscard]] Result<PoolSlot> park(const Request& request);

  /// The spawner process (it changes when a dead one is replaced; -1 when none runs).
  pid_t pid() const;
  /// When the spawner process has exited (SIGKILLed, crashed) or none runs (a replacement
  /// failed): reaps the dead one and starts another from the same path in its place, so every
  /// reference to this client (a pool's, a starter thread's) stays good. Returns true when it
  /// started one, false when the spawner is alive or stop() was called. Thread-safe.
  [[nodiscard]] Result<bool> replace_if_dead();
  /// Counts the replacements: a pool slot parked under an earlier generation died with its
  /// spawner. Lock-free (read while a long spawn holds the client).
  uint64_t generation() const { return generation_->load(std::memory_order_acquire); }
  /// Calls `watch` now, and after every replacement, with the spawner's pidfd (owned by this
  /// client; closed when the spawner is replaced or stopped, which takes it out of an epoll
  /// set), under the client's lock: `watch` must not call back into this client. An error it
  /// returns is the replacement's (the new spawner serves all the same).
  [[nodiscard]] Result<void> set_watch(std::function<Result<void>(int pidfd)> watch);
  /// Closes our end (the spawner kills its sandboxes and exits) and reaps the spawner,
  /// SIGKILLing it after `grace`. Returns its raw wait status. Idempotent after the first call.
  [[nodiscard]] Result<int> stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

  SpawnerClient(SpawnerClient&&) noexcept = default;
  SpawnerClient& operator=(SpawnerClient&&) = delete;
  ~SpawnerClient();

 private:
  SpawnerClient() = default;
  // Sends one spawn or park request: its body in a sealed memfd, then the cgroup fds (or the
  // parked slot it names). A failed send breaks the connection. mu_ held.
  Result<void> send_request(SpawnerMessage kind, uint64_t id, std::string_view body,
                            int cgroup_v2_fd, std::span<const int> cgroup_v1_fds,
                            uint64_t pool_slot);
  // `slot_gone` (may be null) is set when a pooled request failed with kReplySlotGone; `sent`
  // (may be null) once the request was handed to the socket (before that, nothing started).
  Result<Reply> exchange(uint64_t id, std::string_view body, int cgroup_v2_fd,
                         std::span<const int> cgroup_v1_fds, uint64_t pool_slot, bool* slot_gone,
                         bool* sent = nullptr);
  // Whether the spawner has exited (or none runs), waiting at most `wait_ms`. mu_ held.
  Result<bool> exited_locked(int wait_ms);
  // Before a request: replaces a spawner that died since the last one; refuses after stop()
  // or a protocol violation. mu_ held.
  Result<void> ready_locked();
  // Reaps the dead spawner and starts another in its place. mu_ held.
  Result<void> replace_locked();

  std::string path_;  // what start() ran: a replacement runs it again
  pid_t pid_ = -1;
  UniqueFd pidfd_;  // of the spawner, our child
  UniqueFd sock_;
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  // Behind a pointer, as mu_ is, so the client stays movable.
  std::unique_ptr<std::atomic<uint64_t>> generation_ = std::make_unique<std::atomic<uint64_t>>(0);
  std::function<Result<void>(int)> watch_;
  uint64_t next_id_ = 1;  // never reset by a replacement (slot ids stay unique)
  bool broken_ = false;
  bool stopped_ = false;  // stop() was called: nothing is started again
};

/// The spawner's server loop on `sock_fd` (see the protocol above). Returns the process exit
/// status: 0 after EOF, 1 when the socket failed, 2 when `sock_fd` is not a SOCK_SEQPACKET
/// socket. Expects a single-threaded process: it switches its own credentials around clone3.
[[nodiscard]] int spawner_main(int sock_fd, const ProfileLoader& load_profile);

}  // namespace cordon::sandbox
