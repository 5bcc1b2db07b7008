#include "engine/supervise.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <termios.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sandbox/prepare.hpp"
#include "sandbox/status.hpp"
#include "base/strings.hpp"
#include "sys/fs.hpp"
#include "sys/sigpipe.hpp"
#include "sys/syscalls.hpp"

namespace cordon::engine {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC in libstdc++, as the timerfd

// 1 MiB reads match the 1 MiB pipes the caller sets up: measured ≈ 2 GB/s against ≈ 0.55 GB/s
// with 64 KiB (DESIGN.md, "Capture").
constexpr size_t kOutputBufferSize = size_t{1} << 20;
constexpr size_t kInputBufferSize = size_t{64} << 10;
// Reads per wakeup per relay: one stream at full speed must not starve the other, the
// status channel or the signals. Level-triggered epoll brings us back for the rest.
constexpr int kPumpBudget = 4;
constexpr int kStatusBudget = 16;
// After the drain deadline, how many more reads a stream gets before it is abandoned; bounds
// the last drain against a leaked writer that never stops.
constexpr int kFinalDrainReads = 64;

enum Tag : uint64_t {
  // Endpoints (indices into Supervisor::endpoints_).
  kOutSrc = 0,  // stdout pipe or pty master
  kErrSrc,
  kOutDst,  // dup of out_fd
  kErrDst,  // dup of err_fd
  kInSrc,   // dup of stdin_fd (or terminal_fd in tty mode)
  kInDst,   // stdin_write pipe (tty mode uses kOutSrc, the master, instead)
  kEndpointCount,
  // Control descriptors.
  kTagPidfd = 100,
  kTagStatus,
  kTagSignal,
  kTagTimer,
};

enum RelayId { kStdoutRelay = 0, kStderrRelay, kStdinRelay, kRelayCount };

struct Endpoint {
  int fd = -1;
  bool pollable = true;  // false for regular files: epoll refuses them (EPERM), always ready
  bool in_epoll = false;
  uint32_t events = 0;
  bool socket = false;  // a caller's socket: recv/send with MSG_DONTWAIT (CallerEnd)
  bool nowait = false;  // a caller's pipe or device: read with preadv2 RWF_NOWAIT (CallerEnd)
};

// One direction of data: src endpoint → buffer → dst endpoint.
struct Relay {
  const char* name = "";
  int src = -1;  // endpoint index, -1 when there is none (yet)
  int dst = -1;
  std::unique_ptr<char[]> buf;
  size_t buf_size = 0;
  size_t off = 0, len = 0;  // pending bytes are buf[off, len)
  bool src_eof = false;     // nothing more will be read: EOF, stopped or abandoned
  bool dst_dead = false;    // writes failed (or no destination): data is discarded
  int dst_errno = 0;
  bool output = false;      // counted and capped; keeps reading when the destination fails
  bool pipe_grown = false;  // sandbox::grow_output_pipe
  uint64_t count = 0;
  bool capped = false;
  bool is_pty_src = false;  // a pty master reads EIO once every slave is closed: that is EOF
  int final_reads = 0;      // reads left after the drain deadline (final_drain)

  bool pending() const { return off < len; }
  bool done() const { return src_eof && (!pending() || dst_dead); }
};

// Blocks the signals supervise() handles through its signalfd (`handled`), SIGPIPE so a closed
// destination yields EPIPE instead of killing cordon, and SIGXFSZ so a destination past the
// caller's file-size limit (`ulimit -f`) yields EFBIG, a warning, instead of killing cordon
// without a status (a review, session 35); restores the old mask on destruction.
class SignalMask {
 public:
  Result<void> block(const sigset_t& set) {
    write_signals_.emplace();
    int rc = pthread_sigmask(SIG_BLOCK, &set, &old_);
    if (rc != 0) {
      write_signals_.reset();
      return errno_error(rc, "pthread_sigmask SIG_BLOCK");
    }
    active_ = true;
    return {};
  }
  // The handled signals come back first; then write_signals_, destroyed after the body, takes
  // a SIGPIPE or SIGXFSZ our own write raised (unblocking would deliver it and kill cordon
  // after the fact) and restores the mask from before.
  ~SignalMask() {
    if (active_) {
      (void)pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // cannot fail with a valid set
    }
  }

 private:
  std::optional<sys::WriteSignalsBlock> write_signals_;  // SIGPIPE and SIGXFSZ
  sigset_t old_{};
  bool active_ = false;
};

// Raw mode on the caller's terminal; the destructor restores termios and drops typed-ahead
// input so keystrokes meant for the command do not run in the caller's shell.
class RawTerminal {
 public:
  Result<void> enter(int fd) {
    if (tcgetattr(fd, &saved_) != 0) {
      if (errno == ENOTTY) {
        return {};  // not a terminal: nothing to put in raw mode
      }
      return sys_error("tcgetattr terminal fd {}", fd);
    }
    termios raw = saved_;
    cfmakeraw(&raw);
    if (tcsetattr(fd, TCSADRAIN, &raw) != 0) {
      return sys_error("tcsetattr raw terminal fd {}", fd);
    }
    fd_ = fd;
    return {};
  }
  ~RawTerminal() {
    if (fd_ >= 0) {
      (void)tcsetattr(fd_, TCSADRAIN, &saved_);  // best effort in a destructor
      (void)tcflush(fd_, TCIFLUSH);
    }
  }

