#pragma once

// The supervisor of one spawned sandbox: a single-threaded epoll loop that relays the
// command's output (pipes or a pty master) to the caller's descriptors as it arrives, feeds
// its stdin, enforces the wall-clock timeout and the per-stream output cap, forwards the
// caller's termination signals, and turns the status channel plus init's own wait status into
// an Outcome. It never blocks and never sleeps; every wait is an epoll event.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "base/error.hpp"
#include "base/unique_fd.hpp"
#include "sandbox/status.hpp"

namespace cordon::engine {

/// The descriptors the spawn side hands over once the sandbox runs.
struct SandboxHandles {
  UniqueFd pidfd;                     // pidfd of the sandbox init (PID 1 of its pid namespace)
  UniqueFd status;                    // SOCK_SEQPACKET status channel (sandbox/status.hpp)
  UniqueFd stdout_read, stderr_read;  // pipe read ends (invalid when tty)
  UniqueFd stdin_write;               // pipe write end to feed the command's stdin, or invalid
};

struct SuperviseOptions {
  std::chrono::milliseconds timeout{0};  // 0 = none; counted from the call to supervise()
  std::chrono::milliseconds kill_grace{5000};
  // Once init is gone every writer of the pipes is dead, so EOF follows at once; this only
  // bounds the wait for EOF should a write end have leaked outside the sandbox (a caller's
  // slow reader is not bounded: what the pipes hold is delivered).
  std::chrono::milliseconds drain_timeout{1000};
  uint64_t max_output_bytes = 0;  // per stream; 0 = unlimited
  // With its own network namespace: the memory limit its TCP sockets count against
  // (kSocketCost each; 0 = not counted).
  uint64_t socket_memory_limit = 0;
  int out_fd = STDOUT_FILENO, err_fd = STDERR_FILENO;
  // Data read here goes to stdin_write (EOF closes stdin_write). With tty it goes to the pty
  // master instead; when -1 in tty mode, terminal_fd is read (ssh-like).
  int stdin_fd = -1;
  bool tty = false;  // a pty master will arrive on the status channel; output counts as stdout
  // The caller's terminal when tty: raw mode while running, termios restored and pending input
  // flushed on return, initial size copied to the master and SIGWINCH relayed.
  int terminal_fd = -1;
};

/// How supervise() reaches every process of the sandbox; the spawn side owns the mechanism.
struct KillHooks {
  std::function<void(int sig)> signal_init;  // send sig to the init (pidfd_send_signal)
  std::function<void()> kill_all;            // SIGKILL every process (cgroup.kill + init)
};

enum class RunState {
  kExited,
  kKilled,
  kTimeout,
  kOutputLimit,
  kSocketLimit,
  kSetupFailed,
  kInitDied
};

/// "exited", "killed", "timeout", "output-limit", "oom" (its sockets), "setup-failed",
/// "init-died".
const char* run_state_name(RunState state);

/// How a sandbox's init ended, from its wait(2) status, for the message of a job whose init
/// died without reporting the command: "init exited with code 125", "init was killed by
/// SIGSYS". Each of init's own ways out says something different (init.cpp).
std::string init_end_text(int wait_status);

/// The message of a job whose init died without reporting the command, with its reason when
/// one is known: the failed wait init reported (kInitWait and its errno), else how init
/// ended (init_end_text of its wait status). `cordon run` and the engine say the same.
std::string init_died_message(sandbox::SetupStep step, int err,
                              std::optional<int> init_wait_status);

/// TCP sockets a sandbox with its own network namespace may hold: each counts kSocketCost
/// against its memory limit, read every kSocketCheckEvery. The kernel charges a connection to
/// a memory cgroup only when accept() takes it, so the server ends of connections a job's own
/// listener never accepts were charged to nothing: 819 200 of them took ~3 GiB of host slab
/// under --memory 32M (a red-team review, session 40). 4 KiB is about what one costs (the
/// socket, its request and buffer heads: ~3.7 KB measured) and no more than a page of data.
inline constexpr uint64_t kSocketCost = 4096;
inline constexpr std::chrono::milliseconds kSocketCheckEvery{500};
/// /proc/<init>/net/sockstat and sockstat6 of the sandbox whose init `pidfd` is, opened (and
/// checked to be that init's: its pid not reused) to be read again and again; the
/// descriptors hold the namespace, so they are closed when the job ends.
struct Sockstat {
  UniqueFd v4, v6;  // v6 absent on a kernel without IPv6
};
[[nodiscard]] Result<Sockstat> open_sockstat(int pidfd);
/// Reads the TCP sockets in use in the namespace, IPv4 ("TCP: inuse N") and IPv6 ("TCP6:
/// inuse N": a connection to ::1 counts only there; the review of session 40), keeping the
/// most seen in `seen`: true when they pass `memory_limit` at kSocketCost each. The engine
/// and `cordon run` decide alike.
[[nodiscard]] bool sockets_over_limit(const Sockstat& s, uint64_t memory_limit, uint64_t& seen);
/// The error of a job killed for its sockets.
std::string socket_limit_message(uint64_t sockets, uint64_t memory_limit);

struct Outcome {
  RunState state = RunState::kInitDied;
  bool have_wait_status = false;        // a kCommandExited record arrived
  int wait_status = 0;                  // the command's raw wait status
  int exit_code = -1, term_signal = 0;  // decoded from wait_status
  sandbox::SetupStep failed_step = sandbox::SetupStep::kNone;
  int setup_errno = 0;
  bool have_init_wait_status = false;   // false when init is not our child (waitid: ECHILD)
  int init_wait_status = 0;             // init's own status, in wait(2) encoding
  std::chrono::nanoseconds duration{};  // from the call until init was seen to exit
  // Bytes accepted from each stream (never more than the cap), including bytes that could
  // not be delivered because the destination failed.
  uint64_t stdout_bytes = 0, stderr_bytes = 0;
  int stdout_write_errno = 0, stderr_write_errno = 0;  // first write error on out_fd / err_fd
  std::string output_limit_stream;                     // "stdout"/"stderr" when the cap was hit
  uint64_t tcp_sockets = 0;  // the most TCP sockets its namespace was seen to hold (counted)
  // Streams still open when the drain after init's exit gave up: a process outside the sandbox
  // holds their write end; what it wrote later was not relayed.
  std::vector<std::string> held_open;
  // Streams whose last output was dropped: the caller signalled cordon and its reader had not
  // taken everything, after the sandbox ended (at once) or a drain's time after (a signal
  // that ended the command).
  std::vector<std::string> undelivered;
  bool signalled_by_caller = false;  // cordon itself got SIGINT/SIGTERM/SIGHUP and forwarded it
  int caller_signal = 0;             // the last such signal, so a CLI can re-raise it
};

/// Supervises the sandbox until init has exited and its output is delivered (a slow caller's
/// reader is waited for, as any writer waits). Takes no ownership of the caller's fds and
/// leaves their descriptions' flags alone where it can have descriptions of its own (pipes,
/// FIFOs, terminals are reopened, sockets use MSG_DONTWAIT; see CallerFds); the terminal's
/// termios is restored; closes handles.stdin_write when stdin ends. On Error, kill_all has been
/// called (if init was still running) and init is not reaped.
[[nodiscard]] Result<Outcome> supervise(SandboxHandles& handles, const SuperviseOptions& options,
                                        const KillHooks& hooks);

}  // namespace cordon::engine
