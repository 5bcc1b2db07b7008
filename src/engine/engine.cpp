// The job engine (include/cordon/engine.hpp). One event-loop thread owns every running job's
// descriptors (pidfd, status channel, output pipes or pty master, stdin pipe) in one epoll
// set with one timerfd; API calls from any thread take the same mutex, register descriptors
// with epoll directly, and wait on a condition variable. Sandboxes are spawned by the
// separate cordon-spawner process, never by forking this one.
//
// Persistence uses nlohmann/json for meta.json (the only JSON in this layer; STYLE.md keeps
// JSON to api/policy, but the on-disk format belongs to the engine).

#include "cordon/engine.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <limits>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "base/base64.hpp"
#include "base/json_fields.hpp"
#include "base/scope_exit.hpp"
#include "base/sha256.hpp"
#include "base/strings.hpp"
#include "base/utf8.hpp"
#include "engine/hash_worker.hpp"
#include "engine/keys.hpp"
#include "engine/paging.hpp"
#include "engine/supervise.hpp"
#include "policy/host_paths.hpp"
#include "policy/policy.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/pool.hpp"
#include "sandbox/prepare.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/spawner.hpp"
#include "sandbox/status.hpp"
#include "sandbox/userns.hpp"
#include "sys/fs.hpp"
#include "sys/sigpipe.hpp"
#include "sys/syscalls.hpp"

namespace cordon {

bool JobStatus::settled() const { return state != "queued" && state != "running"; }

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Output is read 256 KiB at a time, and at most 16 such chunks (4 MiB) wait for the hash
// thread. 1 MiB chunks (8 in flight) cycled 8 MiB through the caches: the copy into the log's
// page cache then read a cold source, and the loop's CPU per GiB swung between 0.5 and 1.3 s;
// 256 KiB chunks stay in L2 and held it at 0.46–0.57 s (capture_bench, the three sizes
// alternated; docs/performance.md, "Capture").
constexpr size_t kReadBuffer = 256 << 10;
constexpr size_t kHashChunks = 16;
// Artifact indexes kept for artifacts that are not their job's log (Impl::artifact_index).
constexpr size_t kArtifactIndexes = 16;
constexpr size_t kTailChars = 2000;
// Input a command has not read yet that the engine keeps for it; a write beyond it is refused
// (one write may be larger: the bound is checked before it is queued).
constexpr size_t kMaxPendingStdin = size_t{4} << 20;
constexpr std::chrono::milliseconds kDrainAfterInit{2000};
// How long a settle that began on init's report of the command's end (kExitedAlone) waits for
// init's exit before it tells the end: ~0.5 ms here; the bound is for a kernel that hangs.
constexpr std::chrono::milliseconds kInitExitWait{1000};
// How long a start that found every host id taken waits for settled jobs' teardowns.
constexpr std::chrono::milliseconds kTeardownWait{5000};
// A sandbox's mount-namespace hold (hold_mount_ns(), from its attach) is an fd until its settle;
// holds are taken only while this many fds stay free under RLIMIT_NOFILE, so a kill-all near the fd
// ceiling never leaves a settle without the fds it opens (it then goes without the hold).
constexpr int kFdsKeptFree = 256;
// Starter threads (Impl::starter_loop), each with its own spawner process: two sandboxes are
// made at once (one per core here), and one job's cgroup and uid-lease work overlaps another's
// spawner round trip.
constexpr size_t kStarters = 2;
constexpr size_t kSpawners = kStarters;  // 1 would have both starters share one spawner
// Room kept in `<state>/reserve` so that settling still works on a full disk: a meta write
// that hits ENOSPC frees one step of it and retries. A meta.json or artifact record takes a
// page or two; the reserve is taken back as soon as space allows. Freed a step at a time, not
// whole: the loop writes the logs of other running jobs between settles, and on a full disk
// they take whatever was freed, so a whole reserve freed by one settle left the next settle
// (two writers filling the disk together) nothing.
constexpr off_t kReserveBytes = 1 << 20;
constexpr off_t kReserveStep = 64 << 10;
// Every file the engine writes in a job's directory but its record (meta.json): what a remove
// deletes after the record, and what the open deletes from a directory left without one.
constexpr const char* kLogFiles[] = {"/stdout.log", "/stderr.log", "/pty.log"};
constexpr const char* kJobFiles[] = {
    "/stdout.log", "/stderr.log",      "/pty.log",         "/stdout.idx",   "/stderr.idx",
    "/pty.idx",    "/.stdout.idx.tmp", "/.stderr.idx.tmp", "/.pty.idx.tmp", "/.meta.json.tmp"};

std::string rfc3339_at(time_t seconds, long nanoseconds = 0) {
  struct timespec ts {};
  ts.tv_sec = seconds;
  ts.tv_nsec = nanoseconds;
  struct tm tm {};
  ::gmtime_r(&ts.tv_sec, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
  return buf;
}

std::string rfc3339_now() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return rfc3339_at(ts.tv_sec, ts.tv_nsec);
}

// Milliseconds since the epoch of a time rfc3339_at wrote, or nullopt for anything else.
std::optional<int64_t> rfc3339_ms(const std::string& text) {
  struct tm tm {};
  int ms = 0;
  if (text.size() != 24 ||
      std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon,
                  &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t seconds = ::timegm(&tm);
  if (seconds == static_cast<time_t>(-1)) {
    return std::nullopt;
  }
  return static_cast<int64_t>(seconds) * 1000 + ms;
}

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[rng() % 16]);
  }
  return out;
}

std::string new_task_id() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm {};
  ::gmtime_r(&ts.tv_sec, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return std::string("t") + buf + "-" + random_hex(6);
}

// A terminal of at least 1x1 (a program divides by its size) and at most kMaxTerminalSide a
// side (a full-screen program allocates a cell for each character of the window).
bool terminal_side_ok(uint64_t side) { return side >= 1 && side <= kMaxTerminalSide; }
Result<void> check_terminal_size(uint16_t cols, uint16_t rows) {
  if (!terminal_side_ok(cols) || !terminal_side_ok(rows)) {
    return invalid("a terminal of {}x{} (cols x rows): each side is 1 to {}", cols, rows,
                   kMaxTerminalSide);
  }
  return {};
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s[0] == '.') {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// The moment a caller's wait ends. A wait is at most ~290 years: `now + milliseconds::max()`
// overflowed into the past, and a caller asking to wait for ever got an answer at once (status
// and wait said `running`; end_session removed nothing and left the job running: a red-team
// review of the library, session 39).
Clock::time_point deadline_after(std::chrono::milliseconds wait) {
  using namespace std::chrono;
  const auto now = Clock::now();
  const auto room = duration_cast<milliseconds>(Clock::time_point::max() - now) - hours(24);
  return now + std::clamp(wait, milliseconds::zero(), room);
}

// kill and kill_many send a signal, 1 to 64. Any int went through before session 39 (a
// red-team review of the library): 9999 and -1 read Ok and the job was SIGKILLed after the
// grace, and 0 (the kernel's "does it exist") ended it too, with no caller named.
Result<void> check_signal(int signal) {
  if (signal == 0) {
    return invalid(
        "signal 0 sends nothing (it asks whether a process exists): read the job's "
        "state with status instead");
  }
  if (signal < 1 || signal > 64) {
    return invalid("signal {} is not a signal number: 1 to 64 (SIGTERM 15, SIGKILL 9)", signal);
  }
  return {};
}

// Every call that names a session's files checks its name first: `list`, `known_ids` and
// `end_session` joined any name into the index's path, so `../../x` read the lines of any
// `x.jobs` on the host and ended by deleting it (a red-team review of the library, session
// 39). The refusal start gives.
Result<void> check_session_name(const std::string& session) {
  if (!valid_name(session)) {
    return refusal("session name `{}` must be 1-128 letters, digits, `-`, `_` or `.`", session);
  }
  return {};
}

// temp file, rename: a crash of cordon leaves the old or the new file. With `sync`, the temp
// file and then the directory are fsynced, so a machine crash does too; without, the engine's
// flusher syncs the state dir shortly after.
Result<void> atomic_write(const std::string& dir, const std::string& name, const std::string& text,
                          bool sync) {
  std::string tmp = dir + "/." + name + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return sys_error("open `{}`", tmp);
  }
  UniqueFd guard(fd);
  // A failed write leaves no half temp file behind holding a full disk's last pages.
  if (auto w = sys::write_all(fd, text.data(), text.size()); !w) {
    ::unlink(tmp.c_str());
    return std::unexpected(std::move(w.error()).wrap("write `{}`", tmp));
  }
  if (sync && ::fsync(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_error(err, "fsync `{}`", tmp);
  }
  guard.reset();
  std::string dst = dir + "/" + name;
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    return sys_error("rename `{}`", dst);
  }
  if (!sync) {
    return {};
  }
  // The rename is visible now; what fails here is its survival of a machine crash, which the
  // caller asked for. Failure fixed (session 15): the directory's fsync was not checked.
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd) {
    return sys_error("open `{}` to fsync it", dir);
  }
  if (::fsync(dfd.get()) != 0) {
    return sys_error("fsync `{}`", dir);
  }
  return {};
}

Result<void> mkdir_p(const std::string& path, mode_t mode) {
  std::string cur;
  for (const auto& part : split(path, '/')) {
    if (part.empty()) {
      continue;
    }
    cur += "/" + part;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
      return sys_error("mkdir `{}`", cur);
    }
  }
  return {};
}

void set_nonblock(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : std::to_string(sig);
}

// Opens a job's log (or an artifact) to read: a regular file, never through a symlink and
// never blocking on open. Failure fixed (a review, session 14): a FIFO where a log should be
// (an operator's mistake, a damaged state dir) blocked Engine::open's recovery for ever, and a
// settled job's `list`/`status` blocked with the engine's lock held; a symlink to /dev/zero
// made recovery hash for ever. -1 with errno (EINVAL: not a regular file).
int open_log(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    int err = S_ISREG(st.st_mode) ? errno : EINVAL;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// The last `max_chars` characters of a log, valid UTF-8, read with one bounded pread.
// `live`: the log may still grow, so a sequence cut short at its end is held back (its next
// bytes may be on the way), as `output` pages hold it back; a settled log's is U+FFFD.
std::string file_tail(const std::string& path, size_t max_chars, bool live = false) {
  int fd = open_log(path);
  if (fd < 0) {
    return {};
  }
  UniqueFd guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    return {};
  }
  size_t want = std::min<size_t>(static_cast<size_t>(st.st_size), max_chars * 4);
  std::string buf(want, '\0');
  ssize_t n = ::pread(fd, buf.data(), want, st.st_size - static_cast<off_t>(want));
  if (n <= 0) {
    return {};
  }
  buf.resize(static_cast<size_t>(n));
  if (live) {
    // The last lead byte within a sequence's reach: a proper prefix from it waits.
    for (size_t back = 1; back <= 3 && back <= buf.size(); ++back) {
      size_t at = buf.size() - back;
      if ((static_cast<uint8_t>(buf[at]) & 0xC0) != 0x80) {
        if (utf8_unit_length(reinterpret_cast<const uint8_t*>(buf.data()) + at, back, false) == 0) {
          buf.resize(at);
        }
        break;
      }
    }
  }
  // Skip a partial sequence at the cut. Only at a cut: a log read from its first byte has
  // none, and its leading stray bytes are output (each one U+FFFD, as a chars page shows it).
  // Failure fixed (a review, session 31): a log of "\x80\x80" had an empty tail, which read
  // "(the command printed nothing)".
  size_t start = 0;
  const bool cut = static_cast<size_t>(st.st_size) > want;
  while (cut && start < buf.size() && start < 3 &&
         (static_cast<uint8_t>(buf[start]) & 0xC0) == 0x80) {
    ++start;
  }
  std::string clean;
  append_utf8_sanitized(std::string_view(buf).substr(start), clean);
  // Keep the last max_chars code points.
  size_t count = 0;
  size_t pos = clean.size();
  while (pos > 0 && count < max_chars) {
    --pos;
    if ((static_cast<uint8_t>(clean[pos]) & 0xC0) != 0x80) {
      ++count;
    }
  }
  return clean.substr(pos);
}

// A log's checkpoint index with its own lock. Shared (not owned by the Job) so a page can be
// read outside the engine's lock while the job settles, or is evicted from the settled cache
// and reloaded from disk under a new Job.
struct SharedIndex {
  std::mutex mu;
  engine::LogIndex index;
  std::string idx_path;    // the persisted index of a job's log; empty for other files
  bool idx_tried = false;  // loaded (or found unusable) once: never read again
};

// `<dir>/stdout.log` → `<dir>/stdout.idx`.
std::string idx_path_for(const std::string& log_path) {
  return log_path.substr(0, log_path.size() - 4) + ".idx";
}

// The persisted index of a log of `log_size` bytes, fully validated (LogIndex::deserialize);
// an Error when it is missing, too big to be one, or does not fit the log.
Result<engine::LogIndex> load_index(const std::string& path, uint64_t log_size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) {
    return sys_error("open `{}`", path);
  }
  CORDON_TRY(st, sys::fstat_fd(fd.get()));
  // What serialize() writes for this log, at most: refuses to read a huge file.
  const uint64_t max = (log_size / engine::kDefaultCheckpointInterval + 2) * 32 + 256;
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > max) {
    return invalid("`{}` is not an index of a {}-byte log", path, log_size);
  }
  std::string record(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < record.size()) {
    ssize_t n =
        ::pread(fd.get(), record.data() + done, record.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return sys_error("pread `{}`", path);
    }
    if (n == 0) {
      return invalid("`{}` shrank while read", path);
    }
    done += static_cast<size_t>(n);
  }
  CORDON_TRY_CTX(index, engine::LogIndex::deserialize(record, log_size), "load `{}`", path);
  return index;
}

struct Stream {
  std::string path;
  UniqueFd pipe;  // read end (stdout/stderr) or -1
  UniqueFd file;  // the log, open for writing while the job runs
  uint64_t written = 0;
  uint64_t lost = 0;
  // Fed by the event loop after each write, hashed by the engine's HashWorker.
  std::shared_ptr<engine::HashWorker::Digest> digest =
      std::make_shared<engine::HashWorker::Digest>();
  bool eof = false;
  bool pipe_grown = false;  // sandbox::grow_output_pipe
  std::shared_ptr<SharedIndex> index = std::make_shared<SharedIndex>();
};

enum class WatchKind { kPidfd, kStatus, kStdout, kStderr, kPty, kStdin };

struct Job;
// What an epoll event refers to. Events carry a watch id, never a pointer: an event already
// returned by epoll_wait for a job that settles earlier in the same batch (or whose Job was
// freed since) finds no entry and is skipped instead of touching freed memory.
struct Watch {
  Job* job;
  WatchKind kind;
};
constexpr uint64_t kTimerWatch = 1, kWakeWatch = 2, kFirstJobWatch = 16;
// Spawner i's pidfd (Impl::spawners[i]) is watched as kFirstSpawnerWatch + i.
constexpr uint64_t kFirstSpawnerWatch = 3;
static_assert(kFirstSpawnerWatch + kSpawners <= kFirstJobWatch);

struct Job {
  // Persisted.
  std::string id, session, label;
  std::vector<std::string> argv;
  std::string cwd, state = "queued";
  std::optional<int> exit_code;
  std::optional<std::string> signal;
  std::string started_at, ended_at;
  uint64_t duration_ms = 0;
  bool pty = false;
  std::string error;
  Usage usage;
  bool read = false;
  std::optional<ArtifactRef> out_art, err_art;
  uint64_t out_bytes = 0, err_bytes = 0;

  // Runtime (running jobs only).
  std::string dir;
  Clock::time_point start_tp;
  std::optional<policy::CheckedStart> checked;  // kept while queued
  StdinMode stdin_mode = StdinMode::kNull;
  uint16_t cols = 120, rows = 30;
  UniqueFd pidfd, status, stdin_w, pty_master;
  // The sandbox's mount namespace, held from the attach until the settle (hold_mount_ns()).
  UniqueFd mount_ns;
  Stream out, err;
  // Declared before the cgroup, so a Job destroyed whole (an engine closing) empties and
  // removes its cgroup before its host uid can be leased again.
  std::optional<sandbox::HostIdLease> lease;
  std::optional<sandbox::JobCgroup> cgroup;
  sandbox::RecordLock record;
  std::optional<Clock::time_point> deadline, kill_deadline, drain_deadline;
  uint64_t timeout_ms = 0, grace_ms = 5000, max_output = 0;
  bool timed_out = false, output_limit = false, io_failed = false, killed_by_caller = false;
  // The TCP sockets of the job's own network namespace, read twice a second from its
  // sockstat (held open from the attach to the settle) and counted against its memory limit:
  // the kernel charges a connection to a memory cgroup only when accept() takes it.
  engine::Sockstat sockstat;
  std::optional<Clock::time_point> socket_deadline;
  uint64_t memory_limit = 0, sockets_seen = 0;
  bool socket_limit = false;
  int caller_signal = 0;  // the first signal a caller sent, for the settled message
  bool git = false;       // started for the git tools (has_slot)
  std::string owner;      // EngineOptions::session_owner of its session (concurrency.perUid)
  std::string io_what;    // the failed write and its errno, for the settled error
  bool init_exited = false, have_exit = false, stdin_eof_pending = false;
  // init reported the command's exit with nothing else left in the sandbox (kExitedAlone):
  // the job settles once its output and status channel end, without waiting for init's exit
  // (only while the engine holds the sandbox's mount namespace: early_settle()).
  bool exited_alone = false;
  bool command_started = false;  // init reported the command exec'd: its handlers are in place
  int pending_signal = 0;        // a kill that arrived before that
  // Running jobs are spawned by a starter thread after start() returned (launch()): until
  // attach() the job has no sandbox, pidfd or pipes, and a kill is kept for it here.
  bool attached = false;
  int kill_on_attach = 0;
  int wait_status = 0;
  sandbox::SetupStep setup_step = sandbox::SetupStep::kNone;
  int setup_errno = 0;
  // Input not yet written to the command, from pending_off on (kept whole until written or
  // refused: a write that would make more than kMaxPendingStdin wait is turned away).
  std::string pending_stdin;
  size_t pending_off = 0;
  uint64_t stdin_watch = 0;  // the pipe's EPOLLOUT watch while input waits, else 0
  uint64_t pty_watch = 0;    // the pty master's watch (EPOLLIN, plus EPOLLOUT while input waits)
  bool pty_out_armed = false;
  std::string stdin_closed;  // why input can no longer be delivered (the command closed it)
  size_t line_len = 0;       // a pty in canonical mode: bytes of the line typed so far
  bool line_lnext = false;   // … and the last byte sent was VLNEXT: the next one is literal
  engine::ModeTracker modes;
  std::vector<uint64_t> watch_ids;  // keys into Impl::watches, dropped when the job settles

  // Set while the settle's record is not on disk (it failed: a full disk, no inode left):
  // what the caller is told besides `error` (status_of()), never written into the record. The
  // job stays in memory (Impl::pinned) until a write of its record succeeds (every settle,
  // start and remove tries again, and the engine's close).
  std::string unrecorded;

  bool settled() const { return state != "queued" && state != "running"; }
};

json meta_json(const Job& j) {
  auto art = [](const std::optional<ArtifactRef>& a) -> json {
    if (!a) {
      return nullptr;
    }
    return {{"artifactId", a->artifact_id}, {"kind", a->kind},
            {"taskId", a->task_id},         {"stream", a->stream},
            {"sizeBytes", a->size_bytes},   {"sha256", a->sha256},
            {"preview", a->preview},        {"readBackHint", a->read_back_hint}};
  };
  json m = {{"taskId", j.id},
            {"session", j.session},
            {"label", j.label},
            {"argv", j.argv},
            {"cwd", j.cwd},
            {"state", j.state},
            {"exitCode", j.exit_code ? json(*j.exit_code) : json(nullptr)},
            {"signal", j.signal ? json(*j.signal) : json(nullptr)},
            {"startedAt", j.started_at},
            {"endedAt", j.ended_at},
            {"durationMs", j.duration_ms},
            {"pty", j.pty},
            {"error", j.error},
            {"read", j.read},
            {"stdoutBytes", j.out_bytes},
            {"stderrBytes", j.err_bytes},
            {"usage",
             {{"peakMemoryBytes", j.usage.peak_memory_bytes},
              {"cpuTimeUs", j.usage.cpu_usec},
              {"oomKills", j.usage.oom_kills},
              {"pidsLimitHits", j.usage.pids_max_hits}}},
            {"stdout", art(j.out_art)},
            {"stderr", art(j.err_art)}};
  if (j.pty) {  // the terminal's size, the last resize's
    m["cols"] = j.cols;
    m["rows"] = j.rows;
  }
  return m;
}

std::optional<ArtifactRef> art_from(const json& a) {
  namespace jf = json_fields;
  if (!a.is_object()) {
    return std::nullopt;
  }
  ArtifactRef r;
  r.artifact_id = jf::str(a, "artifactId");
  r.kind = jf::str(a, "kind", "command-output");
  r.task_id = jf::str(a, "taskId");
  r.stream = jf::str(a, "stream");
  r.size_bytes = jf::u64(a, "sizeBytes");
  r.sha256 = jf::str(a, "sha256");
  r.preview = jf::str(a, "preview");
  r.read_back_hint = jf::str(a, "readBackHint");
  return r;
}