 private:
  int fd_ = -1;
  termios saved_{};
};

// The caller's descriptor as the relay uses it: never blocking, without touching the flags of
// a description the caller shares with other processes.
struct CallerEnd {
  int fd = -1;
  bool socket = false;  // read and written with MSG_DONTWAIT (recv/send)
  bool nowait = false;  // read with preadv2(RWF_NOWAIT), until the kernel says EOPNOTSUPP
};

// The caller's descriptors, each as a description of cordon's own where one can be had, so
// out_fd == err_fd can sit in epoll twice and O_NONBLOCK stays ours. O_NONBLOCK on the
// caller's own description would be seen by every process sharing it (a sibling writing to
// the same pipe got EAGAIN and lost its output) and would outlive a SIGKILLed cordon (a
// review, session 34). So:
// - a terminal (not a pty master, not /dev/tty or /dev/ptmx, which open another terminal) and
//   the write side of a pipe or FIFO are opened again through /proc/self/fd: a new
//   description of the same tty or pipe, kept only if fstat shows the same file;
// - a socket is read and written with MSG_DONTWAIT;
// - a regular file, directory or block device is never waited on (epoll refuses it) and is
//   only dup'ed;
// - the read side of a pipe, and a device that is no terminal (/dev/null, /dev/zero), is read
//   with preadv2(RWF_NOWAIT), which never waits whatever the description's flags (a reader
//   opened anew with O_NONBLOCK is not told of a hang-up by writers it never saw, so its EOF
//   would never be polled). Since session 35 (a review): the flag was set on the caller's
//   stdin pipe, and a SIGKILLed cordon left it there, so the caller's next `read` got EAGAIN.
//   Where the kernel has no RWF_NOWAIT for it (a named FIFO here: EOPNOTSUPP), the first read
//   falls back to the flag (fallback_nonblocking);
// - anything else (event fds; a reopen that failed) gets O_NONBLOCK on the caller's
//   description, put back after.
class CallerFds {
 public:
  // `access` is O_RDONLY or O_WRONLY: how the relay uses the descriptor.
  Result<CallerEnd> add(int fd, int access) {
    if (fd < 0) {
      return CallerEnd{};
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      return sys_error("fstat fd {}", fd);
    }
    if (auto own = reopen(fd, access, st)) {
      fds_.push_back({UniqueFd(*own), 0, false});
      return CallerEnd{*own, false};
    }
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
      return sys_error("fcntl F_DUPFD_CLOEXEC fd {}", fd);
    }
    bool socket = S_ISSOCK(st.st_mode);
    bool never_waits = S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISBLK(st.st_mode);
    bool nowait = access == O_RDONLY && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode));
    int flags = 0;
    if (!socket && !never_waits) {
      flags = fcntl(fd, F_GETFL);
      if (flags < 0) {
        ::close(copy);
        return sys_error("fcntl F_GETFL fd {}", fd);
      }
    }
    fds_.push_back({UniqueFd(copy), flags, !socket && !never_waits && !nowait});
    return CallerEnd{copy, socket, nowait};
  }
  // A descriptor add() gave for RWF_NOWAIT reads that the kernel reads no such way: it gets
  // O_NONBLOCK on the caller's description after all, put back at the end.
  Result<void> fallback_nonblocking(int fd) {
    for (auto& entry : fds_) {
      if (entry.fd.get() != fd || entry.changed) {
        continue;
      }
      if (fcntl(fd, F_SETFL, entry.flags | O_NONBLOCK) != 0) {
        return sys_error("fcntl F_SETFL O_NONBLOCK");
      }
      entry.changed = true;
    }
    return {};
  }
  // Separate from add(): flags of every fd are read before any is changed, since two of them
  // may share one description (stdout and stderr on the same terminal).
  Result<void> set_nonblocking() {
    for (auto& entry : fds_) {
      if (!entry.needs_flag) {
        continue;
      }
      if (fcntl(entry.fd.get(), F_SETFL, entry.flags | O_NONBLOCK) != 0) {
        return sys_error("fcntl F_SETFL O_NONBLOCK");
      }
      entry.changed = true;
    }
    return {};
  }
  ~CallerFds() {
    for (auto& entry : fds_) {
      if (entry.changed) {
        (void)fcntl(entry.fd.get(), F_SETFL, entry.flags);  // best effort in a destructor
      }
    }
  }

 private:
  // A new non-blocking description of the same terminal or pipe, or nullopt (see the class).
  static std::optional<int> reopen(int fd, int access, const struct stat& st) {
    bool tty = S_ISCHR(st.st_mode) && isatty(fd) != 0;
    if (tty) {
      unsigned int pty_number = 0;
      bool master = ioctl(fd, TIOCGPTN, &pty_number) == 0;
      bool alias = st.st_rdev == makedev(5, 0) || st.st_rdev == makedev(5, 2);
      if (master || alias) {
        return std::nullopt;  // opening it again would open another terminal
      }
    } else if (!(S_ISFIFO(st.st_mode) && access == O_WRONLY)) {
      return std::nullopt;
    }
    std::string path = fmt::format("/proc/self/fd/{}", fd);
    int own = ::open(path.c_str(), access | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (own < 0) {
      return std::nullopt;  // ENXIO: a FIFO whose reader is gone; EACCES; no /proc
    }
    struct stat now {};
    if (fstat(own, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino ||
        now.st_rdev != st.st_rdev) {
      ::close(own);
      return std::nullopt;
    }
    return own;
  }

  struct Entry {
    UniqueFd fd;
    int flags;
    bool needs_flag;  // the caller's own description, made non-blocking for the run
    bool changed = false;
  };
  std::vector<Entry> fds_;
};

Result<void> set_nonblocking(int fd, const char* what) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) {
    return sys_error("fcntl F_GETFL {}", what);
  }
  if ((flags & O_NONBLOCK) == 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return sys_error("fcntl F_SETFL O_NONBLOCK {}", what);
  }
  return {};
}

// waitid() reports a siginfo; callers expect the classic wait(2) encoding.
int encode_wait_status(const siginfo_t& info) {
  switch (info.si_code) {
    case CLD_EXITED:
      return (info.si_status & 0xff) << 8;
    case CLD_KILLED:
      return info.si_status & 0x7f;
    case CLD_DUMPED:
      return (info.si_status & 0x7f) | 0x80;
    default:
      return 0;
  }
}

