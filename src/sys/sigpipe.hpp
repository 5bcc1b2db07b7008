#pragma once

// SIGPIPE around writes to a pipe whose reader may be gone (a sandboxed command that closed its
// stdin): the writer must see EPIPE, never die of the signal. The engine is a library; the
// program it is embedded in may keep SIGPIPE's default action, so it cannot simply be ignored.

#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace cordon::sys {

/// Whether `sig` is pending, for this thread or the process.
inline bool signal_pending(int sig) {
  sigset_t pending;
  return sigpending(&pending) == 0 && sigismember(&pending, sig) == 1;
}

/// Whether SIGPIPE is pending, for this thread or the process.
inline bool sigpipe_pending() { return signal_pending(SIGPIPE); }

/// After writes made with `sig` (SIGPIPE, SIGXFSZ) blocked on this thread: takes the one they
/// raised, so that restoring `old` does not deliver it after the fact. Left alone when `old`
/// had it blocked (the caller's own business) or it was pending before the writes
/// (`was_pending`).
inline void consume_raised(const sigset_t& old, bool was_pending, int sig) {
  if (sigismember(&old, sig) == 0 && !was_pending && signal_pending(sig)) {
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    timespec zero{};
    (void)sigtimedwait(&only, nullptr, &zero);  // best effort: it is pending, so it returns
  }
}

inline void consume_raised_sigpipe(const sigset_t& old, bool was_pending) {
  consume_raised(old, was_pending, SIGPIPE);
}

/// Blocks SIGPIPE on the calling thread for its scope; a SIGPIPE raised meanwhile is taken
/// before the old mask comes back.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    was_pending_ = sigpipe_pending();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    active_ = pthread_sigmask(SIG_BLOCK, &set, &old_) == 0;
  }
  ~SigpipeBlock() {
    if (active_) {
      consume_raised_sigpipe(old_, was_pending_);
      (void)pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // cannot fail with a valid set
    }
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t old_{};
  bool active_ = false;
  bool was_pending_ = false;
};

}  // namespace cordon::sys