// meta.json is read back after a restart and may be damaged or from another version: every
// field is read with its type checked (json_fields), a wrong one reads as absent.
std::unique_ptr<Job> job_from_meta(const std::string& dir, const std::string& text) {
  namespace jf = json_fields;
  json m = json::parse(text, nullptr, false);
  if (m.is_discarded() || !m.is_object()) {
    return nullptr;
  }
  auto j = std::make_unique<Job>();
  j->dir = dir;
  j->id = jf::str(m, "taskId");
  j->session = jf::str(m, "session");
  j->label = jf::str(m, "label");
  for (const auto& a : jf::array(m, "argv")) {
    if (a.is_string()) {
      j->argv.push_back(a.get<std::string>());
    }
  }
  j->cwd = jf::str(m, "cwd");
  j->state = jf::str(m, "state", "failed");
  if (const json* c = jf::find(m, "exitCode"); c != nullptr && c->is_number_integer() &&
                                               c->get<int64_t>() >= INT32_MIN &&
                                               c->get<int64_t>() <= INT32_MAX) {
    j->exit_code = static_cast<int>(c->get<int64_t>());
  }
  if (const json* s = jf::find(m, "signal"); s != nullptr && s->is_string()) {
    j->signal = s->get<std::string>();
  }
  j->started_at = jf::str(m, "startedAt");
  j->ended_at = jf::str(m, "endedAt");
  j->duration_ms = jf::u64(m, "durationMs");
  j->pty = jf::boolean(m, "pty");
  if (j->pty) {  // a record of before session 32 has none: the size every pty job had then
    auto side = [&](const char* key, uint16_t fallback) {
      uint64_t v = jf::u64(m, key, fallback);
      return terminal_side_ok(v) ? static_cast<uint16_t>(v) : fallback;
    };
    j->cols = side("cols", j->cols);
    j->rows = side("rows", j->rows);
  }
  j->error = jf::str(m, "error");
  j->read = jf::boolean(m, "read");
  j->out_bytes = jf::u64(m, "stdoutBytes");
  j->err_bytes = jf::u64(m, "stderrBytes");
  const json& u = jf::object(m, "usage");
  j->usage.peak_memory_bytes = jf::u64(u, "peakMemoryBytes");
  j->usage.cpu_usec = jf::u64(u, "cpuTimeUs");
  j->usage.oom_kills = jf::u64(u, "oomKills");
  j->usage.pids_max_hits = jf::u64(u, "pidsLimitHits");
  if (const json* o = jf::find(m, "stdout")) {
    j->out_art = art_from(*o);
  }
  if (const json* e = jf::find(m, "stderr")) {
    j->err_art = art_from(*e);
  }
  j->out.path = dir + (j->pty ? "/pty.log" : "/stdout.log");
  j->err.path = dir + "/stderr.log";
  j->out.index->idx_path = idx_path_for(j->out.path);
  j->err.index->idx_path = idx_path_for(j->err.path);
  return j;
}

}  // namespace

class Engine::Impl {
 public:
  EngineOptions opt;
  std::optional<policy::Policy> pol;
  std::vector<std::string> warnings;  // Engine::warnings(): found at open
  // The git tools' private policy (policy::git_job_policy), when the policy has a git
  // section. A separate Policy object rather than a flag on the main one: the main policy's
  // checks never see git allowed, and the git jobs never see the main allowlist, root or
  // network. The jobs live in the same registry and session as every other job, so ids,
  // counters, quotas, artifacts and retrieve_context work for them unchanged.
  std::optional<policy::Policy> git_pol;
  // One spawner per starter thread (kStarters): the spawner is single-threaded, and its part
  // of a spawn (prepare, clone3, id maps, v1 placement) was the serial step of many starts.
  // spawners[0] is also the warm pool's: its parked sandboxes are that process's children, so
  // every pooled spawn goes through it. A spawner that dies is replaced inside its client
  // (the loop watches each pidfd; a start finds it dead otherwise), so the vector and the
  // clients never change after open and are used without mu.
  std::vector<std::unique_ptr<sandbox::SpawnerClient>> spawners;
  sandbox::CgroupLayout layout;
  std::optional<sandbox::CgroupRecords> records;
  // Leases of jobs whose cgroups could not be destroyed: their sandboxes may still run as those
  // host uids, so the ids stay taken for this engine's life (as WarmPool::held_). Under
  // release_mu (tear_down()).
  std::vector<sandbox::HostIdLease> held_leases;
  std::optional<sandbox::WarmPool> pool;  // declared after what it borrows: destroyed first
  UniqueFd lock_fd, epfd, timerfd, wakefd;
  std::optional<Clock::time_point> timer_armed;  // what timerfd is set for (set_timer)
  std::thread loop;
  bool stopping = false;

  std::mutex flush_mu;  // never taken with mu held the other way round: mu, then flush_mu
  std::condition_variable flush_cv;
  bool flush_dirty = false, flush_stop = false;
  std::thread flusher;

  // The releaser: drops the mount namespaces hold_mount_ns() held, off the loop's thread (each
  // drop unmounts a sandbox's tree and waits for an RCU grace period), and tears down what a
  // settled job's sandbox leaves (tear_down_later()).
  std::mutex release_mu;  // never taken with mu held the other way round: mu, then release_mu
  std::condition_variable release_cv;
  std::vector<UniqueFd> to_release;
  // A removed job's big logs, unlinked and still open: the releaser frees their blocks a step
  // at a time (free_step()). Freed whole by the unlink, under mu, a 3 GiB log took ~0.6 s on
  // this ext4 with `discard`, and every other call of every session waited for it.
  struct Unlinked {
    UniqueFd fd;
    bool alone = false;  // no other descriptor of this process reads it (alone_here())
  };
  std::deque<Unlinked> to_free;
  // A settled job's cgroups (emptied and removed), their record and its host-id lease. The
  // lease is declared first, so one dropped whole removes the cgroups before the id is free.
  struct Teardown {
    std::optional<sandbox::HostIdLease> lease;
    std::optional<sandbox::JobCgroup> cgroup;
    sandbox::RecordLock record;
  };
  std::vector<Teardown> to_tear_down;
  uint64_t teardowns_queued = 0, teardowns_done = 0;  // counts since open
  std::condition_variable teardown_cv;                // teardowns_done grew
  bool release_stop = false;
  // Retention left for the releaser by a settle (apply_retention()), and the job it keeps.
  bool retention_due = false;
  std::string retention_keep;
  std::thread releaser;

  std::mutex mu;
  std::condition_variable cv;
  // Wakes a holder of mu sends only once it let go of mu (run_loop(), Engine::start()): a
  // thread woken while mu is still held wakes only to block on it, and on a host whose
  // scheduler keeps a woken thread on its waker's CPU it first preempts the holder there (a
  // settle's caller, woken before the loop let go, waited for mu in 1 start of 3, ~0.6 ms;
  // docs/performance-history.md, session 24). Elsewhere they are sent at once.
  struct Wakes {
    bool settled = false;   // cv: a job settled
    size_t starters = 0;    // starter_cv: jobs handed to the starters
    bool releaser = false;  // release_cv: teardowns queued
  };
  bool defer_wakes = false;  // guarded by mu
  Wakes deferred;            // guarded by mu
  Wakes take_wakes() {
    defer_wakes = false;
    return std::exchange(deferred, Wakes{});
  }
  void send_wakes(const Wakes& w) {
    if (w.settled) {
      cv.notify_all();
    }
    if (w.starters > 1) {
      starter_cv.notify_all();
    } else if (w.starters == 1) {
      starter_cv.notify_one();
    }
    if (w.releaser) {
      release_cv.notify_one();
    }
  }
  // Sends `w` now, or once mu is let go when a holder defers them; mu held.
  void wake(const Wakes& w) {
    if (!defer_wakes) {
      send_wakes(w);
      return;
    }
    deferred.settled = deferred.settled || w.settled;
    deferred.starters += w.starters;
    deferred.releaser = deferred.releaser || w.releaser;
  }
  void notify_settled() { wake({.settled = true}); }
  // Task ids that status() or wait() calls are waiting for now, and how many calls each (mu).
  std::unordered_map<std::string, uint32_t> awaited;
  // Counts a waiting call in `awaited` for its life; mu held at both ends.
  class Awaiting {
   public:
    Awaiting(Impl& m, const std::vector<std::string>& ids) : m_(m), ids_(ids) {
      for (const auto& id : ids_) {
        ++m_.awaited[id];
      }
    }
    Awaiting(const Awaiting&) = delete;
    Awaiting& operator=(const Awaiting&) = delete;
    ~Awaiting() {
      for (const auto& id : ids_) {
        auto it = m_.awaited.find(id);
        if (it != m_.awaited.end() && --it->second == 0) {
          m_.awaited.erase(it);
        }
      }
    }

   private:
    Impl& m_;
    const std::vector<std::string>& ids_;
  };
  // Launched jobs waiting for a starter thread (launch(), starter_loop()); guarded by mu.
  std::deque<Job*> to_spawn;
  std::condition_variable starter_cv;
  bool stopping_starters = false;
  std::vector<std::thread> starters;
  std::unordered_map<std::string, std::unique_ptr<Job>> live;  // queued and running
  std::list<std::unique_ptr<Job>> cache;                       // settled, most recent first
  // Settled jobs past the cache whose settle is not recorded yet (Job::unrecorded), and the
  // ids of every job whose settle is not (cache or pinned): trim_cache(), retry_unrecorded().
  std::unordered_map<std::string, std::unique_ptr<Job>> pinned;
  std::unordered_set<std::string> unrecorded_ids;
  std::deque<Job*> queue;
  std::map<std::string, Counters> counters;
  std::map<std::string, uint64_t> running_per_session;
  std::map<std::string, uint64_t> running_per_owner;
  std::map<std::string, uint64_t> running_git_per_owner;  // the git tools' jobs among them
  std::map<std::string, uint64_t> running_git_per_session;
  uint64_t running_total = 0;

  // A job counted as running, or no longer: the engine's total, its session's, its owner's.
  void count_running(const Job& j) {
    ++running_total;
    ++running_per_session[j.session];
    ++running_per_owner[j.owner];
    if (j.git) {
      ++running_git_per_owner[j.owner];
      ++running_git_per_session[j.session];
    }
  }
  void uncount_running(const Job& j) {
    if (running_total > 0) {
      --running_total;
    }
    // A count that reaches 0 leaves its map: a daemon that serves many sessions keeps none of
    // the ones that ran nothing for a while.
    auto drop = [](std::map<std::string, uint64_t>& counts, const std::string& key) {
      auto it = counts.find(key);
      if (it != counts.end() && --it->second == 0) {
        counts.erase(it);
      }
    };
    drop(running_per_session, j.session);
    drop(running_per_owner, j.owner);
    if (j.git) {
      drop(running_git_per_owner, j.owner);
      drop(running_git_per_session, j.session);
    }
  }
  static uint64_t running_in(const std::map<std::string, uint64_t>& counts,
                             const std::string& key) {
    auto it = counts.find(key);
    return it == counts.end() ? 0 : it->second;
  }
  std::map<std::string, policy::Policy> session_policies;  // rootPerSession: root per session
  std::unordered_map<uint64_t, Watch> watches;             // epoll watch id → job and kind
  std::map<uint64_t, SettleCallback> settle_subs;          // subscribe_settled, by id
  uint64_t next_settle_sub = 1;
  uint64_t next_watch = kFirstJobWatch;
  uint64_t jobs_on_disk = 0;
  uint64_t disk_bytes = 0;  // the logs of settled jobs (running ones: their streams' written)
  // The same two per owner (EngineOptions::session_owner: a daemon's peer uid over all its
  // sessions), for quotas.maxJobsPerUid and maxDiskBytesPerUid.
  struct OwnerUse {
    uint64_t jobs = 0, bytes = 0;
  };
  std::map<std::string, OwnerUse> owner_use;
  std::string owner_of(const std::string& session) const {
    return opt.session_owner ? opt.session_owner(session) : std::string();
  }
  // A job's record and logs on disk, counted in or out (start, recovery, settle, remove).
  void count_on_disk(const std::string& session, int64_t jobs, int64_t bytes) {
    OwnerUse& u = owner_use[owner_of(session)];
    auto add = [](uint64_t& v, int64_t d) {
      v = d >= 0 ? v + static_cast<uint64_t>(d) : v - std::min(v, static_cast<uint64_t>(-d));
    };
    add(jobs_on_disk, jobs);
    add(u.jobs, jobs);
    add(disk_bytes, bytes);
    add(u.bytes, bytes);
  }
  // Settled jobs by end time (RFC 3339 UTC sorts as text), for the retention policy; kept only
  // when a retention limit is set (see track_settled).
  std::multimap<std::string, std::string> settled_by_end;
  // The loop reads output into `chunk`, writes it to the log and hands it to `hasher`, which
  // hashes it on its own thread (kHashChunks bound the bytes in flight).
  engine::HashWorker hasher{kReadBuffer, kHashChunks};
  engine::HashWorker::Chunk chunk;

  // Indexes of artifacts that are not their job's log (normally none: bank() hard-links the
  // log), most recent first, bounded so paging many such artifacts cannot grow the engine.
  struct ArtifactIndex {
    std::string id;
    dev_t dev;
    ino_t ino;
    std::shared_ptr<SharedIndex> index;
  };
  std::mutex art_mu;  // never held with mu
  std::list<ArtifactIndex> art_indexes;

  std::shared_ptr<SharedIndex> artifact_index(const std::string& id, const struct stat& st) {
    std::lock_guard<std::mutex> lock(art_mu);
    for (auto it = art_indexes.begin(); it != art_indexes.end(); ++it) {
      if (it->id == id && it->dev == st.st_dev && it->ino == st.st_ino) {
        art_indexes.splice(art_indexes.begin(), art_indexes, it);
        return it->index;
      }
    }
    art_indexes.push_front({id, st.st_dev, st.st_ino, std::make_shared<SharedIndex>()});
    while (art_indexes.size() > kArtifactIndexes) {
      art_indexes.pop_back();
    }
    return art_indexes.front().index;
  }

  std::string jobs_dir() const { return opt.state_dir + "/jobs"; }
  std::string artifacts_dir() const { return opt.state_dir + "/artifacts"; }
  std::string sessions_dir() const { return opt.state_dir + "/sessions"; }
  // A session's index of its job ids, one per line: <sessions_dir>/<session>.jobs.
  static constexpr std::string_view kIndexSuffix = ".jobs";
  static std::string session_index_name(const std::string& session) {
    return session + std::string(kIndexSuffix);
  }
  std::string session_index_path(const std::string& session) const {
    return sessions_dir() + "/" + session_index_name(session);
  }
  std::string reserve_path() const { return opt.state_dir + "/reserve"; }