timespec to_timespec(Clock::time_point t) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  return timespec{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

class Supervisor {
 public:
  Supervisor(SandboxHandles& handles, const SuperviseOptions& options, const KillHooks& hooks)
      : handles_(handles), options_(options), hooks_(hooks), start_(Clock::now()) {}

  Result<Outcome> run() {
    CORDON_CHECK(setup());
    while (!finished()) {
      CORDON_CHECK(update_interests());
      CORDON_CHECK(arm_timer());
      std::array<epoll_event, 16> events;
      int n = epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                         immediate_ ? 0 : -1);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return sys_error("epoll_wait");
      }
      if (immediate_) {
        // Some relay waits on a regular file, which is always ready and never in epoll.
        for (auto& relay : relays_) {
          CORDON_CHECK(pump(relay));
        }
      }
      for (int i = 0; i < n; ++i) {
        CORDON_CHECK(dispatch(events[static_cast<size_t>(i)].data.u64));
      }
    }
    drain_caller_signals();
    return outcome();
  }

  // After an internal failure nothing supervises the sandbox any more: it must not outlive us.
  void kill_on_error() { kill_all(); }

 private:
  Result<void> setup() {
    if (options_.tty && handles_.stdout_read) {
      return invalid("supervise: tty mode takes its output from the pty master, not a pipe");
    }
    if (!handles_.pidfd || !handles_.status) {
      return invalid("supervise: the pidfd and the status channel are required");
    }
    // The signals init forwards (a terminal's Ctrl-\ is SIGQUIT: since the sandbox has a
    // session of its own it reaches only cordon, which died of it before, leaving no status),
    // but those the caller set to be ignored: `nohup` ignores SIGHUP, a shell's background job
    // SIGINT and SIGQUIT, and a blocked signal is queued even when ignored, so a Ctrl-C meant
    // for the foreground killed a background `cordon run` (a review, session 35).
    sigset_t set;
    sigemptyset(&set);
    for (int sig : sandbox::kForwardedSignals) {
      struct sigaction current {};
      if (sigaction(sig, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) {
        continue;
      }
      sigaddset(&set, sig);
    }
    sigaddset(&set, SIGWINCH);
    CORDON_CHECK(mask_.block(set));

    epoll_ = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_) {
      return sys_error("epoll_create1");
    }
    signal_ = UniqueFd(signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
    if (!signal_) {
      return sys_error("signalfd");
    }
    timer_ = UniqueFd(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!timer_) {
      return sys_error("timerfd_create");
    }
    CORDON_CHECK(set_nonblocking(handles_.status.get(), "status channel"));
    CORDON_CHECK(epoll_add(handles_.pidfd.get(), kTagPidfd, EPOLLIN));
    CORDON_CHECK(epoll_add(handles_.status.get(), kTagStatus, EPOLLIN));
    CORDON_CHECK(epoll_add(signal_.get(), kTagSignal, EPOLLIN));
    CORDON_CHECK(epoll_add(timer_.get(), kTagTimer, EPOLLIN));

    // Caller fds: dup'ed, flags read for all before any is changed.
    CORDON_TRY(out_dst, callers_.add(options_.out_fd, O_WRONLY));
    CORDON_TRY(err_dst, callers_.add(options_.err_fd, O_WRONLY));
    int input = options_.stdin_fd;
    if (input < 0 && options_.tty) {
      input = options_.terminal_fd;
    }
    bool have_input_dst = options_.tty || handles_.stdin_write.valid();
    CORDON_TRY(in_src, callers_.add(have_input_dst ? input : -1, O_RDONLY));
    CORDON_CHECK(callers_.set_nonblocking());
    if (options_.tty && options_.terminal_fd >= 0) {
      CORDON_CHECK(terminal_.enter(options_.terminal_fd));
    }

    for (auto [id, end] :
         {std::pair{kOutDst, out_dst}, std::pair{kErrDst, err_dst}, std::pair{kInSrc, in_src}}) {
      endpoints_[id].fd = end.fd;
      endpoints_[id].socket = end.socket;
      endpoints_[id].nowait = end.nowait;
    }
    if (handles_.stdout_read) {
      CORDON_CHECK(set_nonblocking(handles_.stdout_read.get(), "stdout pipe"));
      endpoints_[kOutSrc].fd = handles_.stdout_read.get();
    }
    if (handles_.stderr_read) {
      CORDON_CHECK(set_nonblocking(handles_.stderr_read.get(), "stderr pipe"));
      endpoints_[kErrSrc].fd = handles_.stderr_read.get();
    }
    if (in_src.fd < 0 && !options_.tty) {
      handles_.stdin_write.reset();  // nothing to feed: the command sees EOF at once
    }
    if (handles_.stdin_write && !options_.tty) {
      CORDON_CHECK(set_nonblocking(handles_.stdin_write.get(), "stdin pipe"));
      endpoints_[kInDst].fd = handles_.stdin_write.get();
    }

    Relay& out = relays_[kStdoutRelay];
    out.name = "stdout";
    out.output = true;
    out.src = kOutSrc;
    out.dst = kOutDst;
    // In tty mode the source appears with the kPtyMaster record.
    out.src_eof = !options_.tty && !handles_.stdout_read;
    out.is_pty_src = options_.tty;
    Relay& err = relays_[kStderrRelay];
    err.name = "stderr";
    err.output = true;
    err.src = kErrSrc;
    err.dst = kErrDst;
    err.src_eof = !handles_.stderr_read;
    Relay& in = relays_[kStdinRelay];
    in.name = "stdin";
    in.src = kInSrc;
    in.dst = options_.tty ? kOutSrc : kInDst;
    in.src_eof = in_src.fd < 0;
    for (Relay* relay : {&out, &err}) {
      relay->buf_size = kOutputBufferSize;
      relay->dst_dead = endpoints_[relay->dst].fd < 0;  // no destination: count and discard
    }
    in.buf_size = kInputBufferSize;
    // Not zeroed: a relay writes on only the bytes a read() put there, and zeroing 2 MiB cost
    // every run its page faults (docs/performance.md, "cordon run").
    for (auto& relay : relays_) {
      if (!relay.src_eof) {
        relay.buf = std::make_unique_for_overwrite<char[]>(relay.buf_size);
      }
    }

    if (options_.timeout.count() > 0) {
      timeout_deadline_ = start_ + options_.timeout;
    }
    if (options_.socket_memory_limit > 0) {
      if (auto fd = open_sockstat(handles_.pidfd.get())) {
        sockstat_ = std::move(*fd);
        socket_deadline_ = start_ + kSocketCheckEvery;
      }
    }
    return {};
  }

  Result<void> epoll_add(int fd, uint64_t tag, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return sys_error("epoll_ctl ADD fd {}", fd);
    }
    return {};
  }

  void epoll_remove(int fd) {
    // Only fails if fd is not registered, which the callers rule out.
    (void)epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  }

  int endpoint_fd(int id) const { return id < 0 ? -1 : endpoints_[static_cast<size_t>(id)].fd; }
  ssize_t read_endpoint(int id, char* buf, size_t n) {
    Endpoint& ep = endpoints_[static_cast<size_t>(id)];
    if (ep.socket) {
      return ::recv(ep.fd, buf, n, MSG_DONTWAIT);
    }
    if (ep.nowait) {
      iovec iov{buf, n};
      ssize_t got = ::preadv2(ep.fd, &iov, 1, -1, RWF_NOWAIT);
      // EOPNOTSUPP: no RWF_NOWAIT for this file; EINVAL or ENOSYS: a kernel without the flag
      // (before 4.14) or without preadv2 (before 4.6).
      if (got >= 0 || (errno != EOPNOTSUPP && errno != EINVAL && errno != ENOSYS)) {
        return got;
      }
      if (!callers_.fallback_nonblocking(ep.fd)) {
        errno = EOPNOTSUPP;
        return -1;  // the read error ends the input, as a terminal that hung up
      }
      ep.nowait = false;
    }
    return ::read(ep.fd, buf, n);
  }
  ssize_t write_endpoint(int id, const char* buf, size_t n) {
    const Endpoint& ep = endpoints_[static_cast<size_t>(id)];
    return ep.socket ? ::send(ep.fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) : ::write(ep.fd, buf, n);
  }

  bool wants_read(const Relay& relay) const {
    if (relay.src_eof || relay.pending() || endpoint_fd(relay.src) < 0) {
      return false;
    }
    // Input waits for somewhere to put it (the pty master arrives later); output is read even
    // without a destination, to count it and to keep the command from blocking.
    return relay.output || endpoint_fd(relay.dst) >= 0;
  }
  bool wants_write(const Relay& relay) const { return relay.pending() && !relay.dst_dead; }

  // Registers exactly the readiness each endpoint is waited for. An endpoint nobody waits on
  // leaves epoll entirely: EPOLLHUP is reported even with an empty mask and would spin.
  Result<void> update_interests() {
    std::array<uint32_t, kEndpointCount> want{};
    for (const auto& relay : relays_) {
      if (wants_read(relay)) {
        want[static_cast<size_t>(relay.src)] |= EPOLLIN;
      }
      if (wants_write(relay)) {
        want[static_cast<size_t>(relay.dst)] |= EPOLLOUT;
      }
    }
    immediate_ = false;
    for (size_t i = 0; i < kEndpointCount; ++i) {
      Endpoint& ep = endpoints_[i];
      if (ep.fd < 0) {
        continue;
      }
      if (!ep.pollable) {
        immediate_ = immediate_ || want[i] != 0;
        continue;
      }
      if (want[i] == ep.events) {
        continue;
      }
      epoll_event ev{};
      ev.events = want[i];
      ev.data.u64 = i;
      int op = want[i] == 0 ? EPOLL_CTL_DEL : (ep.in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD);
      if (epoll_ctl(epoll_.get(), op, ep.fd, &ev) != 0) {
        if (op == EPOLL_CTL_ADD && errno == EPERM) {
          ep.pollable = false;  // a regular file or directory: always ready
          immediate_ = true;
          continue;
        }
        return sys_error("epoll_ctl endpoint fd {}", ep.fd);
      }
      ep.in_epoll = want[i] != 0;
      ep.events = want[i];
    }
    return {};
  }

  // An endpoint is going away (stdin pipe closed): take it out of epoll first.
  void drop_endpoint(int id) {
    Endpoint& ep = endpoints_[static_cast<size_t>(id)];
    if (ep.in_epoll) {
      epoll_remove(ep.fd);
    }
    ep = Endpoint{};
  }

  Result<void> arm_timer() {
    std::optional<Clock::time_point> next;
    auto consider = [&](const std::optional<Clock::time_point>& t) {
      if (t && (!next || *t < *next)) {
        next = t;
      }
    };
    if (!timeout_fired_) {
      consider(timeout_deadline_);
    }
    if (!killed_ && !init_exited_) {
      consider(grace_deadline_);
    }
    if (!drain_expired_) {
      consider(drain_deadline_);
    }
    if (!killed_ && !init_exited_) {
      consider(socket_deadline_);
    }
    if (next == armed_) {
      return {};
    }
    itimerspec spec{};
    if (next) {
      spec.it_value = to_timespec(*next);
      if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) {
        spec.it_value.tv_nsec = 1;  // all-zero would disarm
      }
    }
    if (timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
      return sys_error("timerfd_settime");
    }
    armed_ = next;
    return {};
  }

  Result<void> dispatch(uint64_t tag) {
    switch (tag) {
      case kTagPidfd:
        return on_init_exit();
      case kTagStatus:
        return read_status(kStatusBudget);
      case kTagSignal:
        return read_signals();
      case kTagTimer:
        return on_timer();
      default:
        break;
    }
    if (tag >= kEndpointCount) {
      return std::unexpected(Error(ErrorCode::kInternal, 0, "epoll: unknown tag"));
    }
    int id = static_cast<int>(tag);
    for (auto& relay : relays_) {
      if (relay.src == id || relay.dst == id) {
        CORDON_CHECK(pump(relay));
      }
    }
    return {};
  }

  // Moves data for one relay until the kernel says EAGAIN or the budget is spent.
  Result<void> pump(Relay& r) {
    for (int i = 0; i < kPumpBudget; ++i) {
      if (r.pending()) {
        if (!r.dst_dead) {
          ssize_t w = write_endpoint(r.dst, r.buf.get() + r.off, r.len - r.off);
          if (w >= 0) {
            r.off += static_cast<size_t>(w);
          } else if (errno == EINTR) {
            continue;
          } else if (errno == EAGAIN) {
            return {};
          } else {
            on_dst_failed(r, errno);
          }
        }
        if (r.pending() && !r.dst_dead) {
          continue;  // short write: try the rest
        }
        r.off = r.len = 0;
      }
      if (r.src_eof || !wants_read(r)) {
        break;
      }
      ssize_t n = read_endpoint(r.src, r.buf.get(), r.buf_size);
      if (n > 0) {
        if (r.output && !r.is_pty_src) {
          sandbox::grow_output_pipe(endpoint_fd(r.src), static_cast<size_t>(n), r.pipe_grown);
        }
        accept(r, static_cast<size_t>(n));
        if (r.output && drain_expired_ && --r.final_reads <= 0) {
          abandon(r);  // a writer outside that never stops: this read was the last
        }
        continue;
      }
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0 && errno == EAGAIN) {
        if (r.output && drain_expired_) {
          abandon(r);  // empty, and not at EOF: a write end lives outside the sandbox
        }
        return {};
      }
      if (n == 0 || (errno == EIO && r.is_pty_src) || !r.output) {
        // An input read error (a terminal hung up) ends the input like EOF would.
        r.src_eof = true;
        break;
      }
      return sys_error("read {}", r.name);
    }
    if (&r == &relays_[kStdinRelay] && r.src_eof && !r.pending() && !options_.tty &&
        handles_.stdin_write) {
      drop_endpoint(kInDst);
      handles_.stdin_write.reset();  // the command reads EOF
    }
    return {};
  }

  void on_dst_failed(Relay& r, int err) {
    r.dst_dead = true;
    r.dst_errno = err;
    if (!r.output) {
      // The command closed its stdin (EPIPE) or the pty is gone: stop reading input.
      r.src_eof = true;
      return;
    }
    if (err == EPIPE || err == ECONNRESET) {
      // The reader went away (`cordon run … | head`): as in a pipeline, the command's next
      // write to that stream gets EPIPE (SIGPIPE), so a command that writes for ever ends.
      // Failure fixed (a review, session 35): the rest was read and dropped, and `yes | head`
      // ran until the output cap (exit 123), a slow endless writer until the timeout. Under
      // --tty the pty master is closed, which hangs the command's terminal up (SIGHUP), as
      // `script` does when its output goes; the master was the input's destination too.
      int id = r.src;
      drop_endpoint(id);
      r.src_eof = true;
      if (r.is_pty_src) {
        Relay& in = relays_[kStdinRelay];
        in.src_eof = true;
        in.dst_dead = true;
        in.off = in.len = 0;
        master_.reset();
      } else {
        (&r == &relays_[kStdoutRelay] ? handles_.stdout_read : handles_.stderr_read).reset();
      }
    }
    // Another failure (ENOSPC, EFBIG, EIO): output keeps being read and counted, and the run
    // ends as the command does, with a warning.
  }

  void accept(Relay& r, size_t n) {
    r.off = 0;
    r.len = 0;
    if (!r.output) {
      r.len = n;
      return;
    }
    if (r.capped) {
      return;  // past the cap: drained, never delivered
    }
    uint64_t take = n;
    uint64_t cap = options_.max_output_bytes;
    if (cap > 0 && r.count + n > cap) {
      take = cap - r.count;
      r.capped = true;
    }
    r.count += take;
    // No destination (it failed: `| head` went away): counted, never pending. Pending bytes no
    // write will take would stop the reads for good (neither wants_read nor wants_write), and
    // the command would block on its full pipe: a run hung for ever when a read filled the
    // buffer on the pump's last turn (found in session 34).
    r.len = r.dst_dead ? 0 : static_cast<size_t>(take);
    if (r.capped) {
      if (!forced_state_) {
        forced_state_ = RunState::kOutputLimit;
        limit_stream_ = r.name;
      }
      kill_all();
    }
  }

  Result<void> read_status(int budget) {
    while (budget-- != 0 && !status_eof_) {
      sandbox::StatusRecord rec{};
      iovec iov{&rec, sizeof(rec)};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      // CLOEXEC from the start: a pty master must not leak into anything cordon execs.
      ssize_t n = recvmsg(handles_.status.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      if (n < 0) {
        // ECONNRESET: the child exited with a go byte unread (a setup step failed while the
        // v1 placement ran, ChildPlan::placement_go). The error is reported once, ahead of
        // the records still queued (the setup error among them): read on.
        if (errno == EINTR || errno == ECONNRESET) {
          continue;
        }
        if (errno == EAGAIN) {
          return {};
        }
        return sys_error("recvmsg status channel");
      }
      std::vector<UniqueFd> fds;  // every received fd is closed unless taken below
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            fds.emplace_back(fd);
          }
        }
      }
      if (n == 0) {
        status_eof_ = true;
        epoll_remove(handles_.status.get());
        return {};
      }
      if (static_cast<size_t>(n) != sizeof(rec) || (msg.msg_flags & MSG_TRUNC) != 0) {
        return invalid("status channel: malformed record of {} bytes", n);
      }
      CORDON_CHECK(on_record(rec, fds));
    }
    return {};
  }

  Result<void> on_record(const sandbox::StatusRecord& rec, std::vector<UniqueFd>& fds) {
    switch (rec.kind) {
      case sandbox::RecordKind::kSetupError:
        if (!setup_failed_) {
          setup_failed_ = true;
          failed_step_ = rec.step;
          setup_errno_ = rec.err;
        }
        return {};
      case sandbox::RecordKind::kCommandStarted:
        command_started_ = true;
        for (int sig : std::exchange(pending_signals_, {})) {
          if (!init_exited_ && !killed_ && hooks_.signal_init) {
            hooks_.signal_init(sig);
          }
        }
        return {};
      case sandbox::RecordKind::kCommandExited:
        if (!have_wait_status_) {
          have_wait_status_ = true;
          wait_status_ = rec.wait_status;
        }
        return {};
      case sandbox::RecordKind::kPtyMaster:
        if (options_.tty && endpoints_[kOutSrc].fd < 0 && !fds.empty() && !init_exited_) {
          CORDON_CHECK(take_pty_master(std::move(fds.front())));
        }
        return {};                        // unexpected: dropped (and closed) with fds
      case sandbox::RecordKind::kParked:  // only a parked init sends it; never a one-shot's
        break;
    }
    return invalid("status channel: unknown record kind {}", static_cast<uint32_t>(rec.kind));
  }

  Result<void> take_pty_master(UniqueFd master) {
    CORDON_CHECK(set_nonblocking(master.get(), "pty master"));
    master_ = std::move(master);
    endpoints_[kOutSrc].fd = master_.get();
    copy_window_size();
    return {};
  }

  // The command's view of the terminal size follows the caller's; a failure only leaves the
  // command with a stale size, so it is not worth failing the run for.
  void copy_window_size() {
    if (!master_ || options_.terminal_fd < 0) {
      return;
    }
    winsize ws{};
    if (ioctl(options_.terminal_fd, TIOCGWINSZ, &ws) == 0) {
      (void)ioctl(master_.get(), TIOCSWINSZ, &ws);
    }
  }

  Result<void> read_signals() {
    for (;;) {
      signalfd_siginfo info{};
      ssize_t n = read(signal_.get(), &info, sizeof(info));
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        if (errno == EAGAIN) {
          return {};
        }
        return sys_error("read signalfd");
      }
      if (static_cast<size_t>(n) != sizeof(info)) {
        return std::unexpected(Error(ErrorCode::kInternal, 0, "signalfd: short read"));
      }
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGWINCH) {
        copy_window_size();
        continue;
      }
      caller_signal_ = sig;
      if (init_exited_) {
        // The sandbox is gone; what is left is its output on the way to a reader that has
        // not taken it. A signal now means stop waiting for that reader (`timeout 2 cordon run
        // … | sleep 15` ran 15 s, and only SIGKILL stopped it: a review, session 35).
        give_up_delivery();
        continue;
      }
      if (signalled_by_caller_) {
        kill_all();  // asked twice: stop waiting for a graceful exit
      } else if (term_sent_) {
        // A timeout's SIGTERM went first, and the grace runs: the caller's signal still goes
        // on to the command as itself (it was dropped: a review, session 35).
        signalled_by_caller_ = true;
        send_to_init(sig);
      } else {
        signalled_by_caller_ = true;
        // The caller's own signal: a Ctrl-C is SIGINT to the command, as without cordon (the
        // sandbox has a session of its own, so the terminal's SIGINT reaches only cordon).
        terminate_gracefully(sig);
      }
    }
  }

  // Signals that arrive after the loop would otherwise be delivered with the old mask and
  // kill cordon before it can report; record them for the caller to act on instead.
  void drain_caller_signals() {
    signalfd_siginfo info{};
    while (read(signal_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      if (info.ssi_signo != SIGWINCH) {
        caller_signal_ = static_cast<int>(info.ssi_signo);
      }
    }
  }

  Result<void> on_timer() {
    uint64_t expirations = 0;
    if (read(timer_.get(), &expirations, sizeof(expirations)) < 0 && errno != EAGAIN) {
      return sys_error("read timerfd");
    }
    armed_.reset();  // one-shot: it fired (or was re-armed, and arm_timer will set it again)
    auto now = Clock::now();
    if (timeout_deadline_ && !timeout_fired_ && now >= *timeout_deadline_) {
      timeout_fired_ = true;
      if (!forced_state_ && !init_exited_) {
        forced_state_ = RunState::kTimeout;
      }
      terminate_gracefully();
    }
    if (grace_deadline_ && now >= *grace_deadline_) {
      kill_all();
    }
    if (socket_deadline_ && now >= *socket_deadline_) {
      socket_deadline_ = now + kSocketCheckEvery;
      check_sockets();
    }
    if (drain_deadline_ && !drain_expired_ && now >= *drain_deadline_) {
      drain_expired_ = true;
      CORDON_CHECK(final_drain());
      if (signalled_by_caller_) {
        // The caller asked the run to stop (its signal ended the command): its reader gets
        // the drain's time, not for ever (`timeout 2 cordon run … | sleep 15`).
        give_up_delivery();
      }
    }
    return {};
  }

  // The sandbox's TCP sockets against its memory limit (kSocketCost each); over it, the
  // sandbox is killed and the run reads `oom`.
  void check_sockets() {
    if (killed_ || init_exited_) {
      socket_deadline_.reset();
      return;
    }
    if (sockets_over_limit(sockstat_, options_.socket_memory_limit, tcp_sockets_)) {
      // Killed at once, also within a timeout's or a caller's grace; read `oom` only when
      // nothing else ended it first.
      socket_deadline_.reset();
      if (!forced_state_ && !term_sent_ && !have_wait_status_) {
        forced_state_ = RunState::kSocketLimit;
      }
      kill_all();
    }
  }

  // `sig` (SIGTERM, or the caller's SIGINT/SIGHUP) to init, which forwards it to the whole
  // sandbox; SIGKILL for all after the grace.
  void terminate_gracefully(int sig = SIGTERM) {
    if (init_exited_ || killed_) {
      return;
    }
    if (!term_sent_) {
      term_sent_ = true;
      send_to_init(sig);
    }
    if (!grace_deadline_) {
      grace_deadline_ = Clock::now() + options_.kill_grace;
    }
  }

  // Until init has started the command it has no handlers, and a pid namespace's init drops
  // signals it does not handle: the signal is held until init reports the command started
  // (as the engine does). Failure fixed (a review, session 14): a SIGTERM to `cordon run` (or
  // a timeout) in the first ~15 ms was lost, and the command ran on until the grace's SIGKILL.
  void send_to_init(int sig) {
    if (init_exited_ || killed_) {
      return;
    }
    if (!command_started_) {
      pending_signals_.push_back(sig);  // at most two: the timeout's and the caller's
    } else if (hooks_.signal_init) {
      hooks_.signal_init(sig);
    }
  }

  // A caller's signal after the sandbox ended: output not yet taken by the caller's reader is
  // dropped, said per stream in the outcome, and the run ends with the command's status.
  void give_up_delivery() {
    for (Relay* r : {&relays_[kStdoutRelay], &relays_[kStderrRelay]}) {
      if (r->done()) {
        continue;
      }
      undelivered_.emplace_back(r->name);
      r->dst_dead = true;
      r->src_eof = true;
      r->off = r->len = 0;
    }
  }

  void kill_all() {
    if (killed_ || init_exited_) {
      return;
    }
    killed_ = true;
    if (hooks_.kill_all) {
      hooks_.kill_all();
    }
  }

  Result<void> on_init_exit() {
    siginfo_t info{};
    if (waitid(P_PIDFD, static_cast<id_t>(handles_.pidfd.get()), &info, WEXITED | WNOHANG) == 0) {
      if (info.si_pid == 0) {
        return {};  // not yet a zombie; the pidfd stays readable and we come back
      }
      have_init_wait_status_ = true;
      init_wait_status_ = encode_wait_status(info);
    } else if (errno != ECHILD) {  // ECHILD: init is not our child; its parent reaps it
      return sys_error("waitid P_PIDFD init");
    }
    init_exited_ = true;
    sockstat_ = {};  // it holds the sandbox's network namespace, and its sockets, alive
    socket_deadline_.reset();
    duration_ = Clock::now() - start_;
    epoll_remove(handles_.pidfd.get());
    // Everything init sent is queued in the socket by now; read it all before deciding.
    CORDON_CHECK(read_status(-1));
    Relay& in = relays_[kStdinRelay];
    in.src_eof = true;
    in.off = in.len = 0;
    if (handles_.stdin_write) {
      drop_endpoint(kInDst);
      handles_.stdin_write.reset();
    }
    if (options_.tty && !master_) {
      relays_[kStdoutRelay].src_eof = true;  // setup ended before a pty master was sent
    }
    drain_deadline_ = Clock::now() + options_.drain_timeout;
    return {};
  }

  // The drain deadline passed without EOF on some stream. From now on an output stream whose
  // pipe is empty but not at EOF has a write end outside the sandbox (every process of the
  // sandbox is gone) and is abandoned, and so is one still giving data after
  // kFinalDrainReads more reads. A slow destination is no reason: what the pipes hold is
  // the command's, and it is passed on as fast as the caller's reader takes it (a reader
  // that slept was given 200 KB of 1 MB before, and the stream was said to be held open; a
  // review, session 34).
  Result<void> final_drain() {
    for (Relay* relay : {&relays_[kStdoutRelay], &relays_[kStderrRelay]}) {
      relay->final_reads = kFinalDrainReads;
      CORDON_CHECK(pump(*relay));
    }
    return {};
  }

  void abandon(Relay& r) {
    held_open_.emplace_back(r.name);
    r.src_eof = true;
  }

  bool finished() const {
    return init_exited_ && relays_[kStdoutRelay].done() && relays_[kStderrRelay].done();
  }

  Outcome outcome() const {
    Outcome o;
    o.have_wait_status = have_wait_status_;
    o.wait_status = wait_status_;
    if (have_wait_status_) {
      if (WIFEXITED(wait_status_)) {
        o.exit_code = WEXITSTATUS(wait_status_);
      } else if (WIFSIGNALED(wait_status_)) {
        o.term_signal = WTERMSIG(wait_status_);
      }
    }
    // init's failed wait comes after the command started: not a setup failure, but an init
    // that ends without the command's status, the step and errno its reason.
    if (setup_failed_ && failed_step_ != sandbox::SetupStep::kInitWait) {
      o.state = RunState::kSetupFailed;
    } else if (forced_state_) {
      o.state = *forced_state_;
    } else if (!have_wait_status_ && killed_) {
      // Our own SIGKILL (the grace ran out after the caller's signal, or the caller asked
      // twice) reached init and the command together: init could not report, and the command
      // was killed, not lost. Failure fixed (a review, session 14): this read `init-died`,
      // exit 125 ("could not set up").
      o.state = RunState::kKilled;
      o.term_signal = SIGKILL;
    } else if (!have_wait_status_) {
      o.state = RunState::kInitDied;
    } else if (WIFSIGNALED(wait_status_)) {
      o.state = RunState::kKilled;
    } else {
      o.state = RunState::kExited;
    }
    o.failed_step = failed_step_;
    o.setup_errno = setup_errno_;
    o.have_init_wait_status = have_init_wait_status_;
    o.init_wait_status = init_wait_status_;
    o.duration = duration_;
    o.stdout_bytes = relays_[kStdoutRelay].count;
    o.stderr_bytes = relays_[kStderrRelay].count;
    o.held_open = held_open_;
    o.undelivered = undelivered_;
    o.stdout_write_errno = relays_[kStdoutRelay].dst_errno;
    o.stderr_write_errno = relays_[kStderrRelay].dst_errno;
    o.output_limit_stream = limit_stream_;
    o.tcp_sockets = tcp_sockets_;
    o.signalled_by_caller = signalled_by_caller_;
    o.caller_signal = caller_signal_;
    return o;
  }

  SandboxHandles& handles_;
  const SuperviseOptions& options_;
  const KillHooks& hooks_;
  Clock::time_point start_;

  // Declaration order is restoration order in reverse: the terminal and the caller's fd flags
  // are put back while the signals are still blocked.
  SignalMask mask_;
  CallerFds callers_;
  RawTerminal terminal_;
  UniqueFd epoll_, signal_, timer_, master_;

  std::array<Endpoint, kEndpointCount> endpoints_{};
  std::array<Relay, kRelayCount> relays_{};
  bool immediate_ = false;

  std::optional<Clock::time_point> timeout_deadline_, grace_deadline_, drain_deadline_, armed_;
  Sockstat sockstat_;
  std::optional<Clock::time_point> socket_deadline_;
  uint64_t tcp_sockets_ = 0;
  bool timeout_fired_ = false, term_sent_ = false, killed_ = false, drain_expired_ = false;
  std::vector<std::string> held_open_;    // streams the final drain gave up on (Outcome)
  std::vector<std::string> undelivered_;  // streams a caller's late signal cut short (Outcome)
  bool command_started_ = false;
  std::vector<int> pending_signals_;  // held until init reports the command started, in order

  bool init_exited_ = false, status_eof_ = false;
  bool have_init_wait_status_ = false;
  int init_wait_status_ = 0;
  std::chrono::nanoseconds duration_{};
  bool setup_failed_ = false;
  sandbox::SetupStep failed_step_ = sandbox::SetupStep::kNone;
  int setup_errno_ = 0;
  bool have_wait_status_ = false;
  int wait_status_ = 0;
  std::optional<RunState> forced_state_;
  std::string limit_stream_;
  bool signalled_by_caller_ = false;
  int caller_signal_ = 0;
};

}  // namespace

