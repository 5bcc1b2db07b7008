#pragma once

// Signal dispositions for the sandbox's own processes: raw syscalls only (the clone3 child
// and init use it; neither may allocate).

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace cordon::sandbox {

/// Sets the disposition of `sig` to SIG_DFL with the raw rt_sigaction: glibc's wrapper refuses
/// its internal signals (32, 33), which a caller may still have ignored.
inline void default_signal(int sig) {
  struct KernelSigaction {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)();
    uint64_t mask;
  } dfl{SIG_DFL, 0, nullptr, 0};
  ::syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof dfl.mask);
}

/// Every disposition back to default: an ignored signal survives exec, and cordon (or whoever
/// started it) may ignore SIGPIPE or SIGINT — nothing in the sandbox may inherit that.
inline void default_all_signals() {
  for (int sig = 1; sig <= 64; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) {
      default_signal(sig);
    }
  }
}

}  // namespace cordon::sandbox