  // ---- disk-full reserve --------------------------------------------------------------------
  // (Re)creates the reserve when it is missing or short; a disk too full for it is no error:
  // what is left of it stays as it was (cut back to its size, not left half-grown), and the
  // next settle tries again. True when the reserve is whole.
  bool ensure_reserve() {
    std::string path = reserve_path();
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && st.st_size >= kReserveBytes) {
      return true;
    }
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd || ::fstat(fd.get(), &st) != 0) {
      return false;
    }
    if (::posix_fallocate(fd.get(), 0, kReserveBytes) == 0) {
      return true;
    }
    // Not all of it: take back what there is, a page at a time (a settle leaves most of its
    // step unused), and cut a failed attempt back (it may have allocated part of its range).
    off_t have = st.st_size;
    (void)::ftruncate(fd.get(), have);
    while (have < kReserveBytes) {
      off_t want = std::min<off_t>(have + 4096, kReserveBytes);
      if (::posix_fallocate(fd.get(), 0, want) != 0) {
        (void)::ftruncate(fd.get(), have);
        break;
      }
      have = want;
    }
    if (have == 0) {
      ::unlink(path.c_str());
    }
    return have >= kReserveBytes;
  }

  // atomic_write(), and when the disk is full, once more after freeing a step of the
  // reserve: a job must settle (and its meta reach disk) even when its own output filled the
  // disk. `use_reserve` false: a write that may fail on a full disk (the `read` mark) leaves
  // the reserve to settles.
  Result<void> write_meta(const std::string& dir, const std::string& name, const std::string& text,
                          bool use_reserve = true) {
    auto r = atomic_write(dir, name, text, strict_sync());
    if (r || !use_reserve || !disk_full(r.error().sys_errno())) {
      mark_dirty();
      return r;
    }
    if (take_reserve_step()) {
      mark_dirty();
      auto again = atomic_write(dir, name, text, strict_sync());
      if (again || !disk_full(again.error().sys_errno())) {
        return again;
      }
    }
    // Still full: no inode is left for the temporary record (freed bytes give none back). The
    // reserve's own inode becomes it. Failure fixed (a review, session 31): on a state dir out
    // of inodes no settle's record could be written, whatever the reserve held.
    if (auto last = write_in_reserve(dir, name, text)) {
      mark_dirty();
      return last;
    }
    return r;
  }

  static bool disk_full(int err) { return err == ENOSPC || err == EDQUOT; }

  // atomic_write() into the reserve file, renamed to the temporary record first (the same
  // filesystem): atomic_write's open then finds the file there and needs no new inode. The
  // reserve is gone afterwards; ensure_reserve() makes it again when there is room. An error
  // when there is no reserve or a step fails (the temporary is then removed).
  Result<void> write_in_reserve(const std::string& dir, const std::string& name,
                                const std::string& text) {
    const std::string tmp = dir + "/." + name + ".tmp";
    struct stat st {};
    if (::lstat(reserve_path().c_str(), &st) != 0) {
      return sys_error("lstat `{}`", reserve_path());
    }
    if (!S_ISREG(st.st_mode)) {  // renamed, a directory would stay behind in the job's
      return errno_error(EINVAL, "the reserve `{}` is no regular file", reserve_path());
    }
    if (::rename(reserve_path().c_str(), tmp.c_str()) != 0) {
      return sys_error("rename `{}` to `{}`", reserve_path(), tmp);
    }
    auto written = atomic_write(dir, name, text, strict_sync());
    if (!written) {
      ::unlink(tmp.c_str());  // gone already when the write or its fsync failed
    }
    return written;
  }

  // The job's record, meta.json. Every write of it comes here, so each is encoded the one way
  // that never throws (json_fields::dump: bytes that are not UTF-8 become U+FFFD).
  Result<void> write_job_meta(Job& j, bool use_reserve = true) {
    auto r = write_meta(j.dir, "meta.json", json_fields::dump(meta_json(j)), use_reserve);
    if (r && !j.unrecorded.empty()) {
      j.unrecorded.clear();
      unrecorded_ids.erase(j.id);
    }
    return r;
  }

  // Writes again the records of settles that could not be written (no effect when there are
  // none). Jobs whose record is on disk now leave `pinned` at the next trim.
  void retry_unrecorded() {
    if (unrecorded_ids.empty()) {
      return;
    }
    std::vector<std::string> ids(unrecorded_ids.begin(), unrecorded_ids.end());
    for (const auto& id : ids) {
      Job* j = in_memory(id);
      if (j == nullptr || j->unrecorded.empty()) {
        unrecorded_ids.erase(id);
        continue;
      }
      auto w = write_job_meta(*j);
      if (w) {
        continue;
      }
      if (disk_full(w.error().sys_errno())) {
        return;  // the disk is still full: the rest would fail alike
      }
      // Another cause (its directory deleted, EIO): no retry will do; it is said in its error
      // and no longer tried. Failure fixed (the review of this change, session 31): it stopped
      // every retry before the others.
      j->error += (j->error.empty() ? "" : "; ") + j->unrecorded;
      j->unrecorded.clear();
      unrecorded_ids.erase(id);
    }
  }

  // A settled job held in memory (the cache, or pinned), without reading any record.
  Job* in_memory(const std::string& id) {
    for (auto& j : cache) {
      if (j->id == id) {
        return j.get();
      }
    }
    auto it = pinned.find(id);
    return it == pinned.end() ? nullptr : it->second.get();
  }

  // Trims the settled cache to its size. A job whose settle is not recorded is kept (pinned)
  // instead: dropped, its record on disk would read `running` and be taken for a dead engine's
  // job (abandoned) while this engine still knows its end. Failure fixed (a review, session
  // 31): on a state dir out of inodes, its exit code was lost once 256 other jobs settled.
  void trim_cache() {
    while (cache.size() > opt.settled_cache) {
      std::unique_ptr<Job> last = std::move(cache.back());
      cache.pop_back();
      if (!last->unrecorded.empty()) {
        std::string id = last->id;
        pinned[id] = std::move(last);
      }
    }
    std::erase_if(pinned, [](const auto& p) { return p.second->unrecorded.empty(); });
  }

  // Frees kReserveStep of the reserve (the last step removes the file). False when there is
  // no reserve left.
  bool take_reserve_step() {
    std::string path = reserve_path();
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) {
      return false;
    }
    if (st.st_size <= kReserveStep) {
      return ::unlink(path.c_str()) == 0;
    }
    return ::ftruncate(fd.get(), st.st_size - kReserveStep) == 0;
  }

  // ---- durability ---------------------------------------------------------------------------
  bool strict_sync() const { return opt.sync_interval_ms == 0; }

  // Something in the state dir changed: the flusher syncs it within sync_interval_ms.
  void mark_dirty() {
    if (strict_sync()) {
      return;
    }
    bool was_dirty;
    {
      std::lock_guard<std::mutex> lock(flush_mu);
      was_dirty = flush_dirty;
      flush_dirty = true;
    }
    // Dirty already: the flusher has been told and syncs at its interval's end. Waking it
    // again only made it check and sleep, two wakes of the other CPU in every settle.
    if (!was_dirty) {
      flush_cv.notify_one();
    }
  }

  // The flusher: one syncfs() of the state dir's filesystem per interval with changes, never
  // under the engine's lock, so no job waits for the disk.
  void flush_loop() {
    std::unique_lock<std::mutex> lock(flush_mu);
    for (;;) {
      flush_cv.wait(lock, [this] { return flush_dirty || flush_stop; });
      if (flush_stop && !flush_dirty) {
        return;
      }
      if (!flush_stop) {
        flush_cv.wait_for(lock, std::chrono::milliseconds(opt.sync_interval_ms),
                          [this] { return flush_stop; });
      }
      flush_dirty = false;
      lock.unlock();
      ::syncfs(lock_fd.get());
      lock.lock();
    }
  }

  // `wake` false: the caller wakes the releaser itself (wake_releaser()) once its own work is
  // done, as a settle does after it told the end: the releaser's work would otherwise share
  // the CPUs with the rest of the settle.
  void release_later(UniqueFd fd, bool wake = true) {
    if (!fd) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(release_mu);
      to_release.push_back(std::move(fd));
    }
    if (wake) {
      release_cv.notify_one();
    }
  }
  void wake_releaser() { wake({.releaser = true}); }  // mu held

  // The releaser holds each log it frees open until the last step, all of them in turn: at
  // most a sixteenth of the open-file limit at once (16 to 1024), so an end_session of many
  // big logs does not take the descriptors starts, settles and pages need (a review, session
  // 39). A log past the bound is freed whole by its unlink, under the lock. mu held.
  size_t freeing_max() const {
    struct rlimit nofile {};
    const rlim_t soft = ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 ? nofile.rlim_cur : 1024;
    return std::clamp<size_t>(soft == RLIM_INFINITY ? 1024 : soft / 16, 16, 1024);
  }
  bool room_to_free_later(size_t adding) {
    std::lock_guard<std::mutex> lock(release_mu);
    return to_free.size() + adding < freeing_max();
  }

  // Hands the releaser the unlinked logs no other name holds (an artifact a caller linked
  // elsewhere keeps its bytes whole): it frees them a step at a time. mu held.
  void free_later(std::vector<UniqueFd> fds) {
    std::erase_if(fds, [](const UniqueFd& fd) {
      struct stat st {};
      return ::fstat(fd.get(), &st) != 0 || st.st_nlink != 0;
    });
    if (fds.empty()) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(release_mu);
      if (release_stop) {
        return;  // closing: freed whole as they close here
      }
      for (auto& fd : fds) {
        to_free.push_back({.fd = std::move(fd)});
      }
    }
    wake_releaser();
  }

  // After a settle: the job settles once its init exited, and with it every process of its pid
  // namespace (the kernel reaps them all before it reports init's exit), and settle() read
  // the usage and recorded and announced the end. Emptying and removing four cgroups, their
  // record and the lease (~0.3–0.5 ms: spawn_bench --compare-host) no longer delay every
  // settle on the loop's thread.
  void tear_down_later(Teardown t, bool wake = true) {
    {
      std::lock_guard<std::mutex> lock(release_mu);
      if (!release_stop) {
        to_tear_down.push_back(std::move(t));
        ++teardowns_queued;
        if (wake) {
          release_cv.notify_one();
        }
        return;
      }
    }
    tear_down(t);  // the releaser is stopping (the engine closes): here, now
  }

  // Waits, at most `limit`, until every teardown queued before the call is done: a start that
  // found every host id taken may get the id of a job that settled a moment ago. Without mu.
  void wait_teardowns(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(release_mu);
    const uint64_t target = teardowns_queued;
    teardown_cv.wait_for(lock, limit, [&] { return teardowns_done >= target; });
  }

  // On the releaser, or on the closing engine's thread once the releaser stops.
  void tear_down(Teardown& t) {
    bool destroyed = !t.cgroup || t.cgroup->destroy().has_value();
    t.cgroup.reset();
    if (destroyed) {
      (void)t.record.remove();
    } else {
      // Left for the sweep: the record names the cgroups, and its lock goes with this.
      t.record = sandbox::RecordLock();
      if (t.lease) {
        std::lock_guard<std::mutex> lock(release_mu);
        held_leases.push_back(std::move(*t.lease));  // its sandbox may still run as that id
      }
    }
    t.lease.reset();
  }

  // Teardowns first, each batch as it comes: they give host ids back, which starts may be
  // waiting for. The mount namespaces are dropped one at a time in between (each drop waits
  // for an RCU grace period; a kill-all queues a thousand).
  void release_loop() {
    std::unique_lock<std::mutex> lock(release_mu);
    for (;;) {
      release_cv.wait(lock, [this] {
        return !to_release.empty() || !to_tear_down.empty() || !to_free.empty() || retention_due ||
               release_stop;
      });
      if (!to_tear_down.empty()) {
        std::vector<Teardown> teardowns;
        teardowns.swap(to_tear_down);
        lock.unlock();
        for (Teardown& t : teardowns) {
          tear_down(t);
        }
        const size_t done = teardowns.size();
        teardowns.clear();
        lock.lock();
        teardowns_done += done;
        teardown_cv.notify_all();
        if (pool && !release_stop) {
          // The jobs' own work is done and their ids are free (a waiting start was told
          // first): a sandbox build takes a core and the spawner. Not while closing.
          lock.unlock();
          pool->refill_later();
          lock.lock();
        }
        continue;
      }
      if (!to_release.empty()) {
        UniqueFd fd = std::move(to_release.back());
        to_release.pop_back();
        lock.unlock();
        fd.reset();  // unmounts a tree nothing else holds
        lock.lock();
        continue;
      }
      if (!to_free.empty()) {
        if (release_stop) {
          to_free.clear();  // closing: each goes whole, here
          continue;
        }
        Unlinked u = std::move(to_free.front());
        to_free.pop_front();
        lock.unlock();
        // A page being read from it (output and retrieve read without mu, from a descriptor
        // opened before the remove) keeps every byte: the file is then freed whole by its
        // last close, off mu, as before. Unlinked, it gets no new reader after the check.
        u.alone = u.alone || alone_here(u.fd.get());
        const bool more = u.alone && free_step(u.fd.get());
        if (more) {
          // Lets the journal commit what the step freed (and discard it) before the next.
          std::this_thread::sleep_for(kFreePause);
        } else {
          u.fd.reset();
          std::lock_guard<std::mutex> engine_lock(mu);
          ensure_reserve();  // the space just freed may refill the reserve a full disk took
        }
        lock.lock();
        if (more) {
          to_free.push_back(std::move(u));  // in turn with the other logs, teardowns first
        }
        continue;
      }
      if (retention_due && !release_stop) {
        // A chunk at a time, teardowns between (starts may wait for their host ids), and the
        // lock let go for a moment after each: a mutex is not fair, and taken again at once a
        // waiting call seldom got it between two chunks (a start waited 0.7 s behind 5000
        // expired jobs). Closing stops it: the next engine's first settle goes on.
        retention_due = false;
        lock.unlock();
        const bool more = retention_chunk();
        if (more) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        lock.lock();
        retention_due = retention_due || more;
        continue;
      }
      return;  // stopping, and nothing left
    }
  }

  // ---- lookup -------------------------------------------------------------------------------
  Job* find(const std::string& id) {
    if (auto it = live.find(id); it != live.end()) {
      return it->second.get();
    }
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      if ((*it)->id == id) {
        cache.splice(cache.begin(), cache, it);
        return cache.front().get();
      }
    }
    if (auto it = pinned.find(id); it != pinned.end()) {
      cache.push_front(std::move(it->second));  // in hand now: kept as a cached job is
      pinned.erase(it);
      trim_cache();
      return cache.front().get();
    }
    if (!valid_name(id)) {
      return nullptr;
    }
    std::string dir = jobs_dir() + "/" + id;
    auto text = read_small_file(dir + "/meta.json");
    if (!text) {
      return nullptr;
    }
    auto job = job_from_meta(dir, *text);
    if (!job || job->id != id) {
      return nullptr;
    }
    if (!job->settled()) {
      // Not ours (every job this engine runs is in `live`): a dead engine's job whose
      // abandonment, or a settle of ours, could not be written on a full disk. Say the truth
      // we know now and try to write it again.
      (void)abandon(*job);
    }
    cache.push_front(std::move(job));
    trim_cache();
    return cache.front().get();
  }

  // The sessions with a job index, from the names in the sessions dir (none when it is not
  // there).
  Result<std::vector<std::string>> session_names() const {
    const std::string dir = sessions_dir();
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT) {
        return std::vector<std::string>{};
      }
      return sys_error("opendir `{}`", dir);
    }
    std::vector<std::string> out;
    errno = 0;
    for (struct dirent* e; (e = ::readdir(d)) != nullptr; errno = 0) {
      std::string_view name(e->d_name);
      if (name.size() > kIndexSuffix.size() && name.ends_with(kIndexSuffix) && name[0] != '.') {
        out.emplace_back(name.substr(0, name.size() - kIndexSuffix.size()));
      }
    }
    int err = errno;
    ::closedir(d);
    if (err != 0) {
      return std::unexpected(Error::sys(err, fmt::format("readdir `{}`", dir)));
    }
    return out;
  }

  // The session's index of job ids; nullopt (errno set) when it is there and could not be
  // read (no index is no ids). The engine writes it and maxJobs bounds it: no size cap (30
  // bytes a job, 64 MiB at 2.2 million).
  std::optional<std::vector<std::string>> read_session_ids(const std::string& session) {
    std::vector<std::string> out;
    auto text = read_small_file(session_index_path(session), std::numeric_limits<size_t>::max());
    if (!text) {
      if (errno == ENOENT) {
        return out;
      }
      return std::nullopt;
    }
    for (auto& line : split(*text, '\n')) {
      if (!line.empty()) {
        out.push_back(line);
      }
    }
    return out;
  }
  // The same, an unreadable index an error that names it (never an empty session).
  Result<std::vector<std::string>> session_ids(const std::string& session) {
    CORDON_CHECK(check_session_name(session));  // it names the index file
    auto ids = read_session_ids(session);
    if (!ids) {
      return sys_error("read the session's job index `{}`", session_index_path(session));
    }
    return std::move(*ids);
  }

  // Appends a new job's id to its session's index. A failed or short write is undone (the
  // index cut back to its size before), so no half id is left to merge with the next one.
  // An index whose last line has no newline (cut at a line's end, or edited by hand) gets one
  // first. Failure fixed (a review, session 31): the id was glued to that last one, and both
  // jobs were gone from every list until the next open.
  Result<void> append_session_index(const std::string& session, const std::string& id) {
    const std::string idx = session_index_path(session);
    UniqueFd fd(::open(idx.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!fd) {
      return sys_error("open `{}`", idx);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      return sys_error("fstat `{}`", idx);
    }
    char last = '\n';
    if (st.st_size > 0 && ::pread(fd.get(), &last, 1, st.st_size - 1) != 1) {
      return sys_error("read `{}`", idx);
    }
    const std::string line = (last == '\n' ? "" : "\n") + id + "\n";
    size_t done = 0;
    while (done < line.size()) {
      ssize_t n = ::write(fd.get(), line.data() + done, line.size() - done);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n == 0 || errno != EINTR) {
        if (n == 0) {
          errno = ENOSPC;
        }
        break;
      }
    }
    if (done == line.size() && (!strict_sync() || ::fsync(fd.get()) == 0)) {
      mark_dirty();
      return {};
    }
    int err = errno;
    const char* what = done == line.size() ? "fsync" : "write";
    if (::ftruncate(fd.get(), st.st_size) != 0) {
      return sys_error("{} `{}` failed ({}), and ftruncate could not take the partial line back",
                       what, idx, errno_name(err));
    }
    errno = err;
    return sys_error("{} `{}`", what, idx);
  }

  Result<Job*> owned(const std::string& session, const std::string& id) {
    Job* j = find(id);
    if (j == nullptr || j->session != session) {
      auto listed = session_ids(session);
      if (!listed) {
        return std::unexpected(
            Error(ErrorCode::kNotFound, 0,
                  fmt::format("unknown taskId `{}` (this session's tasks cannot be listed now: {})",
                              id, listed.error().message())));
      }
      auto& ids = *listed;
      const bool in_index = j == nullptr && std::find(ids.begin(), ids.end(), id) != ids.end();
      if (in_index && job_dir_gone(id)) {
        return std::unexpected(
            Error(ErrorCode::kNotFound, 0,
                  fmt::format("task `{}` was removed (its record and output are gone)", id)));
      }
      if (in_index) {
        // Failure fixed (a review, session 31): called unknown while the list that followed
        // named it.
        return std::unexpected(Error(
            ErrorCode::kNotFound, 0,
            fmt::format("task `{}` is listed in this session, but its record `{}/meta.json` "
                        "cannot be read (damaged, or not a regular file); its logs are in that "
                        "directory",
                        id, jobs_dir() + "/" + id)));
      }
      if (ids.empty()) {
        return std::unexpected(Error(ErrorCode::kNotFound, 0,
                                     fmt::format("unknown taskId `{}`: this session has started "
                                                 "no commands yet; start one with run_command_bg",
                                                 id)));
      }
      if (ids.size() > 20) {
        ids.erase(ids.begin(), ids.end() - 20);
      }
      return std::unexpected(Error(
          ErrorCode::kNotFound, 0,
          fmt::format("unknown taskId `{}`; this session's tasks: {}", id, fmt::join(ids, ", "))));
    }
    return j;
  }

  // The policy a session's starts are checked against: with rootPerSession, a copy whose
  // working root is cwdRoot/<session>, created on first use (owned like cwdRoot) and opened
  // beneath cwdRoot without following symlinks.
  Result<const policy::Policy*> policy_for(const std::string& session) {
    if (!pol) {
      return nullptr;
    }
    if (!pol->root_per_session) {
      return &*pol;
    }
    if (auto it = session_policies.find(session); it != session_policies.end()) {
      return &it->second;
    }
    int rootfd = pol->root_fd->get();
    if (::mkdirat(rootfd, session.c_str(), 0755) == 0) {
      struct stat st {};
      if (::fstat(rootfd, &st) == 0) {
        (void)::fchownat(rootfd, session.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
      }
    } else if (errno != EEXIST) {
      return sys_error("mkdir `{}/{}`", pol->root, session);
    }
    CORDON_TRY_CTX(fd,
                   sys::openat2_fd(rootfd, session, O_PATH | O_DIRECTORY,
                                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS),
                   "open the session's working root");
    policy::Policy copy = *pol;
    copy.root = pol->root + "/" + session;
    copy.cwd_root = pol->cwd_root + "/" + session;  // relative cwds and refusals name it
    copy.root_fd = std::make_shared<const UniqueFd>(std::move(fd));
    auto [it, inserted] = session_policies.emplace(session, std::move(copy));
    return &it->second;
  }

  // ---- remove and retention -----------------------------------------------------------------
  // Deletes a settled job's logs, artifacts, record and index entry. `j` is gone afterwards.
  Result<void> remove_settled(Job& j) {
    const std::string task_id = j.id, session = j.session;
    auto files = remove_settled_files(j);
    auto dropped = drop_from_session_index(session, {task_id});
    CORDON_CHECK(files);
    return dropped;
  }

  // An index line that names no job directory (gone, or no job's name at all): nothing of it
  // is left to delete. A directory that is there and whose record could not be read (EMFILE)
  // is not gone.
  bool job_dir_gone(const std::string& id) const {
    struct stat st {};
    return !valid_name(id) ||
           (::lstat((jobs_dir() + "/" + id).c_str(), &st) != 0 && errno == ENOENT);
  }

  // The same for every settled job of a session, its index rewritten once: a session of N
  // jobs removed one by one read and rewrote the index N times (and synced it N times).
  // Running and queued jobs stay. `lock` (holding mu) is let go every kRemoveChunk jobs, so a
  // session of thousands does not stall the event loop and every other call for the whole
  // batch (a review, session 14). The count removed, or the first error (what was removed
  // before it stays removed, and the index still drops it).
  static constexpr size_t kRemoveChunk = 64;
  Result<size_t> remove_settled_session(const std::string& session,
                                        std::unique_lock<std::mutex>& lock) {
    CORDON_TRY(ids, session_ids(session));
    std::unordered_set<std::string> gone;
    std::optional<Error> first;
    size_t done = 0;
    for (const auto& id : ids) {
      if (++done % kRemoveChunk == 0) {
        lock.unlock();
        // For a moment: taken again at once, a waiting call seldom got it (run_retention()).
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
      }
      Job* j = find(id);
      if (j == nullptr) {
        // Listed with no record (a crash between the two deletions): nothing to delete but
        // the line. A record that is there and could not be read (EMFILE) keeps its line.
        if (job_dir_gone(id)) {
          gone.insert(id);
        }
        continue;
      }
      if (j->session != session || !j->settled()) {
        continue;
      }
      auto r = remove_settled_files(*j);
      gone.insert(id);
      if (!r && !first) {
        first = std::move(r.error());
      }
    }
    auto dropped = drop_from_session_index(session, gone);
    if (first) {
      return std::unexpected(std::move(*first));
    }
    CORDON_CHECK(dropped);
    return gone.size();
  }

  // Frees the last kFreeStep of an unlinked file's blocks; true while some are left.
  static constexpr off_t kFreeStep = off_t{64} << 20;
  static constexpr auto kFreePause = std::chrono::milliseconds(5);
  static bool free_step(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size == 0) {
      return false;
    }
    const off_t to = st.st_size > kFreeStep ? st.st_size - kFreeStep : 0;
    return ::ftruncate(fd, to) == 0 && to > 0;  // a failure leaves the rest to the close
  }

  // The `mnt_id:` and `ino:` lines that open /proc/self/fdinfo/<name> (they come before any
  // longer part, such as an epoll's targets), or "" when the kernel gives no `ino:` (before
  // 5.14) or the descriptor is gone. Read from fdinfo, not by stat of /proc/self/fd/<n>: that
  // follows the descriptor and asks its file system (a dead FUSE or NFS mount hangs it).
  static std::string fdinfo_file(int dirfd, const char* name) {
    UniqueFd f(::openat(dirfd, name, O_RDONLY | O_CLOEXEC));
    char buf[256];
    const ssize_t n = f ? ::read(f.get(), buf, sizeof buf) : -1;
    if (n <= 0) {
      return {};
    }
    const std::string_view text(buf, static_cast<size_t>(n));
    const size_t mnt = text.find("\nmnt_id:"), ino = text.find("\nino:");
    if (mnt == std::string_view::npos || ino == std::string_view::npos) {
      return {};
    }
    const size_t ino_end = text.find('\n', ino + 1);
    if (ino_end == std::string_view::npos) {
      return {};  // cut short by the buffer
    }
    return std::string(text.substr(mnt, text.find('\n', mnt + 1) - mnt)) +
           std::string(text.substr(ino, ino_end - ino));
  }

  // True when `fd` is the only descriptor of this process open on its file; false when
  // another is, or when that cannot be told (no /proc, a kernel without fdinfo's `ino:`).
  static bool alone_here(int fd) {
    UniqueFd dir(::open("/proc/self/fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) {
      return false;
    }
    const std::string self = std::to_string(fd);
    const std::string mine = fdinfo_file(dir.get(), self.c_str());
    if (mine.empty()) {
      return false;
    }
    const int listed = ::fcntl(dir.get(), F_DUPFD_CLOEXEC, 0);
    DIR* d = listed < 0 ? nullptr : ::fdopendir(listed);
    if (d == nullptr) {
      if (listed >= 0) {
        ::close(listed);
      }
      return false;
    }
    ScopeExit close_dir([d] { ::closedir(d); });
    const std::string listing = std::to_string(::dirfd(d)), info = std::to_string(dir.get());
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.' || self == e->d_name || listing == e->d_name || info == e->d_name) {
        continue;
      }
      if (fdinfo_file(dir.get(), e->d_name) == mine) {
        return false;
      }
    }
    return true;
  }

  // A job file over kFreeStep, opened before its unlink: once no name is left it goes to the
  // releaser, which frees it in steps. Files no larger are freed by their unlink, as before.
  // A settled log is read-only (0444, its artifact's mode): root's CAP_DAC_OVERRIDE opens it
  // for writing; an engine without it is refused (EACCES) and frees it whole, as before.
  static UniqueFd open_big_log(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= kFreeStep) {
      return UniqueFd();
    }
    return fd;
  }

  // Everything of a settled job but its line in the session index. `j` is gone afterwards.
  Result<void> remove_settled_files(Job& j) {
    const std::string task_id = j.id, session = j.session, dir = j.dir;
    count_on_disk(session, 0, -static_cast<int64_t>(j.out_bytes + j.err_bytes));
    std::vector<UniqueFd> big;
    for (const char* f : kLogFiles) {
      if (!room_to_free_later(big.size())) {
        break;  // the rest are freed whole by their unlink, as before
      }
      if (UniqueFd fd = open_big_log(dir + f)) {
        big.push_back(std::move(fd));
      }
    }
    // The record goes first: a crash after it leaves a directory without one, which the next
    // open deletes with its artifacts and index line (reconcile()). Artifacts first, as it
    // was, left a job that read `exited` and named an artifact that was gone (a review,
    // session 14).
    ::unlink((dir + "/meta.json").c_str());
    for (const auto& a : {j.out_art, j.err_art}) {
      if (a) {
        ::unlink((artifacts_dir() + "/" + a->artifact_id).c_str());
        ::unlink((artifacts_dir() + "/" + a->artifact_id + ".json").c_str());
      }
    }
    if (!j.read) {
      auto& c = counters[session];
      if (c.finished > 0) {
        --c.finished;
      }
    }
    forget_settled(j.ended_at, task_id);
    cache.remove_if([&](const std::unique_ptr<Job>& x) { return x->id == task_id; });
    pinned.erase(task_id);
    unrecorded_ids.erase(task_id);
    for (const char* f : kJobFiles) {
      ::unlink((dir + f).c_str());
    }
    free_later(std::move(big));
    // With its record gone the job is gone, whatever else is left in its directory (a file
    // nobody of ours wrote): it is counted out and its index line dropped either way, and the
    // directory that stays is named in the error.
    Result<void> gone{};
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
      gone = sys_error("task {} is removed, but its directory `{}` stays: rmdir", task_id, dir);
    }
    count_on_disk(session, -1, 0);
    ensure_reserve();  // the space just freed may refill the reserve a full disk took
    return gone;
  }

  // Drops removed jobs' ids from their session's index. Failure fixed: an index that could
  // not be read (EMFILE) was taken for an empty one and written back so, which dropped every
  // other job of the session from it for good.
  Result<void> drop_from_session_index(const std::string& session,
                                       const std::unordered_set<std::string>& removed) {
    if (removed.empty()) {
      return {};
    }
    auto ids = read_session_ids(session);
    if (!ids) {
      return sys_error(
          "{} removed, but the session index `{}` could not be read to drop {} (it still "
          "lists {}, which nothing shows)",
          removed.size() == 1 ? "task " + *removed.begin() + " is" : "the tasks are",
          session_index_path(session), removed.size() == 1 ? "it" : "them",
          removed.size() == 1 ? "the id" : "their ids");
    }
    std::erase_if(*ids, [&](const std::string& id) { return removed.contains(id); });
    if (ids->empty()) {
      // No index is no ids: a session's last removal leaves no file behind (one per daemon
      // connection would pile up otherwise).
      const std::string idx = session_index_path(session);
      if (::unlink(idx.c_str()) != 0 && errno != ENOENT) {
        return sys_error("the session's last task is removed; unlink its empty index `{}`", idx);
      }
      mark_dirty();
      return {};
    }
    std::string text;
    for (const auto& id : *ids) {
      text += id + "\n";
    }
    return write_meta(sessions_dir(), session_index_name(session), text);
  }

  bool retention_on() const {
    return pol && (pol->retention.max_jobs || pol->retention.max_age_seconds ||
                   pol->retention.max_disk_bytes);
  }

  // Failure fixed: every settled job had an entry here (~190 bytes: an RFC 3339 string and a
  // task id in a map node) whether or not a retention policy would ever read it, so memory grew
  // with the jobs on disk (+3.8 MB after a 20 000-job soak). Only retention reads this index.
  void track_settled(const std::string& ended_at, const std::string& id) {
    if (retention_on()) {
      settled_by_end.emplace(ended_at, id);
    }
  }

  void forget_settled(const std::string& ended_at, const std::string& id) {
    auto [lo, hi] = settled_by_end.equal_range(ended_at);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == id) {
        settled_by_end.erase(it);
        return;
      }
    }
  }

  // The optional retention policy, applied when a job settles: the oldest settled jobs go
  // while there are more than maxJobs, and any that ended more than maxAgeSeconds ago. Running
  // and queued jobs are never counted or removed, nor `keep`, the job that just settled (its
  // caller still holds it). At most `limit` go per call, each session's index rewritten once;
  // true when more are due. The settle removes a few (one, as a rule: the job over maxJobs)
  // and leaves the rest to the releaser, which takes them a chunk at a time and lets the lock
  // go between. Failure fixed (a review, session 31): every victim went in one hold of the
  // lock on the loop's thread, each rewriting its session's index, so a restart after
  // downtime with maxAgeSeconds (or a lowered maxJobs) held every call, and every start, for
  // 3–30 s with 2000–5000 jobs expired.
  static constexpr size_t kRetentionPerSettle = 4;
  bool apply_retention(const std::string& keep, size_t limit) {
    if (!retention_on()) {
      return false;
    }
    uint64_t bytes = disk_bytes;
    std::string cutoff;
    if (pol->retention.max_age_seconds) {
      struct timespec now {};
      ::clock_gettime(CLOCK_REALTIME, &now);
      cutoff = rfc3339_at(now.tv_sec - static_cast<time_t>(*pol->retention.max_age_seconds),
                          now.tv_nsec);
    }
    size_t count = settled_by_end.size();
    std::vector<std::string> victims;
    std::vector<std::pair<std::string, std::string>> gone;  // ended, id: nothing left to delete
    bool more = false;
    for (const auto& [ended, id] : settled_by_end) {
      if (id == keep) {
        continue;
      }
      bool over = pol->retention.max_jobs && count > *pol->retention.max_jobs;
      bool old = !cutoff.empty() && ended < cutoff;
      bool heavy = pol->retention.max_disk_bytes && bytes > *pol->retention.max_disk_bytes;
      if (!over && !old && !heavy) {
        break;  // ordered by end time: every later one is newer
      }
      if (victims.size() + gone.size() == limit) {
        more = true;
        break;
      }
      // One that cannot be loaded is passed over, not counted against the chunk: its
      // directory gone (deleted by hand), it is forgotten; its record unreadable (damaged,
      // EMFILE), it stays for a later pass. Failure fixed (the review of this change, session
      // 31): such entries filled every chunk, nothing behind them was removed, and the
      // releaser went on for ever.
      Job* v = find(id);
      if (v == nullptr) {
        if (job_dir_gone(id)) {
          gone.emplace_back(ended, id);
          --count;
        }
        continue;
      }
      victims.push_back(id);
      --count;
      bytes -= std::min(bytes, v->out_bytes + v->err_bytes);
    }
    for (const auto& [ended, id] : gone) {
      forget_settled(ended, id);
    }
    std::map<std::string, std::unordered_set<std::string>> removed;  // by session
    for (const auto& id : victims) {
      Job* v = find(id);
      if (v != nullptr && v->settled()) {
        std::string session = v->session;
        (void)remove_settled_files(*v);
        removed[session].insert(id);
      }
    }
    for (const auto& [session, ids] : removed) {
      (void)drop_from_session_index(session, ids);
    }
    return more;
  }

  // The releaser's part of the retention: one chunk, keeping the job that settled last. True
  // when more are due: the releaser takes its teardowns first, then the next chunk.
  bool retention_chunk() {
    std::string keep;
    {
      std::lock_guard<std::mutex> lock(release_mu);
      keep = retention_keep;
    }
    std::lock_guard<std::mutex> lock(mu);
    return apply_retention(keep, kRemoveChunk);
  }

  // ---- status -------------------------------------------------------------------------------
  JobStatus status_of(Job& j) {
    JobStatus s;
    s.task_id = j.id;
    s.session = j.session;
    s.label = j.label;
    s.argv = j.argv;
    s.cwd = j.cwd;
    s.state = j.state;
    s.exit_code = j.exit_code;
    s.signal = j.signal;
    s.started_at = j.started_at;
    s.ended_at = j.ended_at;
    s.pty = j.pty;
    if (j.pty) {
      s.cols = j.cols;
      s.rows = j.rows;
    }
    s.error = j.error;
    if (!j.unrecorded.empty()) {
      s.error += (s.error.empty() ? "" : "; ") + j.unrecorded;
    }
    s.usage = j.usage;
    s.stdout_artifact = j.out_art;
    s.stderr_artifact = j.err_art;
    if (j.settled()) {
      s.duration_ms = j.duration_ms;
      s.stdout_bytes = j.out_bytes;
      s.stderr_bytes = j.err_bytes;
    } else {
      s.duration_ms =
          j.state == "running"
              ? static_cast<uint64_t>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - j.start_tp)
                        .count())
              : 0;
      s.stdout_bytes = j.out.written;
      s.stderr_bytes = j.err.written;
    }
    const bool growing = !j.settled();
    std::string out_tail =
        s.stdout_bytes > 0
            ? file_tail(j.out.path, s.stderr_bytes > 0 ? kTailChars / 2 : kTailChars, growing)
            : "";
    std::string err_tail =
        s.stderr_bytes > 0
            ? file_tail(j.err.path, s.stdout_bytes > 0 ? kTailChars / 2 : kTailChars, growing)
            : "";
    const char* out_name = j.pty ? "[pty tail]" : "[stdout tail]";
    if (!out_tail.empty() && !err_tail.empty()) {
      s.tail_preview = fmt::format("{}\n{}\n[stderr tail]\n{}", out_name, out_tail, err_tail);
    } else if (!out_tail.empty()) {
      s.tail_preview = out_tail;
    } else if (!err_tail.empty()) {
      s.tail_preview = "[stderr tail]\n" + err_tail;
    } else {
      s.tail_preview = j.settled() ? "(the command printed nothing)" : "(no output yet)";
    }
    return s;
  }

  void mark_read(Job& j) {
    if (j.settled() && !j.read) {
      j.read = true;
      auto& c = counters[j.session];
      if (c.finished > 0) {
        --c.finished;
      }
      // Best effort: the mark only stops `finished` counting the job again after a restart.
      (void)write_job_meta(j, /*use_reserve=*/false);
    }
  }

  // ---- epoll --------------------------------------------------------------------------------
  uint64_t watch(Job& j, int fd, WatchKind kind, uint32_t events) {
    uint64_t id = next_watch++;
    watches.emplace(id, Watch{&j, kind});
    j.watch_ids.push_back(id);
    struct epoll_event ev {};
    ev.events = events;
    ev.data.u64 = id;
    ::epoll_ctl(epfd.get(), EPOLL_CTL_ADD, fd, &ev);
    return id;
  }
  void drop_watches(Job& j) {
    for (uint64_t id : j.watch_ids) {
      watches.erase(id);
    }
    j.watch_ids.clear();
  }
  void unwatch(int fd) {
    if (fd >= 0) {
      ::epoll_ctl(epfd.get(), EPOLL_CTL_DEL, fd, nullptr);
    }
  }

  // The timer is armed for the earliest deadline of any live job. A full scan of every job
  // only on the timer's own tick (on_timer, which scans them anyway); a deadline set
  // elsewhere (a timeout at attach, a grace, a drain) only moves the timer earlier: with 1000
  // jobs starting at once, a scan at every attach was O(n²) (1 % of the machine's CPU in
  // scale_bench's start phase). A deadline dropped before it is due (the job settled) leaves
  // the timer early; its tick finds nothing due and re-arms for the next one.
  void rearm_timer() {
    std::optional<Clock::time_point> next;
    for (auto& [id, j] : live) {
      for (const auto& d : {j->deadline, j->kill_deadline, j->drain_deadline, j->socket_deadline}) {
        if (d && (!next || *d < *next)) {
          next = *d;
        }
      }
    }
    set_timer(next);
  }
  void arm_for(Clock::time_point deadline) {
    if (!timer_armed || deadline < *timer_armed) {
      set_timer(deadline);
    }
  }
  void set_timer(std::optional<Clock::time_point> next) {
    timer_armed = next;
    struct itimerspec its {};
    if (next) {
      auto left = std::max<Clock::duration>(*next - Clock::now(), std::chrono::microseconds(100));
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      its.it_value.tv_sec = ns / 1000000000;
      its.it_value.tv_nsec = ns % 1000000000;
    }
    if (::timerfd_settime(timerfd.get(), 0, &its, nullptr) != 0) {
      // Only EBADF/EFAULT/EINVAL, none possible with these values. Should it ever fail,
      // nothing counts as armed, so the next deadline set tries again.
      timer_armed.reset();
    }
  }

  // ---- killing ------------------------------------------------------------------------------
  void kill_all(Job& j) {
    if (j.cgroup) {
      (void)j.cgroup->kill();
    }
    if (j.pidfd) {
      (void)sys::pidfd_send_signal(j.pidfd.get(), SIGKILL, nullptr, 0);
    }
  }
  // The SIGKILL of a job whose sandbox is alive (kill, kill_many, the end of the grace, the
  // output limit). The engine first takes a reference to the sandbox's mount namespace, so
  // the dying processes do not tear the mount tree down themselves: the last one to leave a
  // mount namespace unmounts its tree, waits in namespace_unlock() for an RCU grace period,
  // and kills its superblocks (tmpfs, proc, devpts) before its exit is seen. With hundreds
  // of sandboxes dying at once on few cores those grace periods pass from one waiting task
  // to the next, each waiting for a CPU, and every exit waits behind them (1000 sandboxes:
  // every process exited after ~390 ms holding nothing, ~200 ms, the kernel's own floor,
  // holding the namespaces; docs/performance.md, Concurrency). The settle hands the
  // reference to the releaser thread, which drops it: the same teardown, off the kill's path.
  // Nothing of the isolation changes: the namespace is only referenced, never entered, and
  // its processes are dead when it is dropped.
  void kill_sandbox(Job& j) {
    hold_mount_ns(j);
    kill_all(j);
  }
  void hold_mount_ns(Job& j) {
    if (!j.mount_ns && j.pidfd && !j.settled()) {
      // Fails before Linux 6.11 (ENOTTY) and once init has exited (ESRCH): then the processes
      // tear their tree down as they die, as they always did.
      UniqueFd fd(::ioctl(j.pidfd.get(), sys::kPidfdGetMntNamespace, 0));
      struct rlimit nofile {};
      // fds are handed out lowest first: the number tells how many are in use.
      if (fd && ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
          static_cast<rlim_t>(fd.get()) + kFdsKeptFree < nofile.rlim_cur) {
        j.mount_ns = std::move(fd);
      }
    }
  }

  // The socket checks of every job on one grid: one timer wake per tick for all of them, not
  // one per job (each wake scans every live job).
  static Clock::time_point socket_tick_after(Clock::time_point now) {
    const auto n = now.time_since_epoch() / engine::kSocketCheckEvery;
    return Clock::time_point(
        std::chrono::duration_cast<Clock::duration>((n + 1) * engine::kSocketCheckEvery));
  }

  void check_sockets(Job& j) {
    if (j.socket_limit || !j.sockstat.v4) {
      j.socket_deadline.reset();
      return;
    }
    if (engine::sockets_over_limit(j.sockstat, j.memory_limit, j.sockets_seen)) {
      // Killed at once, also within a timeout's or a caller's grace; read `oom` only when
      // nothing else ended it first (its exit, the timeout, the caller's kill).
      j.socket_limit = !j.have_exit && !j.timed_out && !j.killed_by_caller;
      j.socket_deadline.reset();
      kill_sandbox(j);
    }
  }

  void terminate(Job& j, int sig) {
    if (sig == SIGKILL || !j.pidfd) {
      kill_sandbox(j);
      return;
    }
    // PID 1 forwards the signals callers send to every process of the sandbox. Until it has
    // started the command it has no handlers, and a pid namespace's init drops signals it does
    // not handle: hold the signal until init reports the command started.
    if (!j.command_started) {
      j.pending_signal = sig;
    } else {
      (void)sys::pidfd_send_signal(j.pidfd.get(), sig, nullptr, 0);
    }
    // The first signal starts the grace; later ones (a caller asking again, the timeout, the
    // held signal replayed) never put the SIGKILL off.
    if (!j.kill_deadline) {
      j.kill_deadline = Clock::now() + std::chrono::milliseconds(j.grace_ms);
      arm_for(*j.kill_deadline);
    }
  }

  // Engine::kill for one job, under mu.
  Result<JobStatus> kill_job(Job& job, int signal) {
    Job* j = &job;
    if (j->settled()) {
      return status_of(*j);
    }
    if (!j->killed_by_caller) {
      j->caller_signal = signal;
    }
    j->killed_by_caller = true;
    // Queued, or launched and no starter took it yet: it never runs, and settles `killed`.
    bool queued = j->state == "queued";
    auto waiting = j->attached ? to_spawn.end() : std::find(to_spawn.begin(), to_spawn.end(), j);
    if (queued || waiting != to_spawn.end()) {
      if (queued) {
        queue.erase(std::remove(queue.begin(), queue.end(), j), queue.end());
        count_running(*j);  // settle() counts it down as a running job
      } else {
        to_spawn.erase(waiting);
      }
      std::string id = j->id;
      Job* s = settle_killed_unstarted(*j, signal);
      if (s == nullptr) {
        return refusal("task {} was killed before it started; its record could not be read back",
                       id);
      }
      return status_of(*s);
    }
    if (!j->attached) {
      // Being spawned: attach() sends the signal as soon as the sandbox exists.
      // A later, gentler signal never replaces a SIGKILL already asked for.
      if (j->kill_on_attach != SIGKILL) {
        j->kill_on_attach = signal;
      }
      return status_of(*j);
    }
    terminate(*j, signal);
    return status_of(*j);
  }

  // ---- output -------------------------------------------------------------------------------
  void fail_io(Job& j, const std::string& what, int err) {
    if (!j.io_failed) {
      j.io_failed = true;
      j.io_what = fmt::format("{}: {}", what, errno_name(err));
    }
    kill_all(j);
  }

  // Returns how many bytes of `data` reached the log (a prefix), which the caller hashes.
  size_t take_output(Job& j, Stream& s, const char* data, size_t n, const char* name) {
    if (j.pty) {
      j.modes.feed(std::string_view(data, n));
    }
    uint64_t room = j.max_output > s.written ? j.max_output - s.written : 0;
    size_t keep = static_cast<size_t>(std::min<uint64_t>(room, n));
    if (j.io_failed) {
      s.lost += n;
      return 0;
    }
    size_t done = 0;
    // The bytes pass through here anyway: index them now (≈ the cost of one more read of
    // them, see docs/performance.md), so the first chars or lines page of a big log, even
    // after a restart (the index is persisted when the job settles), needs no scan.
    const uint64_t at = s.written;
    ScopeExit index_written([&] {
      std::lock_guard<std::mutex> lock(s.index->mu);
      // A refused feed (a gap) leaves the index behind; a pager's extend() catches it up.
      (void)s.index->index.feed(at, std::string_view(data, done));
    });
    while (done < keep) {
      ssize_t w = ::write(s.file.get(), data + done, keep - done);
      if (w < 0) {
        if (errno == EINTR) {
          continue;
        }
        int err = errno;
        // Failure fixed: the bytes of this chunk that did reach the log (earlier partial
        // writes) were hashed but not counted, so stdoutBytes and the artifact's size fell
        // short of the file on disk when ENOSPC struck mid-chunk.
        s.written += done;
        s.lost += n - done;
        fail_io(j, fmt::format("write `{}`", s.path), err);
        return done;
      }
      done += static_cast<size_t>(w);
    }
    s.written += keep;
    if (keep < n && !j.output_limit) {
      // Exactly max_output bytes are on disk; the rest is dropped and the job ends.
      j.output_limit = true;
      j.error = fmt::format(
          "{} reached the output limit of {} bytes; the command was killed; "
          "everything up to the limit is banked",
          name, j.max_output);
      kill_sandbox(j);
    }
    return done;
  }

  enum class ReadEnd { kMore, kWouldBlock, kEof };

  // Takes what `fd` holds now, at most 16 chunks: kMore when there may be more, kEof at EOF
  // (or EIO on a pty master once every slave is closed).
  ReadEnd read_chunks(Job& j, Stream& s, int fd, const char* name) {
    for (int rounds = 0; rounds < 16; ++rounds) {
      if (!chunk) {
        chunk = hasher.take();
      }
      ssize_t n = ::read(fd, chunk.data(), chunk.capacity());
      if (n > 0) {
        if (!(&s == &j.out && j.pty)) {
          sandbox::grow_output_pipe(fd, static_cast<size_t>(n), s.pipe_grown);
        }
        size_t kept = take_output(j, s, chunk.data(), static_cast<size_t>(n), name);
        chunk = hasher.feed(s.digest, std::move(chunk), kept);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return ReadEnd::kWouldBlock;
      }
      return ReadEnd::kEof;
    }
    return ReadEnd::kMore;
  }

  static constexpr const char* kTerminalClosed =
      "the command closed its terminal (no process holds it open any more)";

  // The command can take no more input (`why`): the reason later writes are refused with, the
  // bytes still waiting counted in it as not delivered and dropped.
  void input_closed(Job& j, std::string_view why) {
    j.stdin_closed = fmt::format("{}; {} bytes of input were not delivered", why,
                                 j.pending_stdin.size() - j.pending_off);
    std::string().swap(j.pending_stdin);
    j.pending_off = 0;
  }

  void read_stream(Job& j, Stream& s, int fd, const char* name) {
    if (read_chunks(j, s, fd, name) != ReadEnd::kEof) {
      return;
    }
    s.eof = true;
    unwatch(fd);
    if (&s == &j.out && j.pty) {
      // Failure fixed (a review, session 13): the master was closed here, the first time the
      // command had no descriptor of its terminal open (`exec </dev/null >/dev/null 2>&1`),
      // which hangs the terminal up: the kernel sent SIGHUP to the command's session and the
      // job read `killed` by SIGHUP, where `cordon run --tty` let it run on; and later writes
      // were accepted into a queue nobody flushed. The master stays open until the job
      // settles (settle() reads what a command that reopened /dev/tty printed since): only its
      // watch ends. A master takes writes with no slave open, into a queue nobody reads, so
      // input is refused from here on, with what was still waiting counted as not delivered.
      j.pty_watch = 0;
      j.pty_out_armed = false;
      if (j.stdin_closed.empty()) {
        input_closed(j, kTerminalClosed);
      }
    } else {
      s.pipe.reset();
    }
    maybe_settle(j);
  }

  // Writes what input waits, as far as the command takes it now. Failure fixed (a review,
  // session 11): the pipe's EPOLLOUT watch stayed armed after the input drained, so the loop
  // spun at 100 % CPU until the job settled; a pty's waiting input was retried only when the
  // command printed something, so a program reading a paste without echoing it hung; the
  // input the command closed was dropped unreported. Now the loop watches for room exactly
  // while input waits (on the pipe, or EPOLLOUT on the pty master) and a closed input is kept
  // as a reason that the next write reports.
  void flush_stdin(Job& j) {
    int fd = j.pty ? j.pty_master.get() : j.stdin_w.get();
    if (fd < 0) {
      return;
    }
    // Failure fixed: a write to a stdin the command had closed raised SIGPIPE, which ends an
    // embedding program that keeps the default action (the test process died of it).
    sys::WriteSignalsBlock no_write_signals;
    while (j.pending_off < j.pending_stdin.size()) {
      ssize_t n = ::write(fd, j.pending_stdin.data() + j.pending_off,
                          j.pending_stdin.size() - j.pending_off);
      if (n > 0) {
        j.pending_off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && errno == EAGAIN) {
        break;
      }
      // EPIPE: the command closed its stdin; EIO: no process holds the terminal any more.
      int err = n < 0 ? errno : EIO;
      input_closed(
          j, fmt::format("{} (write: {})", j.pty ? kTerminalClosed : "the command closed its input",
                         errno_name(err)));
      if (!j.pty) {
        close_stdin(j);
      }
      break;
    }
    if (j.pending_off == j.pending_stdin.size()) {
      j.pending_stdin.clear();
      j.pending_off = 0;
    } else if (j.pending_off >= 65536 && j.pending_off * 2 >= j.pending_stdin.size()) {
      j.pending_stdin.erase(0, j.pending_off);  // amortised: each byte moves at most once more
      j.pending_off = 0;
    }
    want_stdin_room(j, !j.pending_stdin.empty());
    if (j.pending_stdin.empty() && j.stdin_eof_pending && !j.pty) {
      close_stdin(j);
    }
  }

  // Watches the command's input for room to write, or stops.
  void want_stdin_room(Job& j, bool want) {
    if (j.pty) {
      if (j.pty_master && j.pty_watch != 0 && want != j.pty_out_armed) {
        struct epoll_event ev {};
        ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
        ev.data.u64 = j.pty_watch;
        if (::epoll_ctl(epfd.get(), EPOLL_CTL_MOD, j.pty_master.get(), &ev) == 0) {
          j.pty_out_armed = want;
        }
      }
      return;
    }
    if (want && j.stdin_watch == 0 && j.stdin_w) {
      j.stdin_watch = watch(j, j.stdin_w.get(), WatchKind::kStdin, EPOLLOUT);
    } else if (!want && j.stdin_watch != 0) {
      unwatch(j.stdin_w.get());
      watches.erase(j.stdin_watch);
      std::erase(j.watch_ids, j.stdin_watch);
      j.stdin_watch = 0;
    }
  }

  void close_stdin(Job& j) {
    want_stdin_room(j, false);
    j.stdin_w.reset();
  }

  void read_status(Job& j) {
    for (;;) {
      sandbox::StatusRecord rec{};
      struct iovec iov {
        &rec, sizeof rec
      };
      alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
      struct msghdr msg {};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      ssize_t n = ::recvmsg(j.status.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
      }
      // ECONNRESET: the child exited with a go byte unread (a setup step failed during the
      // v1 placement); reported once, ahead of the records still queued: read on.
      if (n < 0 && errno == ECONNRESET) {
        continue;
      }
      std::vector<int> fds;
      for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            fds.push_back(fd);
          }
        }
      }
      if (n <= 0) {
        unwatch(j.status.get());
        j.status.reset();
        for (int fd : fds) {
          ::close(fd);
        }
        maybe_settle(j);
        return;
      }
      if (static_cast<size_t>(n) != sizeof rec) {
        for (int fd : fds) {
          ::close(fd);
        }
        continue;
      }
      switch (rec.kind) {
        case sandbox::RecordKind::kSetupError:
          if (j.setup_step == sandbox::SetupStep::kNone) {
            j.setup_step = rec.step;
            j.setup_errno = rec.err;
          }
          break;
        case sandbox::RecordKind::kCommandStarted:
          j.command_started = true;
          if (j.pending_signal != 0) {
            int sig = j.pending_signal;
            j.pending_signal = 0;
            terminate(j, sig);
          }
          break;
        case sandbox::RecordKind::kCommandExited:
          j.have_exit = true;
          j.wait_status = rec.wait_status;
          j.exited_alone = (rec.flags & sandbox::kExitedAlone) != 0;
          break;
        case sandbox::RecordKind::kPtyMaster:
          if (j.pty && !j.pty_master && !fds.empty()) {
            j.pty_master.reset(fds[0]);
            fds.erase(fds.begin());
            set_nonblock(j.pty_master.get());
            struct winsize ws {};
            ws.ws_col = j.cols;
            ws.ws_row = j.rows;
            ::ioctl(j.pty_master.get(), TIOCSWINSZ, &ws);
            j.pty_watch = watch(j, j.pty_master.get(), WatchKind::kPty, EPOLLIN);
            flush_stdin(j);
          }
          break;
        case sandbox::RecordKind::kParked:  // the spawner consumed it before the job was ours
          break;
      }
      for (int fd : fds) {
        ::close(fd);
      }
    }
  }

  // ---- settling -----------------------------------------------------------------------------
  // Whether the settle starts before init's exit (kExitedAlone), to wait for that exit at its
  // end with `mu` held. Only while the engine holds the sandbox's mount namespace: then init's
  // exit tears no mount tree down (no RCU grace period, which a burst of exits would queue
  // behind one another), and takes ~0.4 ms. Without the hold (before Linux 6.11, or near the
  // fd limit) the settle waits for init's pidfd as it always did.
  static bool early_settle(const Job& j) { return j.exited_alone && !j.init_exited && j.mount_ns; }

  void maybe_settle(Job& j) {
    if (j.settled() || !(j.init_exited || early_settle(j))) {
      return;
    }
    bool out_done = j.out.eof || (j.pty ? (!j.pty_master && !j.status) : !j.out.pipe);
    bool err_done = j.pty || j.err.eof || !j.err.pipe;
    bool drained = out_done && err_done && !j.status;
    if (!drained && !(j.drain_deadline && Clock::now() >= *j.drain_deadline)) {
      if (!j.drain_deadline) {
        j.drain_deadline = Clock::now() + kDrainAfterInit;
        arm_for(*j.drain_deadline);
      }
      return;
    }
    if (!drained) {
      note_held_open(j, out_done, err_done);
    }
    settle(j);
  }

  // The drain deadline passed and a stream has no EOF: every process of the sandbox is gone, so
  // a process outside holds its write end (the command passed it over a unix socket in its
  // root). What the pipe holds now is read; what comes later is not, and the job says so
  // rather than keep a log that only looks whole.
  void note_held_open(Job& j, bool out_done, bool err_done) {
    for (auto [s, done, fd, name] : {std::tuple{&j.out, out_done, j.out.pipe.get(), "stdout"},
                                     std::tuple{&j.err, err_done, j.err.pipe.get(), "stderr"}}) {
      if (done || fd < 0 || (s == &j.out && j.pty)) {  // a pty's output has no pipe
        continue;
      }
      for (int i = 0; i < 8 && read_chunks(j, *s, fd, name) == ReadEnd::kMore; ++i) {
      }
      j.error += fmt::format(
          "{}{} was still open {} ms after the command ended (a process outside the sandbox "
          "holds it): what was written to it later was not read",
          j.error.empty() ? "" : "; ", name, kDrainAfterInit.count());
    }
  }

  ArtifactRef bank(Job& j, Stream& s, const std::string& stream) {
    ArtifactRef a;
    a.artifact_id = "a" + j.id.substr(1) + "-" + stream;
    a.task_id = j.id;
    a.stream = stream;
    a.size_bytes = s.written;
    a.sha256 = Sha256::hex(hasher.finish(*s.digest));
    if (s.file) {
      // A failed fsync is a write error of the device (or its space gone under a thin or a
      // loop-backed disk): the bytes may be lost even without a crash, once the page cache
      // lets them go. The caller is told. Failure fixed (session 15): it was not checked, and
      // such a job read as banked.
      if (strict_sync() && ::fsync(s.file.get()) != 0) {
        j.error +=
            fmt::format("{}{} was not written to the disk (fsync `{}`: {}): its bytes may be lost",
                        j.error.empty() ? "" : "; ", stream, s.path, errno_name(errno));
      }
      mark_dirty();
      ::fchmod(s.file.get(), 0444);  // immutable from now on: never reopened for writing
      s.file.reset();
    } else if (::access(s.path.c_str(), F_OK) != 0) {
      // Failure fixed: a job that never got as far as its logs (missing executable, spawn
      // error) banked nothing, and its artifact refs named files that did not exist. Its
      // streams are empty; bank them as empty files so every ref can be retrieved.
      int fd = ::open(s.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
      if (fd >= 0) {
        ::close(fd);
      }
    }
    save_index(j, s);
    std::string link = artifacts_dir() + "/" + a.artifact_id;
    // A link is there already only when a recovery banks a job again (its engine died after
    // banking it): replaced. Linked first, so a settle makes no failing unlink.
    bool linked = ::link(s.path.c_str(), link.c_str()) == 0;
    if (!linked && errno == EEXIST) {
      ::unlink(link.c_str());
      linked = ::link(s.path.c_str(), link.c_str()) == 0;
    }
    if (!linked) {
      j.error +=
          fmt::format("{}bank `{}`: {}", j.error.empty() ? "" : "; ", link, errno_name(errno));
    }
    // An empty stream (stderr, mostly) has no tail to read back.
    std::string preview = s.written == 0 ? std::string() : file_tail(s.path, 200);
    a.preview = preview;
    a.read_back_hint = fmt::format(
        "retrieve_context {{\"artifactId\": \"{}\"}} pages all {} bytes (units chars, bytes, "
        "lines)",
        a.artifact_id, a.size_bytes);
    // The artifact's record is its ref in the job's meta.json (id, size, sha256), as
    // DESIGN.md has it. A separate <artifactId>.json, which nothing read, cost every settle two
    // more files on a filesystem where each new one costs tens of µs (docs/performance.md,
    // "Warm pool"); `remove` still deletes one an older engine wrote.
    return a;
  }

  // Persists a settled log's index next to it (`stdout.idx`), so the first chars or lines
  // page after a restart or an eviction from the settled cache reads one interval, not the
  // whole log. Only an index of every written byte, and only for a log of at least one
  // interval (a smaller one is scanned in one read anyway, and a file per job would cost
  // every small job a write, and with strict sync an fsync). Best effort: without the file
  // the first page scans, as it always did.
  void save_index(Job& j, Stream& s) {
    std::string record;
    {
      std::lock_guard<std::mutex> lock(s.index->mu);
      const engine::LogIndex& index = s.index->index;
      if (s.written < index.interval() || index.seen_bytes() != s.written) {
        return;
      }
      record = index.serialize();
      s.index->idx_tried = true;  // the index in memory is already the whole log's
    }
    std::string name = s.index->idx_path.substr(s.index->idx_path.rfind('/') + 1);
    if (atomic_write(j.dir, name, record, strict_sync())) {
      mark_dirty();
    }
  }

  // `announce` false: the caller fixes the settled state first and then announces it itself.
  void settle(Job& j, bool announce = true) {
    if (j.pty && j.pty_master && j.out.eof) {
      // The terminal's output after its EOF: a command that reopened /dev/tty printed there.
      for (int i = 0; i < 8 && read_chunks(j, j.out, j.pty_master.get(), "pty") == ReadEnd::kMore;
           ++i) {
      }
    }
    for (int fd : {j.out.pipe.get(), j.err.pipe.get(), j.status.get(), j.pty_master.get(),
                   j.stdin_w.get(), j.pidfd.get()}) {
      unwatch(fd);
    }
    kill_all(j);  // nothing of the sandbox outlives its job
    if (j.cgroup) {
      auto u = j.cgroup->usage();
      if (u) {
        j.usage.peak_memory_bytes = u->peak_memory_bytes;
        j.usage.cpu_usec = u->cpu_usec;
        j.usage.oom_kills = u->oom_kills;
        j.usage.pids_max_hits = u->pids_max_hits;
      }
    }
    // The releaser removes the cgroups, then their record, then gives back the host id, and
    // asks the pool to refill; woken at the settle's end.
    tear_down_later({std::move(j.lease), std::move(j.cgroup), std::move(j.record)},
                    /*wake=*/false);
    j.lease.reset();
    j.cgroup.reset();
    j.out.pipe.reset();
    j.err.pipe.reset();
    j.status.reset();
    j.pty_master.reset();
    j.stdin_w.reset();
    // How the init ended, when it died without reporting the command after an OOM kill in
    // the sandbox: the OOM killer's choice, or something else (a review, session 17).
    // Also asked without an OOM kill, once and without waiting, for the message of a death
    // nothing explains: the engine's loop holds mu here, and a dead spawner's orphaned inits
    // (every job it ran) are reaped by whoever reaps the host's orphans, maybe never.
    std::optional<int> init_status;
    if (!j.have_exit && !j.killed_by_caller && !j.io_failed && !j.output_limit && !j.timed_out &&
        j.setup_step == sandbox::SetupStep::kNone && j.pidfd) {
      // After an OOM kill the spawner, its parent, reaps it within moments; waits at most
      // 250 ms, a cost paid only there.
      init_status = sys::reaped_wait_status(j.pidfd.get(), j.usage.oom_kills > 0 ? 250 : 0);
    }
    // kExitedAlone: the settle began when init reported, and init is exiting meanwhile (the
    // kill above changes nothing for it); its exit is awaited below, before the end is told.
    UniqueFd exiting_init;
    if (early_settle(j)) {
      exiting_init = std::move(j.pidfd);
    }
    j.pidfd.reset();
    j.sockstat = {};  // it holds the sandbox's network namespace, and its sockets, alive
    j.socket_deadline.reset();
    j.stdin_watch = j.pty_watch = 0;
    std::string().swap(j.pending_stdin);  // input nobody will read any more
    j.pending_off = 0;
    // Handed to the releaser below, after init's exit when the settle waits for it: init's
    // exit must not be the one that drops the namespace.
    UniqueFd mount_ns = std::move(j.mount_ns);

    if (j.io_failed) {
      // Failure fixed: the error counted only the bytes of the first failed write ("(N bytes
      // lost)"), not what the command printed after it until it died. Counted here, at the end.
      j.state = "failed";
      j.error = fmt::format(
          "the engine could not keep the output: {}; the command was killed; {} bytes of "
          "stdout and {} bytes of stderr could not be kept; the {} + {} bytes written before "
          "are banked",
          j.io_what, j.out.lost, j.err.lost, j.out.written, j.err.written);
    } else if (j.output_limit) {
      j.state = "output-limit";
    } else if (j.socket_limit) {
      j.state = "oom";
      j.signal = signal_name(SIGKILL);
      j.error = engine::socket_limit_message(j.sockets_seen, j.memory_limit);
    } else if (j.timed_out) {
      j.state = "timeout";
    } else if (j.setup_step != sandbox::SetupStep::kNone &&
               j.setup_step != sandbox::SetupStep::kInitWait) {
      j.state = "failed";
      j.error = fmt::format("the sandbox could not start the command: {}: {}",
                            sandbox::step_name(j.setup_step), errno_name(j.setup_errno));
      if (j.setup_step == sandbox::SetupStep::kCommandExec && j.setup_errno == ENOENT) {
        j.error += " (the program or its interpreter is missing inside the sandbox)";
      }
      if (j.setup_step == sandbox::SetupStep::kCwd && j.setup_errno == EACCES) {
        j.error += sandbox::kCwdDeniedHint;
      }
    } else if (j.have_exit) {
      if (WIFEXITED(j.wait_status)) {
        j.state = "exited";
        j.exit_code = WEXITSTATUS(j.wait_status);
      } else if (WIFSIGNALED(j.wait_status)) {
        int sig = WTERMSIG(j.wait_status);
        j.signal = signal_name(sig);
        j.state = sig == SIGKILL && j.usage.oom_kills > 0 && !j.killed_by_caller ? "oom" : "killed";
        if (j.state == "oom") {
          // A SIGKILL after an OOM kill in its cgroup: the kernel does not say whose. Worded as
          // what is known (a red-team review, session 38: a shell that killed itself after a
          // child's OOM kill read "was killed by the OOM killer").
          j.error = fmt::format(
              "the command died of SIGKILL after the OOM killer acted in its sandbox ({} OOM "
              "kill{} at the memory limit): most likely it was the one chosen; its output is "
              "banked",
              j.usage.oom_kills, j.usage.oom_kills == 1 ? "" : "s");
        }
      } else {
        j.state = "failed";
      }
    } else if (j.killed_by_caller) {
      // Escalated to SIGKILL of the whole sandbox before init could report.
      j.state = "killed";
      j.signal = signal_name(SIGKILL);
    } else if (j.usage.oom_kills > 0 && init_status && WIFSIGNALED(*init_status) &&
               WTERMSIG(*init_status) == SIGKILL) {
      // Failure fixed (session 16, found on a pure cgroup v2 kernel): the OOM killer picks the
      // process with the most memory of its own, and memory no process maps (socket buffers,
      // pipes, files in /tmp) counts against the limit too, so it can pick the sandbox's init:
      // the whole sandbox dies without a status, which read as a failure of cordon's. Only a
      // SIGKILLed init after an OOM kill reads so (session 17: any init death did).
      j.state = "oom";
      j.signal = signal_name(SIGKILL);
      j.error = fmt::format(
          "the sandbox was killed by the OOM killer at its memory limit ({}); its output is "
          "banked",
          sandbox::kInitOomCause);
    } else {
      j.state = "failed";
      // Also init's failed wait after the command started (kInitWait, not a setup failure:
      // supervise.cpp, outcome()), which no init_status is asked for.
      j.error = engine::init_died_message(j.setup_step, j.setup_errno, init_status) +
                "; output is banked";
      if (j.usage.oom_kills > 0 && !init_status && j.setup_step == sandbox::SetupStep::kNone) {
        j.error += fmt::format(
            " ({} OOM kill(s) in the sandbox: the kernel may have chosen its init, which "
            "cordon could not confirm: Linux tells it from 6.15, once the init is reaped)",
            j.usage.oom_kills);
      }
    }
    if (j.state == "timeout") {
      j.error = fmt::format(
          "timed out after {} ms (the job's timeout); the whole sandbox was "
          "killed; output is banked",
          j.timeout_ms);
    }
    // A caller's kill is part of the outcome: a command that trapped it and exited by itself
    // would otherwise read as a plain exit.
    if (j.killed_by_caller && j.error.empty() && j.caller_signal != 0) {
      if (j.state == "exited" && j.exit_code) {
        j.error = fmt::format("a caller sent {}; the command then exited {} by itself",
                              signal_name(j.caller_signal), *j.exit_code);
      } else if (j.state == "killed") {
        j.error = j.signal == signal_name(j.caller_signal)
                      ? fmt::format("killed by a caller's {}", signal_name(j.caller_signal))
                      : fmt::format(
                            "a caller sent {}; {} ended it (the grace's end, or the "
                            "command's own doing)",
                            signal_name(j.caller_signal), j.signal.value_or("a signal"));
      }
    }
    j.out_bytes = j.out.written;
    j.err_bytes = j.err.written;
    count_on_disk(j.session, 0, static_cast<int64_t>(j.out_bytes + j.err_bytes));
    j.out_art = bank(j, j.out, j.pty ? "pty" : "stdout");
    j.err_art = bank(j, j.err, "stderr");
    j.ended_at = rfc3339_now();
    j.duration_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - j.start_tp).count());
    j.deadline.reset();
    j.kill_deadline.reset();
    j.drain_deadline.reset();
    // A caller already waiting for this end (status() or wait() with a wait) reads it as it
    // wakes, and a read marks the record read: marked now, in the settle's own write, rather
    // than by a second write of meta.json on that caller's path (0.7 ms off start → settle
    // here: on ext4 a rename over a record allocates its blocks; docs/performance-history.md,
    // session 24).
    if (!j.read && awaited.contains(j.id)) {
      j.read = true;
    }
    retry_unrecorded();  // settles not recorded before this one first, while there may be room
    if (auto recorded = write_job_meta(j); !recorded) {
      // Told to the caller while the engine runs (a restart reads the record that is on disk).
      // Failure fixed (session 15): the settle's record write was not checked. Since session
      // 31 the write is tried again until it succeeds (retry_unrecorded()).
      j.unrecorded = fmt::format(
          "its end could not be recorded on disk when it settled ({}); cordon writes it again "
          "once there is room, and a restart before then reads it as `abandoned`",
          recorded.error().message());
      unrecorded_ids.insert(j.id);
    }

    // A settled job's init has exited, and with it every process of its sandbox, whichever
    // way the settle began. Its exit (~0.3–0.5 ms here) ran beside the work above, so this
    // wait is short or nothing; the bound is for a kernel that never finishes an exit, and
    // then the cgroups were killed above.
    if (exiting_init && !sys::exits_within(exiting_init.get(), kInitExitWait.count())) {
      j.error += fmt::format(
          "{}the sandbox's init reported the command's end but had not exited {} ms later; its "
          "cgroups were killed",
          j.error.empty() ? "" : "; ", kInitExitWait.count());
      (void)write_job_meta(j);
    }
    release_later(std::move(mount_ns), /*wake=*/false);

    auto& c = counters[j.session];
    if (c.running > 0) {
      --c.running;
    }
    if (!j.read) {
      ++c.finished;
    }
    uncount_running(j);
    // Move to the settled cache.
    const std::string id = j.id, ended_at = j.ended_at;  // `j` may be gone after the trim
    auto it = live.find(j.id);
    if (it != live.end()) {
      std::unique_ptr<Job> owned = std::move(it->second);
      live.erase(it);
      drop_watches(*owned);
      owned->checked.reset();
      cache.push_front(std::move(owned));
      trim_cache();
    }
    track_settled(ended_at, id);
    if (retention_on()) {
      const bool more = apply_retention(id, kRetentionPerSettle);
      std::lock_guard<std::mutex> lock(release_mu);
      retention_keep = id;  // the releaser's chunks keep the job that settled last
      retention_due = retention_due || more;  // the releaser, woken below, removes the rest
    }
    ensure_reserve();
    notify_settled();
    if (announce) {
      announce_settled(id);
    }
    wake_releaser();  // the teardown queued above, now that the end is told
    start_queued();
  }

  // Tells the settle subscribers (with mu held, as they are told to expect).
  void announce_settled(const std::string& id) {
    if (settle_subs.empty()) {
      return;
    }
    Job* j = find(id);
    if (j == nullptr) {
      return;  // the retention policy removed it at once
    }
    JobStatus s = status_of(*j);
    for (const auto& [sub_id, callback] : settle_subs) {
      callback(s);
    }
  }

  // ---- spawning -----------------------------------------------------------------------------
  // A git tools' job needs a slot of the engine's total only: it is read-only and bounded by
  // git.timeoutMs, and queuing it behind the session's own commands made the tool fail for as
  // long as they ran (a review, session 12).
  // concurrency.perUid (session 13, found by a review): one uid's sessions filled `total` and
  // another uid's command queued behind all of them; the queue skips a job whose owner is at
  // the bound, so another owner's job takes the free slot.
  bool has_slot(const Job& j) const {
    if (!pol) {
      return false;
    }
    if (running_total >= pol->concurrency.total) {
      return false;
    }
    if (j.git) {
      // Never behind its uid's or session's own commands (the failure of session 12, see
      // docs/reliability.md), but at most kGitJobsPerSession of one session's git jobs run at
      // once, and with perUid set at most kGitJobsPerOwner of one uid's: without a bound, one
      // uid's slow git calls (a FIFO as blame.ignoreRevsFile, a huge repository) filled `total`
      // and another uid's command waited for them (found by a review, session 29), and without
      // perUid one session's did (a review, session 33).
      if (running_in(running_git_per_session, j.session) >= kGitJobsPerSession) {
        return false;
      }
      if (pol->concurrency.per_uid == 0) {
        return true;
      }
      return running_in(running_git_per_owner, j.owner) < kGitJobsPerOwner;
    }
    if (pol->concurrency.per_uid > 0) {
      if (running_in(running_per_owner, j.owner) >= pol->concurrency.per_uid) {
        return false;
      }
    }
    return running_in(running_per_session, j.session) < pol->concurrency.per_session;
  }

  // Launches every queued job that has a slot. launch() can settle a job (a failed start),
  // and settling starts queued jobs again, which changes `queue`: no iterator is held across
  // a launch, the scan starts over instead.
  void start_queued() {
    for (;;) {
      auto it = std::find_if(queue.begin(), queue.end(), [this](Job* q) { return has_slot(*q); });
      if (it == queue.end()) {
        return;
      }
      Job* j = *it;
      queue.erase(it);
      launch(*j);
    }
  }

  // Launches a job (state → running) and hands it to a starter thread; called with mu held.
  // The spawn itself (cgroups, a uid lease, the spawner round trip) runs there without mu, so
  // a start returns at once and other calls go on meanwhile; attach() completes the job.
  // `meta_written`: the caller already wrote meta.json with state running.
  void launch(Job& j, bool meta_written = false) {
    count_running(j);
    j.state = "running";
    if (!meta_written) {
      j.start_tp = Clock::now();
      j.started_at = rfc3339_now();
      (void)write_job_meta(j);
    }
    // The logs exist before the command does: output goes to files as it arrives, and
    // `output` pages them from the start.
    for (Stream* s : {&j.out, &j.err}) {
      int fd = ::open(s->path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        fail_start(j, Error::sys(errno, fmt::format("open `{}`", s->path)).message());
        return;
      }
      s->file.reset(fd);
    }
    to_spawn.push_back(&j);
    wake({.starters = 1});
  }

  // A job that never ran settles as `state` (failed or killed) with `error`, and `signal`
  // when killed: settle() computes the end of a running job, then the record it moved into
  // the cache is corrected and written. The caller counted the job running; mu held.
  // Returns the settled record, or nullptr when it could not be read back.
  Job* settle_unstarted(Job& j, const char* state, const std::string& error, int signal = 0) {
    j.attached = true;
    j.init_exited = true;
    j.setup_step = sandbox::SetupStep::kNone;
    j.io_failed = false;
    j.state = "running";  // settle() computes the final state
    j.error = error;
    if (j.cgroup) {
      // No init's exit stands behind this settle: a sandbox cloned before its spawn failed
      // may still be dying. Its cgroups are emptied and removed before the end is told (the
      // releaser then finds nothing left to do, or tries again).
      (void)j.cgroup->destroy();
    }
    std::string id = j.id;
    settle(j, false);
    Job* s = find(id);
    if (s != nullptr) {
      s->state = state;
      s->error = error;
      if (signal != 0) {
        s->signal = signal_name(signal);
      }
      (void)write_job_meta(*s);
      announce_settled(id);
    }
    return s;
  }

  // A start that failed before or while spawning: settled `failed`, saying why.
  Job* fail_start(Job& j, const std::string& why) {
    return settle_unstarted(j, "failed", "the command could not start: " + why);
  }

  // A job killed before it ran: settled `killed` by `signal`.
  Job* settle_killed_unstarted(Job& j, int signal) {
    return settle_unstarted(j, "killed", "killed before it started", signal);
  }

  // What a starter needs to spawn a job without mu: copied from the Job under mu.
  struct SpawnWork {
    std::string id;
    sandbox::SpawnerClient::Request req;
    sandbox::CgroupLimits limits;
  };
  // What it got: everything acquired is handed to the Job (settle() releases it), also when
  // a later step failed.
  struct SpawnDone {
    std::optional<sandbox::HostIdLease> lease;  // before the cgroup: released after it
    std::optional<sandbox::JobCgroup> cgroup;
    sandbox::RecordLock record;
    std::optional<sandbox::SpawnerClient::Reply> reply;
    std::optional<Error> error;
  };

  SpawnWork spawn_work(Job& j) {
    const policy::CheckedStart& cs = *j.checked;
    SpawnWork w;
    w.id = j.id;
    sandbox::SandboxSpec spec = policy::to_sandbox_spec(cs);
    spec.tty = j.pty;
    spec.tty_cols = j.cols;
    spec.tty_rows = j.rows;
    if (j.pty) {
      bool has_term = false;
      for (auto& e : spec.env) {
        if (e.rfind("TERM=", 0) == 0) {
          e = "TERM=xterm-256color";
          has_term = true;
        }
      }
      if (!has_term) {
        spec.env.push_back("TERM=xterm-256color");
      }
    }
    w.limits.memory_bytes = cs.limits.memory_bytes;
    j.memory_limit = cs.network == sandbox::NetworkMode::kNone ? cs.limits.memory_bytes : 0;
    w.limits.pids = cs.limits.pids;
    w.limits.cpus = cs.limits.cpus;
    w.req.spec = std::move(spec);
    w.req.seccomp_profile_path = cs.seccomp_profile.value_or(opt.default_seccomp_profile);
    w.req.init_path = opt.init_path;
    w.req.cgroupns_at_clone = layout.mode == sandbox::CgroupMode::kUnified;
    return w;
  }

  // Runs without mu: touches only thread-safe members (layout and opt are read-only; records,
  // pool and spawner are safe to share) and the work's own data.
  SpawnDone run_spawn(SpawnWork& w, sandbox::SpawnerClient& own) {
    SpawnDone d;
    auto step = [&]() -> Result<void> {
      // Warm pool: a sandbox of this job's shape built ahead of time in cgroups with its
      // limits and for a host id of its own. Otherwise the job's own cgroups, named after it,
      // and a lease.
      uint64_t pool_slot = 0;
      if (auto entry = pool ? pool->take(w.req, w.limits) : std::nullopt) {
        // Its cgroups were made with exactly this job's limits.
        d.record = std::move(entry->record);
        d.cgroup.emplace(std::move(entry->cgroup));
        d.lease.emplace(std::move(entry->lease));
        pool_slot = entry->slot;
        CORDON_CHECK_CTX(d.record.rename(w.id), "record job cgroup");
      } else {
        CORDON_TRY(paths, sandbox::JobCgroup::paths_for(layout, w.id));
        CORDON_TRY_CTX(record, records->add(w.id, paths), "record job cgroup");
        d.record = std::move(record);
        CORDON_TRY_CTX(cg, sandbox::JobCgroup::create(layout, w.id, w.limits), "create job cgroup");
        d.cgroup.emplace(std::move(cg));
        auto lease = sandbox::HostIdLease::acquire(sandbox::kHostIdLeaseDir, opt.host_id_base,
                                                   opt.host_id_count);
        if (!lease && lease.error().sys_errno() == EAGAIN) {
          // Every id is taken, maybe by jobs that settled a moment ago: the releaser gives
          // their ids back after the settle (tear_down_later()).
          wait_teardowns(kTeardownWait);
          lease = sandbox::HostIdLease::acquire(sandbox::kHostIdLeaseDir, opt.host_id_base,
                                                opt.host_id_count);
        }
        if (!lease && lease.error().sys_errno() == EAGAIN && pool) {
          // Every id is taken, maybe some by parked sandboxes (of another shape, or being
          // built): jobs come first.
          (void)pool->clear();
          lease = sandbox::HostIdLease::acquire(sandbox::kHostIdLeaseDir, opt.host_id_base,
                                                opt.host_id_count);
        }
        if (!lease) {
          return std::unexpected(std::move(lease.error()));
        }
        d.lease.emplace(std::move(*lease));
      }
      w.req.host_id = d.lease->id();
      w.req.cgroup_v2_fd = d.cgroup->v2_dirfd();
      if (layout.mode == sandbox::CgroupMode::kHybrid) {
        w.req.cgroup_v1_fds = d.cgroup->v1_dirfds();
      }
      w.req.pool_slot = pool_slot;
      sandbox::SpawnerClient& via = pool_slot != 0 ? *spawners.front() : own;
      CORDON_TRY_CTX(reply, via.spawn(w.req), "spawn the sandbox");
      d.reply.emplace(std::move(reply));
      return {};
    };
    if (auto r = step(); !r) {
      d.error = std::move(r.error());
    }
    return d;
  }

  // Completes a spawn (or fails the start) with mu held. A kill that came meanwhile is
  // applied now, to the sandbox that exists from here on.
  void attach(Job& j, SpawnDone d) {
    j.cgroup = std::move(d.cgroup);
    j.record = std::move(d.record);
    j.lease = std::move(d.lease);
    if (d.error) {
      if (j.kill_on_attach != 0) {
        // Killed while being spawned, and the spawn failed: the caller's kill is the end that
        // counts (the job never ran), not a start failure.
        settle_killed_unstarted(j, j.kill_on_attach);
        return;
      }
      fail_start(j, d.error->message());
      return;
    }
    j.attached = true;
    auto& reply = *d.reply;
    if (!reply.argv.empty() && reply.argv != j.argv) {
      j.argv = reply.argv;  // e.g. a script's interpreter
      (void)write_job_meta(j, /*use_reserve=*/false);
    }
    j.pidfd = std::move(reply.pidfd);
    // Held from now on, not only from a SIGKILL: when the command ends by itself its init's
    // exit no longer unmounts the tree (an RCU grace period, the superblocks) before the
    // engine sees the exit; the releaser drops it after the settle (hold_mount_ns).
    hold_mount_ns(j);
    j.status = std::move(reply.status);
    set_nonblock(j.status.get());
    watch(j, j.pidfd.get(), WatchKind::kPidfd, EPOLLIN);
    watch(j, j.status.get(), WatchKind::kStatus, EPOLLIN);
    if (!j.pty) {
      j.out.pipe = std::move(reply.stdout_read);
      j.err.pipe = std::move(reply.stderr_read);
      set_nonblock(j.out.pipe.get());
      set_nonblock(j.err.pipe.get());
      watch(j, j.out.pipe.get(), WatchKind::kStdout, EPOLLIN);
      watch(j, j.err.pipe.get(), WatchKind::kStderr, EPOLLIN);
      if (j.stdin_mode == StdinMode::kPipe) {
        j.stdin_w = std::move(reply.stdin_write);
        set_nonblock(j.stdin_w.get());
        // What `write` queued while the sandbox was being made.
        flush_stdin(j);
      } else {
        reply.stdin_write.reset();  // EOF for the command
      }
    } else {
      j.err.eof = true;
    }
    if (j.timeout_ms > 0) {
      j.deadline = j.start_tp + std::chrono::milliseconds(j.timeout_ms);
      arm_for(*j.deadline);
    }
    if (j.memory_limit > 0) {
      auto fd = engine::open_sockstat(j.pidfd.get());
      if (fd) {
        j.sockstat = std::move(*fd);
        j.socket_deadline = socket_tick_after(Clock::now());
        arm_for(*j.socket_deadline);
      }
    }
    if (j.kill_on_attach != 0) {
      terminate(j, j.kill_on_attach);
    }
  }

  // A starter thread: takes launched jobs in order and spawns each without mu. Several run,
  // so one's cgroup and lease work overlaps another's spawner round trip.
  void starter_loop(size_t index) {
    sandbox::SpawnerClient& own = *spawners[index % spawners.size()];
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      starter_cv.wait(lock, [this] { return stopping_starters || !to_spawn.empty(); });
      if (stopping_starters) {
        return;  // jobs still waiting stay `running` on disk: the next engine abandons them
      }
      Job* j = to_spawn.front();
      to_spawn.pop_front();
      // In `live` and unsettled until attach(): nothing settles a job that is not attached.
      SpawnWork w = spawn_work(*j);
      lock.unlock();
      SpawnDone d = run_spawn(w, own);
      lock.lock();
      attach(*j, std::move(d));
    }
  }

  // ---- the loop -----------------------------------------------------------------------------
  void on_timer() {
    uint64_t ticks;
    (void)::read(timerfd.get(), &ticks, sizeof ticks);
    auto now = Clock::now();
    std::vector<Job*> due;
    for (auto& [id, j] : live) {
      due.push_back(j.get());
    }
    for (Job* j : due) {
      if (j->deadline && now >= *j->deadline) {
        j->deadline.reset();
        j->timed_out = true;
        terminate(*j, SIGTERM);
      }
      if (j->kill_deadline && now >= *j->kill_deadline) {
        j->kill_deadline.reset();
        kill_sandbox(*j);
      }
      if (j->drain_deadline && now >= *j->drain_deadline) {
        maybe_settle(*j);
      }
      if (j->socket_deadline && now >= *j->socket_deadline) {
        j->socket_deadline = socket_tick_after(now);
        check_sockets(*j);
      }
    }
    rearm_timer();
  }

  void run_loop() {
    std::vector<struct epoll_event> events(64);
    for (;;) {
      int n = ::epoll_wait(epfd.get(), events.data(), static_cast<int>(events.size()), -1);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return;
      }
      // A spawner that died (SIGKILLed, OOM-killed) is reaped and replaced at once, so no
      // zombie waits for the next start routed to it; first in the batch, so a job settled
      // after the death is settled after the replacement. Without mu: a posix_spawn and a
      // hello (~1 ms) that API calls need not wait for. An error leaves no spawner in that
      // slot, and the next start routed to it tries again and fails saying why.
      for (int i = 0; i < n; ++i) {
        uint64_t wid = events[i].data.u64;
        if (wid >= kFirstSpawnerWatch && wid < kFirstSpawnerWatch + spawners.size()) {
          (void)spawners[wid - kFirstSpawnerWatch]->replace_if_dead();
        }
      }
      // Each event under mu of its own, its wakes sent once mu is let go: a settle's waiters
      // are not kept waiting by the rest of a batch (up to 64 events, output reads among them).
      for (int i = 0; i < n; ++i) {
        std::unique_lock<std::mutex> lock(mu);
        if (stopping) {
          return;
        }
        defer_wakes = true;
        handle_event(events[i]);
        const Wakes wakes = take_wakes();
        lock.unlock();
        send_wakes(wakes);
      }
    }
  }

  // One event of run_loop(); mu held.
  void handle_event(const struct epoll_event& event) {
    uint64_t wid = event.data.u64;
    if (wid == kTimerWatch) {
      on_timer();
      return;
    }
    if (wid == kWakeWatch) {
      uint64_t v;
      (void)::read(wakefd.get(), &v, sizeof v);
      return;
    }
    auto found = watches.find(wid);
    if (found == watches.end()) {
      return;  // its job settled since epoll_wait returned
    }
    Watch w = found->second;
    Job& j = *w.job;
    if (j.settled()) {
      return;
    }
    switch (w.kind) {
      case WatchKind::kPidfd:
        j.init_exited = true;
        unwatch(j.pidfd.get());
        maybe_settle(j);
        break;
      case WatchKind::kStatus:
        read_status(j);
        break;
      case WatchKind::kStdout:
        read_stream(j, j.out, j.out.pipe.get(), "stdout");
        break;
      case WatchKind::kStderr:
        read_stream(j, j.err, j.err.pipe.get(), "stderr");
        break;
      case WatchKind::kPty:
        if ((event.events & EPOLLOUT) != 0) {
          flush_stdin(j);
        }
        if ((event.events & ~static_cast<uint32_t>(EPOLLOUT)) != 0) {
          read_stream(j, j.out, j.pty_master.get(), "pty");
        }
        break;
      case WatchKind::kStdin:
        flush_stdin(j);
        break;
    }
  }

  // ---- recovery -----------------------------------------------------------------------------
  // A job a previous engine left queued or running: its sandbox died with that engine (the
  // spawner kills every sandbox when its engine goes away; the cgroup sweep kills any left).
  // Banks what reached the logs and writes the meta; the job is `abandoned` even when that
  // write fails (a full disk), and the next read or open tries again.
  Result<void> abandon(Job& j) {
    // A job recorded `queued` whose logs were never made did not start: launch() records it
    // `running`, then makes its logs, and only then hands it to a starter. Saying so matters to
    // a caller of a command that must not run twice (a push, a deploy). Failure fixed (a
    // red-team review, session 38): queued jobs read "whatever of it still ran was killed",
    // like the jobs that ran.
    struct stat log_st {};
    const bool never_started = j.state == "queued" && ::stat(j.out.path.c_str(), &log_st) != 0 &&
                               errno == ENOENT && ::stat(j.err.path.c_str(), &log_st) != 0 &&
                               errno == ENOENT;
    j.state = "abandoned";
    // Failure fixed: the error said "it was killed", but the engine can die between the
    // command's exit and the settle (the chaos soak saw it in ~1 job in 30); the end was not
    // recorded, and that is all that is known.
    j.error = never_started
                  ? "the engine stopped while this command was queued: it never started, and "
                    "nothing of it ran; start it again if it is still wanted"
                  : "the engine restarted before this command's end was recorded; whatever of "
                    "it still ran was killed, and the output it wrote until then is banked";
    // Its end was not recorded: the last time its output or its record changed is the end
    // known (a lower bound), not the restart, which may come hours later and would stretch
    // its age for retention; the duration agrees with it.
    struct timespec last {};
    auto later = [&last](const struct stat& st) {
      if (st.st_mtim.tv_sec > last.tv_sec ||
          (st.st_mtim.tv_sec == last.tv_sec && st.st_mtim.tv_nsec > last.tv_nsec)) {
        last = st.st_mtim;
      }
    };
    if (struct stat meta{}; ::stat((j.dir + "/meta.json").c_str(), &meta) == 0) {
      later(meta);
    }
    for (auto* s : {&j.out, &j.err}) {
      s->written = 0;
      hasher.reset(*s->digest);
      struct stat st {};
      UniqueFd log(open_log(s->path));
      if (!log && errno != ENOENT) {
        j.error += fmt::format("{}the log `{}` could not be read: {}", j.error.empty() ? "" : "; ",
                               s->path, errno_name(errno));
      }
      if (log && ::fstat(log.get(), &st) == 0) {
        later(st);
        std::vector<char> buf(1 << 16);
        for (ssize_t n; (n = ::read(log.get(), buf.data(), buf.size())) != 0;) {
          if (n < 0) {
            if (errno == EINTR) {
              continue;
            }
            j.error += fmt::format("{}read `{}`: {}", j.error.empty() ? "" : "; ", s->path,
                                   errno_name(errno));
            break;
          }
          hasher.feed_now(*s->digest, buf.data(), static_cast<size_t>(n));
          s->written += static_cast<uint64_t>(n);
        }
        // Banked: read-only from now on, as a settle leaves its logs. Failure fixed (a review,
        // session 31): an abandoned job's logs and their artifact links stayed writable.
        ::fchmod(log.get(), 0444);
      }
    }
    j.out_bytes = j.out.written;
    j.err_bytes = j.err.written;
    j.out_art = bank(j, j.out, j.pty ? "pty" : "stdout");
    j.err_art = bank(j, j.err, "stderr");
    j.ended_at = last.tv_sec != 0 ? rfc3339_at(last.tv_sec, last.tv_nsec) : rfc3339_now();
    auto start_ms = rfc3339_ms(j.started_at), end_ms = rfc3339_ms(j.ended_at);
    j.duration_ms = 0;
    if (start_ms && end_ms && *end_ms > *start_ms) {
      j.duration_ms = static_cast<uint64_t>(*end_ms - *start_ms);
    } else if (start_ms && end_ms) {
      j.ended_at = j.started_at;  // file times are coarse: a silent job's record can read earlier
    }
    return write_job_meta(j);
  }

  Result<void> recover() {
    DIR* d = ::opendir(jobs_dir().c_str());
    if (d == nullptr) {
      return sys_error("opendir `{}`", jobs_dir());
    }
    std::vector<std::string> ids;
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') {
        ids.emplace_back(e->d_name);
      }
    }
    ::closedir(d);
    std::unordered_map<std::string, std::unordered_set<std::string>> recovered;  // by session
    for (const auto& id : ids) {
      std::string dir = jobs_dir() + "/" + id;
      auto text = read_small_file(dir + "/meta.json");
      if (!text) {
        struct stat st {};
        if (errno == ENOENT && valid_name(id) && id[0] == 't' &&
            ::lstat((dir + "/meta.json").c_str(), &st) != 0 && errno == ENOENT) {
          remove_recordless_dir(id);
        }
        continue;
      }
      auto j = job_from_meta(dir, *text);
      if (!j || j->id != id || !valid_name(id)) {
        // Not this directory's job (no id, another's, one with `/..`): left as it is, as find()
        // leaves it. Abandoning it would name artifact paths after an id that is not there.
        continue;
      }
      count_on_disk(j->session, 1, 0);
      recovered[j->session].insert(j->id);
      if (j->state == "running" || j->state == "queued") {
        // Failure fixed: a meta write that failed here (ENOSPC on a disk that filled up while
        // the previous engine ran, its reserve already spent) failed Engine::open, so the
        // engine could not start at all on a full disk. The job is answered as abandoned
        // either way (find() abandons a not-settled job it reads from disk again).
        (void)abandon(*j);
      }
      if (!j->read) {
        ++counters[j->session].finished;
      }
      count_on_disk(j->session, 0, static_cast<int64_t>(j->out_bytes + j->err_bytes));
      track_settled(j->ended_at, j->id);
    }
    reconcile_session_indexes(recovered);
    return {};
  }

  // A job directory without its record: a start killed between its mkdir and its record, or a
  // remove killed after it deleted the record. Nothing can name the job: its files, its
  // artifacts and the directory go (only the names the engine writes; anything else keeps the
  // directory).
  void remove_recordless_dir(const std::string& id) {
    const std::string dir = jobs_dir() + "/" + id;
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return;  // a symlink (or anything else) named like a job: never followed
    }
    for (const char* stream : {"stdout", "stderr", "pty"}) {
      const std::string art = artifacts_dir() + "/a" + id.substr(1) + "-" + stream;
      ::unlink(art.c_str());
      ::unlink((art + ".json").c_str());
    }
    for (const char* f : kJobFiles) {
      ::unlink((dir + f).c_str());
    }
    (void)::rmdir(dir.c_str());
  }

  // Makes every session index list exactly its recovered jobs: a line whose job directory is
  // gone (a remove killed before its index rewrite) is dropped; a job missing from its index
  // (a start killed between its record and its index line, or a machine crash that kept one
  // write and not the other) is listed again, so it can be seen and removed. Failure fixed (a
  // review, session 14): such a job was counted against maxJobs and in `finished`, and no list
  // ever showed it. An index that cannot be read or written is left as it is.
  void reconcile_session_indexes(
      const std::unordered_map<std::string, std::unordered_set<std::string>>& recovered) {
    std::unordered_set<std::string> sessions;
    for (const auto& [session, ids] : recovered) {
      sessions.insert(session);
    }
    if (auto names = session_names()) {
      sessions.insert(names->begin(), names->end());
    }
    static const std::unordered_set<std::string> kNone;
    for (const auto& session : sessions) {
      auto it = recovered.find(session);
      const auto& jobs = it == recovered.end() ? kNone : it->second;
      auto listed = read_session_ids(session);
      if (!listed) {
        continue;
      }
      std::vector<std::string> kept;
      std::unordered_set<std::string> seen;
      bool changed = false;
      for (const auto& id : *listed) {
        if ((!jobs.contains(id) && job_dir_gone(id)) || !seen.insert(id).second) {
          changed = true;
          continue;
        }
        kept.push_back(id);
      }
      std::vector<std::string> missing;
      for (const auto& id : jobs) {
        if (!seen.contains(id)) {
          missing.push_back(id);
        }
      }
      std::sort(missing.begin(), missing.end());  // ids sort by start time
      changed = changed || !missing.empty();
      if (!changed) {
        continue;
      }
      kept.insert(kept.end(), missing.begin(), missing.end());
      if (kept.empty()) {
        (void)::unlink(session_index_path(session).c_str());
        continue;
      }
      std::string text;
      for (const auto& id : kept) {
        text += id + "\n";
      }
      (void)write_meta(sessions_dir(), session_index_name(session), text, /*use_reserve=*/false);
    }
  }
};

