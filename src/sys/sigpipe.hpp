#pragma once

// SIGPIPE and SIGXFSZ around writes: to a pipe whose reader may be gone (a sandboxed command
// that closed its stdin) the writer must see EPIPE, and past a file-size limit EFBIG, never
// die of the signal. The engine is a library; the program it is embedded in may keep their
// default actions, so they cannot simply be ignored.

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace cordon::sys {

/// Whether `sig` is pending, for this thread or the process.
inline bool signal_pending(int sig) {
  sigset_t pending;
  return sigpending(&pending) == 0 && sigismember(&pending, sig) == 1;
}

/// Whether `sig` is pending for this thread alone, not for the whole process: what a write of
/// this thread raised (the kernel sends SIGPIPE and SIGXFSZ to the writing thread). Read from
/// SigPnd in /proc/thread-self/status (ShdPnd is the process's); without /proc, any pending
/// one counts, as sigpending() says.
inline bool thread_pending(int sig) {
  const int fd = open("/proc/thread-self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return signal_pending(sig);
  }
  // Read until the SigPnd line is whole: a long Groups line before it (hundreds of
  // supplementary groups on a directory-service host) puts it past any fixed buffer.
  std::string text;
  char buf[4096];
  size_t at = std::string::npos;
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
    text.append(buf, static_cast<size_t>(n));
    at = text.find("\nSigPnd:\t");
    if (at != std::string::npos && text.find('\n', at + 1) != std::string::npos) {
      break;
    }
  }
  close(fd);
  if (at == std::string::npos) {
    return signal_pending(sig);
  }
  const unsigned long long mask = strtoull(text.c_str() + at + 9, nullptr, 16);
  return sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1ULL) != 0;
}

/// After writes made with `sig` (SIGPIPE, SIGXFSZ) blocked on this thread: takes the one they
/// raised, so that restoring `old` does not deliver it after the fact. Left alone when `old`
/// had it blocked (the caller's own business), when it was pending before the writes
/// (`was_pending`), and when only the process has it pending: a kill() of the process meanwhile
/// is the embedder's, delivered when the mask comes back (a review, session 39: it was taken,
/// and the embedder's handler never ran). sigtimedwait takes a thread's own signal before the
/// process's.
inline void consume_raised(const sigset_t& old, bool was_pending, int sig) {
  if (sigismember(&old, sig) == 0 && !was_pending && signal_pending(sig) && thread_pending(sig)) {
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    timespec zero{};
    (void)sigtimedwait(&only, nullptr, &zero);  // best effort: it is pending, so it returns
  }
}

/// The two signals a write can raise and kill the whole process with: SIGPIPE (a pipe whose
/// reader is gone) and SIGXFSZ (a file past the process's RLIMIT_FSIZE: write, ftruncate,
/// fallocate). Both are sent to the writing thread, so a thread that blocks them gets EPIPE
/// or EFBIG instead. A program embedding the engine may keep their default actions (and a
/// file-size limit: `ulimit -f`), so the library blocks them, never ignores them.
inline sigset_t write_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigaddset(&set, SIGXFSZ);
  return set;
}

/// Blocks both on the calling thread for the rest of its life: for the library's own threads.
/// A signal one of its writes raises stays pending on that thread, never delivered.
inline void block_write_signals_for_thread() {
  const sigset_t set = write_signals();
  (void)pthread_sigmask(SIG_BLOCK, &set, nullptr);  // cannot fail with a valid set
}

/// Blocks SIGPIPE and SIGXFSZ on the calling thread (a caller's, in a public entry point) for
/// its scope; one raised meanwhile is taken before the old mask comes back. Failure fixed (a
/// red-team review, session 39): an embedder with `ulimit -f` 4 MiB died of SIGXFSZ when a
/// job printed 6 MiB (the log's write on the engine's loop thread), and Engine::open killed
/// it below 1 MiB (the reserve's fallocate).
class WriteSignalsBlock {
 public:
  WriteSignalsBlock() {
    sigpipe_was_pending_ = signal_pending(SIGPIPE);
    sigxfsz_was_pending_ = signal_pending(SIGXFSZ);
    const sigset_t set = write_signals();
    active_ = pthread_sigmask(SIG_BLOCK, &set, &old_) == 0;
  }
  ~WriteSignalsBlock() {
    if (active_) {
      consume_raised(old_, sigpipe_was_pending_, SIGPIPE);
      consume_raised(old_, sigxfsz_was_pending_, SIGXFSZ);
      (void)pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // cannot fail with a valid set
    }
  }
  WriteSignalsBlock(const WriteSignalsBlock&) = delete;
  WriteSignalsBlock& operator=(const WriteSignalsBlock&) = delete;

 private:
  sigset_t old_{};
  bool active_ = false;
  bool sigpipe_was_pending_ = false;
  bool sigxfsz_was_pending_ = false;
};

}  // namespace cordon::sys
