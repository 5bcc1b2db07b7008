#pragma once

// The job engine: start a sandboxed command, keep working, ask about it later, read every
// byte it printed. One event-loop thread owns every running job's descriptors; the state
// lives on disk (jobs/<taskId>/{meta.json,stdout.log,stderr.log}, artifacts/) and survives a
// restart. All methods are thread-safe and never block past their own bounded wait.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cordon/error.hpp"

namespace cordon {

/// How many of one session's git tools' jobs run at once, and, with the policy's
/// concurrency.perUid set, of one owner's (they need no slot of their session's or owner's
/// own: docs/git.md).
inline constexpr uint64_t kGitJobsPerSession = 2;
inline constexpr uint64_t kGitJobsPerOwner = 2;

struct EngineOptions {
  std::string state_dir;     // created 0700 if missing; one engine per state dir (flock)
  std::string policy_path;   // empty: no policy, every start is refused with how to set one
  std::string spawner_path;  // default: cordon-spawner next to the running binary
  std::string init_path;     // default: cordon-init next to the running binary
  std::string default_seccomp_profile;  // default: seccomp/default.json next to the binary
  // Host directories no job may write (the daemon's socket directory): a policy whose cwdRoot
  // contains or is one of them is refused at open.
  std::vector<std::string> job_unwritable_paths;
  uint32_t host_id_base = 0x70000000;
  uint32_t host_id_count = 65536;
  size_t settled_cache = 256;  // settled jobs kept in memory; the rest are read from disk
  // Durability against a machine crash (a restart of cordon loses nothing either way: every
  // record is replaced by an atomic rename, and the page cache outlives the process). 0: each
  // record and each settled log is fsynced before the call that wrote it returns (≈ 10-14
  // fsyncs per job, under the engine's lock). N: a flusher thread calls syncfs() on the state
  // dir at most N ms after a change, off every job's path; a machine crash loses at most the
  // last N ms of records, which recovery reads as abandoned or absent.
  uint32_t sync_interval_ms = 1000;
  // Warm pool (docs/performance.md): job cgroup sets made ahead of time, each with a spawner
  // placeholder already moved into its v1 cgroups, so a start skips the ~11 ms v1 placement.
  // Each entry is used by exactly one job; warm_pool_size entries are kept ready.
  bool warm_pool = true;
  size_t warm_pool_size = 4;
  // Who a session belongs to, for the policy's concurrency.perUid (the daemon maps its
  // `u<uid>-NAME` and `u<uid>.conn-…` sessions to `u<uid>`). Empty: one owner for all.
  std::function<std::string(const std::string& session)> session_owner;
};

enum class StdinMode { kNull, kPipe };

/// The policy a start is checked against. kGit is the git tools' private one-executable
/// policy (only the git binary, the repository bound read-only, no network); nothing an
/// agent sends selects it, only the git tools do.
enum class JobPolicy { kMain, kGit };

struct StartOptions {
  std::vector<std::string> argv;
  std::optional<std::string> cwd;
  std::optional<uint64_t> timeout_ms;
  std::map<std::string, std::string> env;
  std::string label;
  StdinMode stdin_mode = StdinMode::kNull;
  bool pty = false;
  uint16_t cols = 120, rows = 30;  // the terminal's size (pty only), 1 to kMaxTerminalSide
  JobPolicy policy = JobPolicy::kMain;
};

/// The largest side of a job's terminal, in characters: start() and resize() refuse more
/// (kInvalid), and less than 1.
inline constexpr uint16_t kMaxTerminalSide = 1000;

/// The policy's git section as the git tools need it (paths resolved by the policy).
struct GitSettings {
  std::string repo_root;      // as written in the policy
  std::string resolved_root;  // the kernel's path of it
  std::string binary;
  uint64_t timeout_ms = 0;
  uint64_t max_output_bytes = 0;
  uint64_t preview_chars = 0;
};

struct ArtifactRef {
  std::string artifact_id;
  std::string kind = "command-output";
  std::string task_id, stream;
  uint64_t size_bytes = 0;
  std::string sha256;
  std::string preview;
  std::string read_back_hint;
};

struct Usage {
  uint64_t peak_memory_bytes = 0, cpu_usec = 0, oom_kills = 0, pids_max_hits = 0;
};

struct JobStatus {
  std::string task_id, session, label;
  std::vector<std::string> argv;
  std::string cwd;
  // queued, running, exited, killed, timeout, output-limit, oom, failed, abandoned; and
  // `removed`, only in wait()'s answer, for a job removed while it was waited for
  std::string state;
  std::optional<int> exit_code;
  std::optional<std::string> signal;
  std::string started_at, ended_at;  // RFC 3339 UTC; ended_at empty while not settled
  uint64_t duration_ms = 0;
  uint64_t stdout_bytes = 0, stderr_bytes = 0;  // for a pty job: the pty stream in stdout_bytes
  bool pty = false;
  uint16_t cols = 0, rows = 0;  // a pty job's terminal size (the last resize's); 0 without pty
  std::optional<ArtifactRef> stdout_artifact, stderr_artifact;  // once settled
  std::string tail_preview;
  std::string error;
  Usage usage;
  bool settled() const;
};

struct Counters {
  uint64_t running = 0;   // queued or running jobs of the session
  uint64_t finished = 0;  // settled and not yet read (status or output clears it)
};

/// A page of a session's jobs, in start order (oldest first).
struct ListRequest {
  std::optional<std::string> state;  // only jobs in this state
  uint64_t offset = 0;               // how many matching jobs to skip
  uint64_t limit = UINT64_MAX;       // at most this many
};

struct ListPage {
  std::vector<JobStatus> jobs;
  uint64_t total = 0;  // every job that matches `state`, in or out of the page
};

enum class OutputUnit { kChars, kBytes, kLines };

struct OutputRequest {
  std::string stream = "stdout";  // stdout | stderr | pty
  uint64_t offset = 0;
  uint64_t limit = 50000;
  OutputUnit unit = OutputUnit::kChars;
};

struct OutputPage {
  std::string content;  // for kBytes: base64 of the bytes
  bool base64 = false;
  uint64_t offset = 0, total_size = 0, next_offset = 0;
  bool has_more = false;
  bool complete = false;  // the stream is settled: total_size is final
};

struct WriteInput {
  std::optional<std::string> data, paste;
  std::vector<std::string> keys;
  bool submit = false, eof = false;
};

/// Called once for each job that settles, with its final status (already on disk).
using SettleCallback = std::function<void(const JobStatus&)>;

class Engine {
 public:
  /// Opens (or recovers) the state dir, loads the policy, starts the spawner and the loop.
  [[nodiscard]] static Result<std::unique_ptr<Engine>> open(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  /// What the operator should know, found at open: the policy against this host (limits that
  /// add up past the host's pids: policy::host_warnings). A daemon and `cordon mcp` log them.
  [[nodiscard]] const std::vector<std::string>& warnings() const;
  Engine& operator=(const Engine&) = delete;

  /// Returns at once: a running or queued job's status. A refusal is an Error (kRefused).
  [[nodiscard]] Result<JobStatus> start(const std::string& session, const StartOptions& options);
  /// The job's status; waits up to `wait` for it to settle first. Marks it read.
  [[nodiscard]] Result<JobStatus> status(const std::string& session, const std::string& task_id,
                                         std::chrono::milliseconds wait = {});
  /// The job's status now, without waiting and without marking it read (what list() gives for
  /// one job, found by id rather than by listing the session).
  [[nodiscard]] Result<JobStatus> peek(const std::string& session, const std::string& task_id);
  /// Waits until any (or all) of the jobs settled, at most `timeout`; returns their statuses.
  [[nodiscard]] Result<std::vector<JobStatus>> wait(const std::string& session,
                                                    const std::vector<std::string>& task_ids,
                                                    std::chrono::milliseconds timeout, bool all);
  [[nodiscard]] Result<OutputPage> output(const std::string& session, const std::string& task_id,
                                          const OutputRequest& request);
  /// SIGTERM (or `signal`) to the whole sandbox, SIGKILL after the grace. A settled job's
  /// status comes back unchanged.
  [[nodiscard]] Result<JobStatus> kill(const std::string& session, const std::string& task_id,
                                       int signal = 15);
  /// kill() for many jobs of the session under one hold of the engine's lock: every sandbox is
  /// signalled before any of them settles (N kill() calls each wait for the event loop, which
  /// settles the first to die while the rest are still alive). An unknown id refuses the call
  /// before any job is signalled; otherwise every job is signalled, and the first error (a
  /// job killed before it started whose record cannot be read back) is returned after that.
  /// Statuses in the order of `task_ids`.
  [[nodiscard]] Result<std::vector<JobStatus>> kill_many(const std::string& session,
                                                         const std::vector<std::string>& task_ids,
                                                         int signal = 15);
  [[nodiscard]] Result<void> write(const std::string& session, const std::string& task_id,
                                   const WriteInput& input);
  /// Sets a pty job's window size (TIOCSWINSZ: its foreground process group gets SIGWINCH).
  /// A queued job, or one whose terminal has not reached the engine yet, gets the size when
  /// it does. kInvalid for a side outside 1..kMaxTerminalSide; kRefused for a job started
  /// without pty or settled.
  [[nodiscard]] Result<void> resize(const std::string& session, const std::string& task_id,
                                    uint16_t cols, uint16_t rows);
  [[nodiscard]] Result<std::vector<JobStatus>> list(const std::string& session,
                                                    const std::optional<std::string>& state);
  /// One page of list(): statuses (with their output tails) are built only for the jobs in
  /// the page, so a session of thousands of jobs is listed a page at a time.
  [[nodiscard]] Result<ListPage> list_page(const std::string& session, const ListRequest& request);
  /// Deletes a settled job's logs and artifacts.
  [[nodiscard]] Result<void> remove(const std::string& session, const std::string& task_id);
  /// Pages an artifact of one of the session's jobs (another session's is unknown to it).
  [[nodiscard]] Result<OutputPage> retrieve(const std::string& session,
                                            const std::string& artifact_id,
                                            const OutputRequest& request);
  [[nodiscard]] Counters counters(const std::string& session);
  /// The task ids a session knows (for refusals that list them); an error when the session's
  /// job index cannot be read (never an empty list in its place).
  [[nodiscard]] Result<std::vector<std::string>> known_ids(const std::string& session);
  /// A session that will start nothing more (a daemon connection's unnamed session, ended with
  /// it): with rootPerSession its working root's fd is closed and the directory removed when
  /// empty. Its jobs and records stay. A later start in that session opens the root again.
  void release_session(const std::string& session);
  /// The sessions that have jobs on disk (those with a job index), in no order.
  [[nodiscard]] Result<std::vector<std::string>> sessions();
  /// Ends a session for good (a daemon connection's unnamed one, when the connection ends):
  /// its queued and running jobs are killed (as kill_many), waited for at most `settle`, then
  /// every settled job's logs, artifacts and records are removed, the session's index
  /// rewritten once, and release_session() runs. A job still running after `settle` (its kill
  /// grace is longer) keeps its record. Returns how many jobs were removed.
  [[nodiscard]] Result<size_t> end_session(const std::string& session,
                                           std::chrono::milliseconds settle);
  /// The policy's git section, or nullopt when the git tools are not enabled.
  [[nodiscard]] std::optional<GitSettings> git_settings();
  /// Calls `callback` for every job of every session that settles from now on, on the thread
  /// that settled it with the engine's lock held: it must return quickly, must not call this
  /// engine and must not throw (std::terminate). Returns the id for unsubscribe_settled.
  uint64_t subscribe_settled(SettleCallback callback);
  /// Once this returns, the callback is not running and is never called again.
  void unsubscribe_settled(uint64_t id);

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  Result<JobStatus> start_job(const std::string& session, const StartOptions& options);  // mu held
};

}  // namespace cordon