// ---- Engine ---------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

const std::vector<std::string>& Engine::warnings() const { return impl_->warnings; }

Engine::~Engine() {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping_starters = true;
  }
  impl_->starter_cv.notify_all();
  // A spawn in flight finishes and is attached, so the kill below reaches its sandbox.
  for (auto& t : impl_->starters) {
    t.join();
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    for (auto& [id, j] : impl_->live) {
      impl_->kill_all(*j);
    }
  }
  uint64_t one = 1;
  (void)::write(impl_->wakefd.get(), &one, sizeof one);
  if (impl_->loop.joinable()) {
    impl_->loop.join();
  }
  {
    // The last chance for a settle whose record could not be written (its end is known only
    // here): after a clean close, the next engine must not read it `abandoned`.
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->retry_unrecorded();
  }
  if (impl_->releaser.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->release_mu);
      impl_->release_stop = true;
    }
    impl_->release_cv.notify_one();
    impl_->releaser.join();  // every settled job's namespace dropped
  }
  if (impl_->flusher.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->flush_mu);
      impl_->flush_stop = true;
    }
    impl_->flush_cv.notify_one();
    impl_->flusher.join();  // its last syncfs() covers everything written before
  }
  // Jobs still running are abandoned: the next engine on this state dir says so.
  for (auto& spawner : impl_->spawners) {
    (void)spawner->stop();
  }
}