std::string init_end_text(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return fmt::format("init exited with code {}", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    const char* abbrev = sigabbrev_np(WTERMSIG(wait_status));
    return abbrev != nullptr ? fmt::format("init was killed by SIG{}", abbrev)
                             : fmt::format("init was killed by signal {}", WTERMSIG(wait_status));
  }
  return fmt::format("init's wait status {:#x}", wait_status);
}

Result<Sockstat> open_sockstat(int pidfd) {
  CORDON_TRY(info, sys::read_file_at(AT_FDCWD, fmt::format("/proc/self/fdinfo/{}", pidfd)));
  long pid = -1;
  for (const auto& line : split(info, '\n')) {
    if (line.rfind("Pid:", 0) == 0) {
      pid = std::strtol(line.c_str() + 4, nullptr, 10);
    }
  }
  if (pid <= 0) {
    return errno_error(ESRCH, "the sandbox's init has no pid (it ended)");
  }
  Sockstat out;
  CORDON_TRY(v4, sys::open_fd(fmt::format("/proc/{}/net/sockstat", pid), O_RDONLY));
  out.v4 = std::move(v4);
  if (auto v6 = sys::open_fd(fmt::format("/proc/{}/net/sockstat6", pid), O_RDONLY)) {
    out.v6 = std::move(*v6);
  } else if (v6.error().sys_errno() != ENOENT) {
    return std::unexpected(std::move(v6.error()));
  }
  // Opened by pid: the init is still alive after the opens, so the pid was its own.
  if (sys::pidfd_send_signal(pidfd, 0, nullptr, 0) != 0) {
    return sys_error("pidfd_send_signal (the sandbox's init ended)");
  }
  return out;
}

