#include "sandbox/idmap_child.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

namespace cordon::sandbox {

#if defined(__x86_64__)

namespace {

// A system call without libc: no PLT (a lazy binding would run the resolver on the child's
// stack, writing the caller's memory) and no errno (thread-local: the caller's own).
__attribute__((always_inline)) inline long raw_syscall(long nr, long a = 0, long b = 0,
                                                       long c = 0) {
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return ret;
}

}  // namespace

// It shares the caller's memory and descriptor table (CLONE_VM | CLONE_FILES), so the clone
// copies no page tables, leaves none of the caller's pages write-protected (after a plain fork
// every page the caller wrote faulted once: ~20 µs each in a PVM guest, a fifth of a warm-pool
// build's CPU in the spawner, session 24) and holds no copy of any of the caller's
// descriptors (a copy of a job's pipe end, taken while the spawner passed it on, would keep
// the pipe open for as long as the child lived); it uses none. It runs on a stack of its own
// in the caller's frame, touches nothing but that stack, runs no handler (the caller blocks
// every signal across the clone) and makes raw system calls. This file is never instrumented
// (src/sandbox/meson.build): a sanitizer's shadow writes or a coverage counter here would be
// writes into the caller's live memory, and the frame it leaves behind (it never returns: it
// is killed, or exits) would keep its redzones poisoned.
int idmap_child(void* arg) {
  const IdmapChildArgs* a = static_cast<const IdmapChildArgs*>(arg);
  // Should the caller die before it kills us, the kernel does: the caller's thread is our
  // parent, and it dies with its process (a parent already gone: we exit at once).
  if (raw_syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL) != 0 ||
      raw_syscall(SYS_getppid) != a->parent) {
    raw_syscall(SYS_exit, 0);
  }
  // Until the caller's SIGKILL: no handler can run here (every signal is blocked, also
  // glibc's own), so a pause is never interrupted into anything but another pause.
  for (;;) {
    raw_syscall(SYS_pause);
  }
}

#endif

}  // namespace cordon::sandbox