Result<std::unique_ptr<Engine>> Engine::open(const EngineOptions& options) {
  sys::WriteSignalsBlock write_signals;      // an embedder's SIGPIPE and SIGXFSZ
  CORDON_CHECK(sys::fill_closed_std_fds());  // before the first descriptor the engine opens
  // Threads the kernel refuses (EAGAIN: RLIMIT_NPROC, a pids limit) make std::thread throw:
  // each start of one is caught and the open fails, naming it, instead of ending the process.
  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>();  // its hash worker's thread
  } catch (const std::system_error& e) {
    return std::unexpected(Error::sys(e.code().value(), "start the engine's hash thread"));
  }
  impl->opt = options;
  auto& o = impl->opt;
  // The job in hand (the one settling, the one just read from disk) is kept in the cache
  // while the caller uses it. Failure fixed (a review, session 14): settled_cache 0 freed it
  // at once, and the first settle aborted the process.
  o.settled_cache = std::max<size_t>(o.settled_cache, 1);
  if (o.state_dir.empty() || o.state_dir[0] != '/') {
    return invalid("the state dir must be an absolute path");
  }
  CORDON_CHECK(sandbox::check_host_id_range(o.host_id_base, o.host_id_count));
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin_dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string("/");
  bin_dir = bin_dir.substr(0, bin_dir.rfind('/'));
  if (o.spawner_path.empty()) {
    o.spawner_path = bin_dir + "/cordon-spawner";
  }
  if (o.init_path.empty()) {
    o.init_path = bin_dir + "/cordon-init";
  }
  if (o.default_seccomp_profile.empty()) {
    o.default_seccomp_profile = bin_dir + "/seccomp/default.json";
  }
  CORDON_CHECK(mkdir_p(o.state_dir, 0700));
  for (const auto& sub : {impl->jobs_dir(), impl->artifacts_dir(), impl->sessions_dir()}) {
    if (::mkdir(sub.c_str(), 0700) != 0 && errno != EEXIST) {
      return sys_error("mkdir `{}`", sub);
    }
  }
  // One engine per state dir: a second one must never "recover" a live engine's jobs.
  std::string lock = o.state_dir + "/engine.lock";
  int lfd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lfd < 0) {
    return sys_error("open `{}`", lock);
  }
  impl->lock_fd.reset(lfd);
  if (::flock(lfd, LOCK_EX | LOCK_NB) != 0) {
    return refusal(
        "another cordon engine is using the state dir `{}`; stop it or use another "
        "--state-dir",
        o.state_dir);
  }

  impl->ensure_reserve();
  if (!o.policy_path.empty()) {
    auto guard = policy::HostPathGuard::from_system(
        {o.state_dir, o.spawner_path, o.init_path, o.default_seccomp_profile, bin_dir});
    guard.job_unwritable = o.job_unwritable_paths;
    CORDON_TRY_CTX(p, policy::load_policy(o.policy_path, guard), "load policy `{}`", o.policy_path);
    impl->pol.emplace(std::move(p));
    impl->warnings = policy::host_warnings(*impl->pol);
    if (struct rlimit fsize{};
        ::getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY) {
      impl->warnings.push_back(fmt::format(
          "cordon runs under a file-size limit of {} bytes (ulimit -f): a job's log stops there "
          "(EFBIG, said in its status){}; lift the limit for cordon",
          fsize.rlim_cur,
          fsize.rlim_cur < static_cast<rlim_t>(kReserveBytes)
              ? ", and the state dir's reserve cannot be made, so every start is refused as if "
                "the disk were full"
              : ""));
    }
    if (impl->pol->git) {
      CORDON_TRY_CTX(g, policy::git_job_policy(*impl->pol), "load policy `{}`", o.policy_path);
      impl->git_pol.emplace(std::move(g));
    }
    if (const auto& sp = impl->pol->seccomp_profile) {
      // load_policy parsed the profile; compiling it is the sandbox layer's (libseccomp), so
      // it is done here: a profile the compiler refuses fails open, naming why, instead of
      // every start later (each would fail with the same message, after the caller moved on).
      CORDON_TRY_CTX(profile, policy::load_seccomp_profile(*sp), "load policy `{}`: seccompProfile",
                     o.policy_path);
      CORDON_CHECK_CTX(sandbox::compile_filters(profile, {}),
                       "load policy `{}`: seccompProfile `{}` (fix the profile, or remove "
                       "seccompProfile to use cordon's default)",
                       o.policy_path, *sp);
    }
  }
  CORDON_TRY_CTX(records, sandbox::CgroupRecords::open(o.state_dir + "/cgroups"),
                 "open cgroup records");
  impl->records.emplace(std::move(records));
  (void)impl->records->sweep();
  // Lease files of cordons that died holding them (the leases are host-wide, not ours alone:
  // only unheld files go).
  (void)sandbox::HostIdLease::sweep();
  CORDON_TRY_CTX(layout, sandbox::detect_cgroup_layout(), "find the cgroup hierarchies");
  impl->layout = layout;
  CORDON_CHECK_CTX(sandbox::prepare_parents(layout), "prepare cordon's cgroups");
  CORDON_CHECK_CTX(impl->recover(), "recover jobs from `{}`", impl->jobs_dir());
  for (size_t i = 0; i < kSpawners; ++i) {
    CORDON_TRY_CTX(spawner, sandbox::SpawnerClient::start(o.spawner_path), "start `{}`",
                   o.spawner_path);
    impl->spawners.push_back(std::make_unique<sandbox::SpawnerClient>(std::move(spawner)));
  }
  if (o.warm_pool && std::min<size_t>(o.warm_pool_size, o.host_id_count / 4) > 0) {
    sandbox::WarmPoolOptions po;
    // Each entry holds a host id of its own: a small id range stays the jobs'.
    po.size = std::min<size_t>(o.warm_pool_size, o.host_id_count / 4);
    po.lease_dir = sandbox::kHostIdLeaseDir;
    po.host_id_base = o.host_id_base;
    po.host_id_count = o.host_id_count;
    impl->pool.emplace(impl->layout, *impl->records, *impl->spawners.front(), std::move(po));
    // Empty until the first job names the shape to build; then refilled by its own thread
    // as jobs settle. When refills fail, spawns go unpooled.
    try {
      impl->pool->start();
    } catch (const std::system_error& e) {
      return std::unexpected(Error::sys(e.code().value(), "start the warm pool's thread"));
    }
  }

  impl->epfd.reset(::epoll_create1(EPOLL_CLOEXEC));
  impl->timerfd.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  impl->wakefd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->epfd || !impl->timerfd || !impl->wakefd) {
    return sys_error("epoll_create1/timerfd_create/eventfd");
  }
  for (auto [fd, id] :
       {std::pair{impl->timerfd.get(), kTimerWatch}, std::pair{impl->wakefd.get(), kWakeWatch}}) {
    struct epoll_event ev {};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(impl->epfd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return sys_error("epoll_ctl");
    }
  }
  for (size_t i = 0; i < impl->spawners.size(); ++i) {
    // Now and for each replacement: the loop reaps and replaces a spawner that died.
    int ep = impl->epfd.get();
    auto watched = impl->spawners[i]->set_watch([ep, i](int pidfd) -> Result<void> {
      struct epoll_event ev {};
      ev.events = EPOLLIN;
      ev.data.u64 = kFirstSpawnerWatch + i;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, pidfd, &ev) != 0) {
        return sys_error("epoll_ctl the spawner's pidfd");
      }
      return {};
    });
    if (!watched) {
      Engine partial(std::move(impl));  // stops the spawners: none is replaced after epfd goes
      return std::unexpected(std::move(watched.error()).wrap("watch spawner {}", i));
    }
  }
  Impl* raw = impl.get();
  // Threads the kernel refuses make std::thread throw; those started before are stopped by
  // ~Engine, which joins what runs.
  try {
    // Named for `top -H` and for capture_bench, which reports each thread's CPU per GiB.
    impl->loop = std::thread([raw] {
      ::pthread_setname_np(::pthread_self(), "cordon-loop");
      sys::block_write_signals_for_thread();
      raw->run_loop();
    });
    for (size_t i = 0; i < kStarters; ++i) {
      impl->starters.emplace_back([raw, i] {
        ::pthread_setname_np(::pthread_self(), "cordon-start");
        sys::block_write_signals_for_thread();
        raw->starter_loop(i);
      });
    }
    impl->releaser = std::thread([raw] {
      ::pthread_setname_np(::pthread_self(), "cordon-release");
      sys::block_write_signals_for_thread();
      raw->release_loop();
    });
    if (!impl->strict_sync()) {
      impl->flusher = std::thread([raw] {
        ::pthread_setname_np(::pthread_self(), "cordon-flush");
        sys::block_write_signals_for_thread();
        raw->flush_loop();
      });
    }
  } catch (const std::system_error& e) {
    Engine partial(std::move(impl));
    return std::unexpected(Error::sys(e.code().value(), "start the engine's threads"));
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Result<JobStatus> Engine::start(const std::string& session, const StartOptions& options) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::optional<Result<JobStatus>> started;
  Impl::Wakes wakes;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.defer_wakes = true;  // a starter is woken once mu is free for it (below)
    ScopeExit on_throw([&m] { m.send_wakes(m.take_wakes()); });
    started.emplace(start_job(session, options));
    on_throw.release();
    wakes = m.take_wakes();
  }
  m.send_wakes(wakes);
  Result<JobStatus>& r = *started;
  if (!r && (r.error().sys_errno() == EMFILE || r.error().sys_errno() == ENFILE)) {
    // Out of descriptors is not out of disk, nor the caller's mistake (a review, session 13:
    // ~1000 queued jobs under a soft limit of 1024).
    return std::unexpected(
        std::move(r.error()).wrap("the engine is out of file descriptors (raise its open-file "
                                  "limit, LimitNOFILE, or wait for running and queued jobs "
                                  "to end; the command was not started)"));
  }
  return std::move(r);
}