namespace {

// The number after `key` in a /proc/net/sockstat* file read whole from its start.
std::optional<uint64_t> sockstat_field(int fd, const char* key) {
  char buf[1024];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) {
    return std::nullopt;
  }
  buf[n] = '\0';
  const char* at = std::strstr(buf, key);
  if (at == nullptr) {
    return std::nullopt;
  }
  return std::strtoull(at + std::strlen(key), nullptr, 10);
}

}  // namespace

bool sockets_over_limit(const Sockstat& s, uint64_t memory_limit, uint64_t& seen) {
  auto v4 = s.v4 ? sockstat_field(s.v4.get(), "\nTCP: inuse ") : std::nullopt;
  if (!v4) {
    return false;
  }
  auto v6 = s.v6 ? sockstat_field(s.v6.get(), "TCP6: inuse ") : std::optional<uint64_t>(0);
  const uint64_t n = *v4 + v6.value_or(0);
  seen = std::max(seen, n);
  return n * kSocketCost > memory_limit;
}

std::string socket_limit_message(uint64_t sockets, uint64_t memory_limit) {
  return fmt::format(
      "the sandbox was killed at its memory limit: its network namespace held {} TCP sockets, "
      "counted at {} bytes each against the limit of {} bytes (the kernel charges a "
      "connection to no memory cgroup until accept() takes it); its output is banked",
      sockets, kSocketCost, memory_limit);
}

