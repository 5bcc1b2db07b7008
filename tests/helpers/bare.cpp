// A command that makes no syscall but pause and exit_group: no libc, no loader, no startup
// code. The warm-pool test that runs a parked init under a profile of exactly init's calls
// (pool_test.cpp, a_pooled_command_under_a_profile_of_only_inits_calls_runs) runs it, so
// every other call the job makes is init's own. With an argument it waits for a signal
// (pause: the default action of SIGTERM ends it); without one it exits 0. x86-64.

extern "C" [[noreturn]] void bare_main(const long* sp);

asm(".globl _start\n"
    "_start:\n"
    "  mov %rsp, %rdi\n"
    "  and $-16, %rsp\n"
    "  call bare_main\n");

namespace {

long raw_syscall(long nr, long a0) {
  long rc;
  asm volatile("syscall" : "=a"(rc) : "a"(nr), "D"(a0) : "rcx", "r11", "memory");
  return rc;
}

constexpr long kSysPause = 34;
constexpr long kSysExitGroup = 231;

}  // namespace

extern "C" [[noreturn]] void bare_main(const long* sp) {
  const long argc = sp[0];
  if (argc > 1) {
    for (;;) {
      raw_syscall(kSysPause, 0);
    }
  }
  for (;;) {
    raw_syscall(kSysExitGroup, 0);
  }
}