Result<JobStatus> Engine::start_job(const std::string& session, const StartOptions& options) {
  auto& m = *impl_;
  CORDON_CHECK(check_session_name(session));
  if (options.pty) {
    CORDON_CHECK(check_terminal_size(options.cols, options.rows));
  }
  policy::StartRequest sr;
  sr.argv = options.argv;
  sr.cwd = options.cwd;
  sr.timeout_ms = options.timeout_ms;
  sr.env = options.env;
  const policy::Policy* session_policy = nullptr;
  if (options.policy == JobPolicy::kGit) {
    if (!m.git_pol) {
      return refusal(
          "the git tools are not enabled: add \"git\": {{\"repoRoot\": \"/path/to/checkout\"}} "
          "to the policy file (see docs/git.md)");
    }
    session_policy = &*m.git_pol;
  } else {
    CORDON_TRY(main_policy, m.policy_for(session));
    session_policy = main_policy;
  }
  auto checked_or = policy::check_start(session_policy, sr);
  // Failure fixed: a missing allowlisted executable came back from start() as an error with
  // no taskId. check_start() reports it as kNotFound after every other check passed: the
  // request was fine and the host is not, so it becomes a job that settles as `failed`.
  bool missing_executable = !checked_or && checked_or.error().code() == ErrorCode::kNotFound;
  if (!checked_or && !missing_executable) {
    return std::unexpected(std::move(checked_or.error()));
  }
  if (m.pol && m.jobs_on_disk >= m.pol->quotas.max_jobs) {
    return refusal("the job quota ({} jobs) is reached; remove settled jobs with command_remove",
                   m.pol->quotas.max_jobs);
  }
  if (m.pol) {
    uint64_t used = m.disk_bytes;
    for (const auto& [id, live] : m.live) {
      used += live->out.written + live->err.written;
    }
    if (used >= m.pol->quotas.max_disk_bytes) {
      return refusal(
          "the disk quota ({} bytes of logs) is reached; remove settled jobs with "
          "command_remove",
          m.pol->quotas.max_disk_bytes);
    }
  }
  // The same bounds per owner (a daemon's peer uid, over all its sessions), so that one uid
  // cannot fill the engine's quotas and have every other uid's start refused.
  if (const std::string owner = m.owner_of(session);
      m.pol && !owner.empty() &&
      (m.pol->quotas.max_jobs_per_uid != 0 || m.pol->quotas.max_disk_bytes_per_uid != 0)) {
    auto found = m.owner_use.find(owner);
    const Impl::OwnerUse use = found == m.owner_use.end() ? Impl::OwnerUse{} : found->second;
    if (m.pol->quotas.max_jobs_per_uid != 0 && use.jobs >= m.pol->quotas.max_jobs_per_uid) {
      return refusal(
          "the job quota of `{}` ({} jobs over all its sessions, quotas.maxJobsPerUid) is "
          "reached; remove settled jobs with command_remove (in any of its sessions)",
          owner, m.pol->quotas.max_jobs_per_uid);
    }
    uint64_t used = use.bytes;
    for (const auto& [id, live] : m.live) {
      if (live->owner == owner) {
        used += live->out.written + live->err.written;
      }
    }
    if (m.pol->quotas.max_disk_bytes_per_uid != 0 && used >= m.pol->quotas.max_disk_bytes_per_uid) {
      return refusal(
          "the disk quota of `{}` ({} bytes of logs over all its sessions, "
          "quotas.maxDiskBytesPerUid) is reached; remove settled jobs with command_remove (in "
          "any of its sessions)",
          owner, m.pol->quotas.max_disk_bytes_per_uid);
    }
  }
  // The reserve is for settles, so that a running command's end reaches the disk: a start
  // never takes it, and is refused while it is short. Failure fixed (a review, session 12):
  // starts on a full disk each freed a step of it for their own record, 154 of them spent it,
  // and the next settle's record (its exit code) was lost (`abandoned` after a restart).
  m.retry_unrecorded();       // a settle's record that could not be written comes first
  if (!m.ensure_reserve()) {  // whole, refilled first if space came back since
    return refusal(
        "the state dir's disk is full: the space kept so that running commands' ends are "
        "recorded is in use; free space there or remove settled jobs with command_remove, then "
        "start again");
  }
  auto job = std::make_unique<Job>();
  Job& j = *job;
  j.id = new_task_id();
  j.session = session;
  j.label = options.label;
  j.pty = options.pty;
  j.stdin_mode = options.stdin_mode;
  j.cols = options.cols;
  j.rows = options.rows;
  if (missing_executable) {
    j.argv = options.argv;
    j.cwd = options.cwd.value_or(m.pol->root);
  } else {
    j.argv = checked_or->argv;
    j.cwd = checked_or->cwd;
    j.timeout_ms = checked_or->timeout_ms;
    j.grace_ms = checked_or->kill_grace_ms;
    j.max_output = checked_or->max_output_bytes;
  }
  j.started_at = rfc3339_now();
  j.start_tp = Clock::now();
  if (!missing_executable) {
    j.checked.emplace(std::move(*checked_or));
  }
  // Failure fixed: an id is the second plus 24 random bits, so 1000 starts within a few
  // seconds collide now and then (the soak's 1000-at-once hit it: the start failed with
  // "mkdir …: EEXIST"). The mkdir claims the id; a taken one is drawn again.
  for (int attempt = 0;; ++attempt) {
    j.dir = m.jobs_dir() + "/" + j.id;
    if (::mkdir(j.dir.c_str(), 0700) == 0) {
      break;
    }
    if (errno != EEXIST || attempt == 16) {
      if (Impl::disk_full(errno)) {  // no inode left while the reserve is whole
        return refusal(
            "the state dir's disk is full (mkdir `{}`: {}); free space there or remove settled "
            "jobs with command_remove, then start again",
            j.dir, errno_name(errno));
      }
      return sys_error("mkdir `{}`", j.dir);
    }
    j.id = new_task_id();
  }
  j.out.path = j.dir + (j.pty ? "/pty.log" : "/stdout.log");
  j.err.path = j.dir + "/stderr.log";
  j.out.index->idx_path = idx_path_for(j.out.path);
  j.err.index->idx_path = idx_path_for(j.err.path);
  // A job that runs now is recorded as running at once: one meta write on the start path.
  j.git = options.policy == JobPolicy::kGit;
  j.owner = m.owner_of(session);
  bool launch_now = !missing_executable && m.has_slot(j);
  if (launch_now) {
    j.state = "running";
  }
  // The job is on disk (meta first, then the session index) before anything runs.
  // Failure fixed: the index append's write was unchecked, so a full disk left a job that
  // ran but no list showed (or half an id that merged with the next job's). Either step
  // failing now refuses the start with nothing of the job left on disk.
  auto recorded = m.write_job_meta(j, /*use_reserve=*/false);
  if (recorded) {
    recorded = m.append_session_index(session, j.id);
  }
  if (!recorded) {
    ::unlink((j.dir + "/meta.json").c_str());
    ::unlink((j.dir + "/.meta.json.tmp").c_str());
    ::rmdir(j.dir.c_str());
    int err = recorded.error().sys_errno();
    if (err == EMFILE || err == ENFILE) {  // start() names that cause; disk space is not it
      return std::unexpected(
          std::move(recorded.error()).wrap("the command's record could not be written"));
    }
    return std::unexpected(std::move(recorded.error())
                               .wrap("the command was not started, its record could not be "
                                     "written (free space in the state dir or remove settled "
                                     "jobs, then start it again)"));
  }
  m.count_on_disk(session, 1, 0);
  ++m.counters[session].running;
  Job* raw = job.get();
  m.live.emplace(j.id, std::move(job));
  if (missing_executable) {
    m.count_running(*raw);
    std::string id = raw->id;
    Job* s = m.fail_start(*raw, checked_or.error().message());
    if (s == nullptr) {
      return refusal("task {} could not start and its record could not be read back", id);
    }
    return m.status_of(*s);
  }
  // launch() can settle (and with a small settled cache free) the job: keep its id.
  const std::string id = raw->id;
  if (launch_now) {
    m.launch(*raw, true);
  } else {
    raw->state = "queued";
    m.queue.push_back(raw);
  }
  Job* now = m.find(id);
  if (now == nullptr) {
    return refusal("task {} settled as it started and its record could not be read back", id);
  }
  return m.status_of(*now);
}