std::string init_died_message(sandbox::SetupStep step, int err,
                              std::optional<int> init_wait_status) {
  std::string message = "the sandbox init died without reporting the command's status";
  if (step == sandbox::SetupStep::kInitWait) {
    message += fmt::format(" ({}: {})", sandbox::step_name(step), errno_name(err));
  } else if (init_wait_status) {
    message += " (" + init_end_text(*init_wait_status) + ")";
  }
  return message;
}

const char* run_state_name(RunState state) {
  switch (state) {
    case RunState::kExited:
      return "exited";
    case RunState::kKilled:
      return "killed";
    case RunState::kTimeout:
      return "timeout";
    case RunState::kOutputLimit:
      return "output-limit";
    case RunState::kSocketLimit:
      return "oom";
    case RunState::kSetupFailed:
      return "setup-failed";
    case RunState::kInitDied:
      return "init-died";
  }
  return "unknown";
}

Result<Outcome> supervise(SandboxHandles& handles, const SuperviseOptions& options,
                          const KillHooks& hooks) {
  Supervisor supervisor(handles, options, hooks);
  auto result = supervisor.run();
  if (!result) {
    supervisor.kill_on_error();
    return std::unexpected(std::move(result.error()).wrap("supervise sandbox"));
  }
  return result;
}

}  // namespace cordon::engine