Result<JobStatus> Engine::status(const std::string& session, const std::string& task_id,
                                 std::chrono::milliseconds wait) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  if (!j->settled() && wait.count() > 0) {
    auto until = deadline_after(wait);
    const std::vector<std::string> ids{task_id};
    Impl::Awaiting awaiting(m, ids);
    m.cv.wait_until(lock, until, [&] {
      Job* x = m.find(task_id);
      return x == nullptr || x->settled();
    });
    CORDON_TRY(again, m.owned(session, task_id));
    j = again;
  }
  m.mark_read(*j);
  return m.status_of(*j);
}

Result<std::vector<JobStatus>> Engine::wait(const std::string& session,
                                            const std::vector<std::string>& task_ids,
                                            std::chrono::milliseconds timeout, bool all) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  if (task_ids.empty()) {
    return invalid("command_wait needs at least one taskId");
  }
  std::unique_lock<std::mutex> lock(m.mu);
  for (const auto& id : task_ids) {
    CORDON_CHECK(m.owned(session, id));
  }
  auto done = [&] {
    size_t settled = 0;
    for (const auto& id : task_ids) {
      Job* x = m.find(id);
      if (x == nullptr || x->settled()) {
        ++settled;
      }
    }
    return all ? settled == task_ids.size() : settled > 0;
  };
  if (timeout.count() > 0) {
    Impl::Awaiting awaiting(m, task_ids);
    m.cv.wait_until(lock, deadline_after(timeout), done);
  }
  std::vector<JobStatus> out;
  for (const auto& id : task_ids) {
    // Each was this session's when the wait began; one gone now was removed meanwhile (the
    // policy's retention, or command_remove): it is answered as such, and the others as they
    // are. Failure fixed (a review, session 12): the whole wait failed "unknown taskId".
    if (m.find(id) == nullptr) {
      JobStatus gone;
      gone.task_id = id;
      gone.session = session;
      gone.state = "removed";
      gone.error =
          "removed while waited for (the policy's retention, or command_remove): its record "
          "and output are gone";
      out.push_back(std::move(gone));
      continue;
    }
    CORDON_TRY(j, m.owned(session, id));
    if (j->settled()) {
      m.mark_read(*j);
    }
    out.push_back(m.status_of(*j));
  }
  return out;
}

namespace {

// Pages the log open on `fd` with `shared`'s index, under the index's own lock.
Result<OutputPage> page_fd(int fd, bool complete, SharedIndex& shared, const OutputRequest& req) {
  engine::PageRequest pr;
  pr.offset = req.offset;
  pr.limit = req.limit;
  pr.unit = req.unit == OutputUnit::kBytes   ? engine::Unit::kBytes
            : req.unit == OutputUnit::kLines ? engine::Unit::kLines
                                             : engine::Unit::kChars;
  OutputPage out;
  out.complete = complete;
  std::unique_lock<std::mutex> lock(shared.mu);
  // The size is read under the index's lock: the loop feeds the index after each write, so
  // a size read before the lock could be older than what a feed in between indexed (and the
  // page would fail as "shorter than already indexed").
  CORDON_TRY(st, sys::fstat_fd(fd));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (complete && !shared.idx_tried && !shared.idx_path.empty() && shared.index.seen_bytes() == 0 &&
      size > 0) {
    // First page of a settled log this engine did not capture (a restart) or dropped (the
    // settled cache): its persisted index, if it is one for exactly this log; else a scan.
    shared.idx_tried = true;
    if (auto loaded = load_index(shared.idx_path, size)) {
      shared.index = std::move(*loaded);
    }
  }
  // A running log's index is fed by the event loop, which waits for this lock: bring it up
  // to `size` (at most the bytes not fed yet), then read the page from a copy (32 bytes per
  // MiB of log) with the lock released, so a big page does not hold up the loop and every
  // call behind it. A settled log's index is touched by pagers only: read it in place.
  std::optional<engine::LogIndex> snapshot;
  if (!complete) {
    CORDON_CHECK(shared.index.extend(fd, size));
    snapshot.emplace(shared.index);
    lock.unlock();
  }
  CORDON_TRY(page, engine::read_page(fd, size, complete, snapshot ? *snapshot : shared.index, pr));
  out.offset = page.offset;
  out.total_size = page.total;
  out.next_offset = page.next_offset;
  out.has_more = page.has_more;
  if (req.unit == OutputUnit::kBytes) {
    out.content = base64_encode(page.content);
    out.base64 = true;
  } else {
    out.content = std::move(page.content);
  }
  return out;
}

Result<OutputPage> page_file(const std::string& path, bool complete, SharedIndex& shared,
                             const OutputRequest& req) {
  int fd = open_log(path);
  if (fd < 0) {
    if (errno == ENOENT) {
      OutputPage out;  // nothing written yet
      out.complete = complete;
      return out;
    }
    return sys_error("open `{}`", path);
  }
  UniqueFd guard(fd);
  return page_fd(fd, complete, shared, req);
}

}  // namespace

Result<OutputPage> Engine::output(const std::string& session, const std::string& task_id,
                                  const OutputRequest& request) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  Stream* s = nullptr;
  if (request.stream == "stdout" || request.stream == "pty") {
    if ((request.stream == "pty") != j->pty) {
      return refusal("task `{}` has no `{}` stream; use `{}`", task_id, request.stream,
                     j->pty ? "pty" : "stdout");
    }
    s = &j->out;
  } else if (request.stream == "stderr") {
    s = &j->err;
  } else {
    return invalid("stream must be stdout, stderr or pty, not `{}`", request.stream);
  }
  m.mark_read(*j);
  // Paged without the engine's lock: a cold page of a big log (a scan, when no index was
  // persisted) would otherwise stall every other call and the event loop. The index has its
  // own lock and stays alive with this reference even if the job leaves the settled cache.
  // Settled or not as of now: a job that settles meanwhile is paged as still running once.
  // The log is opened under the lock, while the job is known to exist: a remove (or another
  // session's settle running the retention) between the unlock and the open made a removed
  // job's log read as complete and empty. Failure fixed (a review, session 14).
  const std::string path = s->path;
  const bool complete = j->settled();
  std::shared_ptr<SharedIndex> index = s->index;
  UniqueFd fd(open_log(path));
  if (!fd) {
    if (errno == ENOENT && !complete) {
      lock.unlock();
      return page_file(path, complete, *index, request);  // nothing written yet
    }
    return sys_error("open the log of task {} `{}`", task_id, path);
  }
  lock.unlock();
  return page_fd(fd.get(), complete, *index, request);
}

Result<JobStatus> Engine::kill(const std::string& session, const std::string& task_id, int signal) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  CORDON_CHECK(check_signal(signal));
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  return m.kill_job(*j, signal);
}

Result<std::vector<JobStatus>> Engine::kill_many(const std::string& session,
                                                 const std::vector<std::string>& task_ids,
                                                 int signal) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  CORDON_CHECK(check_signal(signal));
  std::unique_lock<std::mutex> lock(m.mu);
  // Every id first: an unknown one refuses the call before any job is signalled.
  for (const auto& id : task_ids) {
    CORDON_CHECK(m.owned(session, id));
  }
  // A SIGKILL: every sandbox's mount namespace is held before the first one dies. The attach
  // takes each hold already; this retries one the fd margin refused then, before any of the
  // sandboxes dies and the rest compete for the CPU.
  if (signal == SIGKILL) {
    for (const auto& id : task_ids) {
      auto j = m.owned(session, id);
      if (j && (*j)->attached) {
        m.hold_mount_ns(**j);
      }
    }
  }
  // Then every signal under this one hold of the lock, so no settle (the loop's, of the first
  // to die) runs between two of them. Each id is looked up again: a job killed before it
  // started settles inside kill_job, which may evict a settled job from the cache.
  std::vector<JobStatus> out;
  out.reserve(task_ids.size());
  std::optional<Error> first_error;
  for (const auto& id : task_ids) {
    auto j = m.owned(session, id);
    auto st = j ? m.kill_job(**j, signal) : Result<JobStatus>(std::unexpected(j.error()));
    if (st) {
      out.push_back(std::move(*st));
    } else if (!first_error) {
      first_error = st.error();
    }
  }
  if (first_error) {
    return std::unexpected(std::move(*first_error));
  }
  return out;
}

namespace {

// The kernel's canonical-mode line buffer (N_TTY_BUF_SIZE 4096, one byte kept for the end).
constexpr size_t kMaxCanonicalLine = 4095;

// What a canonical (line mode) terminal's line holds after a write: its length and whether
// the write ended on VLNEXT (the next byte is taken literally).
struct LineState {
  size_t len = 0;
  bool lnext = false;
};

// For a terminal in canonical mode (termios `t`): follows the line being typed through
// `bytes` (the write's encoding, its eof character last when `eof`) and returns its state
// after them, or refuses a write that would make a line longer than the kernel keeps. Failure
// fixed (a review, session 13): 10 000 bytes written as one line reached `read` as 4095, the
// rest dropped without a word. An eof after a partial line is doubled: the first VEOF only
// hands the partial line over, the second ends the input (a single one left `wc -c` waiting).
// The line discipline's canonical mode as the kernel runs it (drivers/tty/n_tty.c), for the
// length of the line each write makes: a line over kMaxCanonicalLine would be cut without a
// word, so the write is refused whole. It must never count short (a cut let through); where it
// cannot follow the kernel (VWERASE erases a word it does not keep) it counts long.
// Failure fixed (a review, session 31): VLNEXT (^V under IEXTEN) was not followed, so
// "a…a ^V \n b…b" counted two short lines where the kernel kept one long one and dropped 1906
// bytes, ^V^U and ^V^C were taken as kill and interrupt, INLCR's \n (a plain byte then) ended a
// line, EOL2 did without IEXTEN, and an eof after a trailing ^V was taken as a literal ^D (the
// input did not end).
Result<LineState> canonical_line(Job& j, const struct termios& t, std::string& bytes, bool eof) {
  if ((t.c_lflag & ICANON) == 0) {
    return LineState{};  // the program reads bytes, not lines: no line buffer, no limit
  }
  auto cc = [&](int i) { return static_cast<unsigned char>(t.c_cc[i]); };
  auto is = [&](unsigned char c, int i) { return cc(i) != _POSIX_VDISABLE && c == cc(i); };
  const bool iexten = (t.c_lflag & IEXTEN) != 0;
  const bool veof_on = cc(VEOF) != _POSIX_VDISABLE;
  const unsigned char veof = veof_on ? cc(VEOF) : 0x04;
  if (eof && !bytes.empty()) {
    bytes.back() = static_cast<char>(veof);  // the encoder's ^D, as this terminal spells it
  }
  size_t len = j.line_len, longest = 0;
  bool lnext = j.line_lnext;
  // A byte as the line discipline sees it (ISTRIP, then IUCLC's lower case under IEXTEN, as
  // the kernel's tolower: ASCII and Latin-1), and how many bytes it takes in the line (PARMRK
  // doubles a 0xFF, to tell it from its own marks).
  auto seen = [&](unsigned char c) {
    if ((t.c_iflag & ISTRIP) != 0) {
      c &= 0x7f;
    }
    if ((t.c_iflag & IUCLC) != 0 && iexten &&
        ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7))) {
      c = static_cast<unsigned char>(c + 32);
    }
    return c;
  };
  auto width = [&](unsigned char c) -> size_t {
    return c == 0xFF && (t.c_iflag & PARMRK) != 0 ? 2 : 1;
  };
  size_t end = eof ? bytes.size() - 1 : bytes.size();
  for (size_t i = 0; i < end; ++i) {
    unsigned char c = seen(static_cast<unsigned char>(bytes[i]));
    if (lnext || (t.c_lflag & EXTPROC) != 0) {
      // Taken as it is: a plain byte of the line, whatever it is (EXTPROC: every byte).
      lnext = false;
      len += width(c);
      longest = std::max(longest, len);
      continue;
    }
    if ((t.c_iflag & IXON) != 0 && (is(c, VSTART) || is(c, VSTOP))) {
      continue;  // flow control: not in the line
    }
    if ((t.c_lflag & ISIG) != 0 && (is(c, VINTR) || is(c, VQUIT) || is(c, VSUSP))) {
      if ((t.c_lflag & NOFLSH) == 0) {
        len = 0;  // a signal character flushes the line typed so far
      }
      continue;
    }
    if (c == '\r' && (t.c_iflag & (IGNCR | ICRNL)) != 0) {
      if ((t.c_iflag & IGNCR) != 0) {
        continue;  // the kernel drops it
      }
      c = '\n';
    } else if (c == '\n' && (t.c_iflag & INLCR) != 0) {
      c = '\r';
    }
    if (is(c, VERASE)) {
      len -= len > 0 ? 1 : 0;
    } else if (is(c, VKILL)) {
      len = 0;
    } else if (iexten && is(c, VWERASE)) {
      // Erases a word the model does not keep: counted as nothing erased (long, never short).
    } else if (iexten && is(c, VLNEXT)) {
      lnext = true;
    } else if (iexten && (t.c_lflag & ECHO) != 0 && is(c, VREPRINT)) {
      // Reprints the line: not in it.
    } else if (c == '\n' || (veof_on && c == veof) || is(c, VEOL) || (iexten && is(c, VEOL2))) {
      len = 0;
    } else {
      len += width(c);
      longest = std::max(longest, len);
    }
  }
  if (eof && lnext) {
    // A trailing VLNEXT would take the eof's ^D as a plain byte: it takes one of its own, and
    // the line it ends is not empty, so the eof below needs two.
    bytes.insert(bytes.size() - 1, 1, static_cast<char>(veof));
    longest = std::max(longest, ++len);
    lnext = false;
  }
  if (longest > kMaxCanonicalLine) {
    return refusal(
        "task `{}`: its terminal is in canonical (line) mode, where the kernel keeps at most {} "
        "bytes of a line and drops the rest, and this write would make a line of {} bytes; "
        "nothing of this write was sent: end lines sooner, or put long text in a file under "
        "the working root for the command to read",
        j.id, kMaxCanonicalLine, longest);
  }
  if (eof) {
    if (len > 0) {
      bytes.insert(bytes.size() - 1, 1, static_cast<char>(veof));
    }
    len = 0;
  }
  return LineState{len, lnext};
}

}  // namespace

Result<void> Engine::write(const std::string& session, const std::string& task_id,
                           const WriteInput& input) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  if (j->settled()) {
    return refusal("task `{}` has already settled ({}); nothing reads its input", task_id,
                   j->state);
  }
  if (!j->pty && j->stdin_mode != StdinMode::kPipe) {
    return refusal("task `{}` was started without stdin; start it with stdin \"pipe\" or pty",
                   task_id);
  }
  if (!j->stdin_closed.empty()) {
    return refusal("task `{}`: {}; nothing of this write was sent", task_id, j->stdin_closed);
  }
  std::string bytes;
  LineState line_state;
  if (j->pty) {
    engine::WriteRequest wr;
    wr.data = input.data;
    wr.paste = input.paste;
    wr.keys = input.keys;
    wr.submit = input.submit;
    wr.eof = input.eof;
    // The terminal's termios, read through the master (not spawned yet: a fresh pty's).
    struct termios t = engine::fresh_pty_termios();
    if (j->pty_master && ::tcgetattr(j->pty_master.get(), &t) != 0) {
      t = engine::fresh_pty_termios();
    }
    engine::TerminalModes modes = j->modes.modes();
    modes.line_controls = engine::line_controls(t);
    modes.strip_high_bit = (t.c_iflag & ISTRIP) != 0;
    CORDON_TRY(enc, engine::encode_write(wr, modes));
    bytes = std::move(enc);
    CORDON_TRY(line, canonical_line(*j, t, bytes, input.eof));
    line_state = line;
  } else {
    if (!input.keys.empty() || input.paste || input.submit) {
      return refusal("keys, paste and submit need a pty job; for a pipe send `data` (and `eof`)");
    }
    // Until its sandbox exists (queued, or being spawned) the bytes wait in pending_stdin.
    // Failure fixed (a review, session 11): after an eof whose bytes had not all been written
    // yet, more data was accepted and sent before the close; now eof ends the input at once.
    if (j->stdin_eof_pending || (j->attached && !j->stdin_w)) {
      return refusal(
          "task `{}`: its input is already closed (eof was sent); nothing more can be sent to "
          "this command",
          task_id);
    }
    bytes = input.data.value_or("");
    if (bytes.empty() && !input.eof) {
      return invalid("nothing to write: give data or eof");
    }
  }
  size_t waiting = j->pending_stdin.size() - j->pending_off;
  // Failure fixed (a review, session 13): a write was checked before it was appended and then
  // taken whole, so one write of up to the 16 MiB a request line holds went into the backlog,
  // and 60 queued jobs sent 15 MiB each held 1 GB of the daemon. The backlog, this write
  // included, never passes kMaxPendingStdin now.
  // A refused write takes nothing, its eof neither: the input stays open for the data to be
  // sent again (an eof taken without its data would end the command's input short). The
  // messages say so (a review, session 35: docs/tools.md said the eof was still taken).
  if (!bytes.empty() && waiting + bytes.size() > kMaxPendingStdin) {
    const char* eof_too = input.eof ? ", its eof neither (the input stays open)" : "";
    if (bytes.size() > kMaxPendingStdin) {
      return refusal(
          "task `{}`: a write of {} bytes is more than the {} bytes of input the engine keeps for "
          "a command; nothing of it was queued{}: send it in parts of at most {} bytes, each once "
          "the command has read the one before{}",
          task_id, bytes.size(), kMaxPendingStdin, eof_too, kMaxPendingStdin,
          input.eof ? ", and eof with the last" : "");
    }
    return refusal(
        "task `{}` has not read the {} bytes of input it was sent before, and with this write's "
        "{} the engine would keep more than {} bytes for it; nothing of this write was queued{}: "
        "send it again once the command has read its input, or end its input with eof",
        task_id, waiting, bytes.size(), kMaxPendingStdin, eof_too);
  }
  if (!j->pty && input.eof) {
    j->stdin_eof_pending = true;
  }
  if (j->pty) {
    j->line_len = line_state.len;
    j->line_lnext = line_state.lnext;
  }
  j->pending_stdin += bytes;
  m.flush_stdin(*j);
  if (!j->stdin_closed.empty()) {
    return refusal("task `{}`: {}", task_id, j->stdin_closed);
  }
  return {};
}

Result<void> Engine::resize(const std::string& session, const std::string& task_id, uint16_t cols,
                            uint16_t rows) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  CORDON_CHECK(check_terminal_size(cols, rows));
  if (!j->pty) {
    return refusal("task `{}` has no terminal to resize: it was started without pty", task_id);
  }
  if (j->settled()) {
    return refusal("task `{}` has no terminal to resize: it has settled ({})", task_id, j->state);
  }
  // A queued job, or one whose terminal has not reached the engine yet, gets the size when it
  // does (the sandbox's spec, then the master's TIOCSWINSZ).
  if (j->pty_master) {
    struct winsize ws {};
    ws.ws_col = cols;
    ws.ws_row = rows;
    if (::ioctl(j->pty_master.get(), TIOCSWINSZ, &ws) != 0) {
      return sys_error("ioctl TIOCSWINSZ");
    }
  }
  if (j->cols == cols && j->rows == rows) {
    return {};  // the size it has: nothing to record (a terminal sends a resize per drag step)
  }
  j->cols = cols;
  j->rows = rows;
  // Into the job's record too, so an engine that dies meanwhile still knows the size its job
  // ran at (until session 33 only the start's and the settle's were written). Without the
  // reserve (a full disk is for settles); the terminal has the size whatever the record says.
  (void)m.write_job_meta(*j, /*use_reserve=*/false);
  return {};
}

Result<std::vector<JobStatus>> Engine::list(const std::string& session,
                                            const std::optional<std::string>& state) {
  CORDON_TRY(page, list_page(session, {.state = state}));  // list_page blocks the signals
  return std::move(page.jobs);
}

Result<ListPage> Engine::list_page(const std::string& session, const ListRequest& request) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  ListPage page;
  CORDON_TRY(ids, m.session_ids(session));
  for (const auto& id : ids) {
    Job* j = m.find(id);
    if (j == nullptr || j->session != session) {
      continue;
    }
    if (request.state && j->state != *request.state) {
      continue;
    }
    if (page.total >= request.offset && page.jobs.size() < request.limit) {
      page.jobs.push_back(m.status_of(*j));  // listing does not mark anything read
    }
    ++page.total;
  }
  return page;
}

Result<JobStatus> Engine::peek(const std::string& session, const std::string& task_id) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  return m.status_of(*j);  // as list() does: nothing is marked read
}

Result<void> Engine::remove(const std::string& session, const std::string& task_id) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  CORDON_TRY(j, m.owned(session, task_id));
  if (!j->settled()) {
    return refusal("task `{}` is still {}; kill it first (command_kill), then remove it", task_id,
                   j->state);
  }
  auto removed = m.remove_settled(*j);
  m.retry_unrecorded();  // the room it freed
  return removed;
}

Result<OutputPage> Engine::retrieve(const std::string& session, const std::string& artifact_id,
                                    const OutputRequest& request) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  auto& m = *impl_;
  auto unknown = [&] {
    return std::unexpected(
        Error(ErrorCode::kNotFound, 0, fmt::format("unknown artifactId `{}`", artifact_id)));
  };
  // Artifacts are `a<task id without its t>-<stream>`: a session reads only its own jobs'
  // artifacts (ids are time-based, so they must not be a capability).
  size_t dash = artifact_id.rfind('-');
  if (!valid_name(artifact_id) || artifact_id[0] != 'a' || dash == std::string::npos || dash < 2) {
    return unknown();
  }
  std::shared_ptr<SharedIndex> job_index;
  std::string log_path, path;
  int fd = -1, open_errno = 0;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    Job* j = m.find("t" + artifact_id.substr(1, dash - 1));
    if (j == nullptr || j->session != session) {
      return unknown();
    }
    std::string stream = artifact_id.substr(dash + 1);
    Stream* s = stream == "stderr"                                               ? &j->err
                : (stream == "stdout" && !j->pty) || (stream == "pty" && j->pty) ? &j->out
                                                                                 : nullptr;
    if (s != nullptr && j->settled()) {
      job_index = s->index;
      log_path = s->path;
    }
    // Opened under the lock, while the job is known to exist, as output opens its log: an
    // open let go of the lock first could find the file before a remove and be in the
    // process's table only after the releaser checked it had no reader (an on-access scanner's
    // FAN_OPEN_PERM holds an open that long), and the page read the log cut to nothing (a
    // review, session 39).
    path = m.artifacts_dir() + "/" + artifact_id;
    fd = open_log(path);
    if (fd < 0 && errno == ENOENT && !log_path.empty()) {
      // The link could not be made when the job settled (the state dir out of space or
      // inodes: its error says so); the artifact is its log all the same.
      path = log_path;
      fd = open_log(path);
    }
    open_errno = errno;
  }
  if (fd < 0) {
    if (open_errno == ENOENT) {
      return unknown();
    }
    return errno_error(open_errno, "open `{}`", path);
  }
  UniqueFd guard(fd);
  CORDON_TRY(st, sys::fstat_fd(fd));
  // The artifact is a hard link to the job's log: the same file, so the job's index (warm
  // from output, capture or its idx file) serves it. Anything else gets an index of its own.
  struct stat log_st {};
  if (job_index && ::stat(log_path.c_str(), &log_st) == 0 && log_st.st_dev == st.st_dev &&
      log_st.st_ino == st.st_ino) {
    return page_fd(fd, true, *job_index, request);
  }
  return page_fd(fd, true, *m.artifact_index(artifact_id, st), request);
}

uint64_t Engine::subscribe_settled(SettleCallback callback) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  uint64_t id = impl_->next_settle_sub++;
  impl_->settle_subs.emplace(id, std::move(callback));
  return id;
}

void Engine::unsubscribe_settled(uint64_t id) {
  // Callbacks run with mu held, so holding it here waits out one in flight.
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->settle_subs.erase(id);
}

Counters Engine::counters(const std::string& session) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Read only: every unnamed daemon connection is a session of its own, and an entry made
  // here for each would stay for the engine's life.
  auto it = impl_->counters.find(session);
  return it == impl_->counters.end() ? Counters{} : it->second;
}

Result<std::vector<std::string>> Engine::known_ids(const std::string& session) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->session_ids(session);
}

Result<std::vector<std::string>> Engine::sessions() {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->session_names();
}

Result<size_t> Engine::end_session(const std::string& session, std::chrono::milliseconds settle) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  CORDON_CHECK(check_session_name(session));
  auto& m = *impl_;
  Result<size_t> removed = 0;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    // Every unsettled job is signalled under this one hold of the lock (a queued one settles
    // `killed` at once, which changes `live`: the ids first). Failure fixed (a review, session
    // 14): the ids were taken, the lock let go, then kill_many, which refuses the whole call
    // for one id that retention removed meanwhile: the session's other jobs ran on.
    std::vector<std::string> unsettled;
    for (const auto& [id, j] : m.live) {
      if (j->session == session) {
        unsettled.push_back(id);
      }
    }
    for (const auto& id : unsettled) {
      if (auto it = m.live.find(id); it != m.live.end()) {
        (void)m.kill_job(*it->second, SIGTERM);
      }
    }
    auto still_running = [&] {
      return std::any_of(m.live.begin(), m.live.end(),
                         [&](const auto& entry) { return entry.second->session == session; });
    };
    m.cv.wait_until(lock, deadline_after(settle), [&] { return !still_running(); });
    removed = m.remove_settled_session(session, lock);
  }
  release_session(session);
  return removed;
}

// Failure fixed (a review, session 11): with rootPerSession every daemon connection's unnamed
// session kept its root's fd and directory for the daemon's life (200 `cordon run --socket`
// calls: 200 fds, 200 directories), and the directory was made even for a refused start.
void Engine::release_session(const std::string& session) {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  if (!valid_name(session)) {
    return;  // never one of ours: its directory is no session's to remove
  }
  auto& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.session_policies.erase(session) == 0 || !m.pol) {
    return;
  }
  // Empty only: whatever a command left there is the user's. ENOTEMPTY leaves it as it is.
  (void)::unlinkat(m.pol->root_fd->get(), session.c_str(), AT_REMOVEDIR);
}

std::optional<GitSettings> Engine::git_settings() {
  sys::WriteSignalsBlock write_signals;  // an embedder's SIGPIPE and SIGXFSZ
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->pol || !impl_->pol->git) {
    return std::nullopt;
  }
  const policy::GitPolicy& g = *impl_->pol->git;
  return GitSettings{g.repo_root,        g.root,         g.binary, g.timeout_ms,
                     g.max_output_bytes, g.preview_chars};
}

}  // namespace cordon
