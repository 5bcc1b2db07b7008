// The sandbox init. Linked statically into its own small binary (cordon-init) so no copy of
// the engine's memory is ever inside a sandbox. Only libc and raw syscalls; no allocation.

#include "sandbox/init.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "sandbox/plan_format.hpp"
#include "sandbox/signals.hpp"
#include "sandbox/status.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {
namespace {

// write(), not send(): the init's own seccomp filter allows write but not sendto. If the
// supervisor is gone the write fails with EPIPE (no SIGPIPE: a pid namespace's init ignores
// every signal left at its default action), and nothing is left to report to.
void send_record(const StatusRecord& rec) { (void)::write(kFdStatus, &rec, sizeof rec); }

[[noreturn]] void fail(SetupStep step, int err, int code) {
  StatusRecord rec{};
  rec.kind = RecordKind::kSetupError;
  rec.step = step;
  rec.err = err;
  send_record(rec);
  ::_exit(code);
}

// Forwards a signal to every process of the sandbox (kill(-1) from PID 1 of a pid namespace
// reaches all of them but init). kill is async-signal-safe. A signal that asks the command to
// end is followed by SIGCONT, as systemd does: a stopped process (a suspended editor, one that
// raised SIGSTOP) keeps it pending otherwise, and never runs its handler before the grace's
// SIGKILL. Failure fixed (a review, session 14): a SIGTERM trap of a stopped process never ran.
void forward_signal(int sig) {
  ::kill(-1, sig);
  if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) {
    ::kill(-1, SIGCONT);
  }
}

int load_filter(const struct sock_filter* insns, uint32_t count) {
  struct sock_fprog prog {};
  prog.len = static_cast<unsigned short>(count);
  prog.filter = const_cast<struct sock_filter*>(insns);
  return static_cast<int>(::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog));
}

// Set once a parked init has loaded its command's filters (kPlanPreloadFilters); read by the
// command (a CLONE_VM child) before its exec.
bool g_filters_preloaded = false;

// The command's two filters. The profile first, the fixed filter last: when both answer with
// an errno, the kernel uses the most recently loaded filter's, so the fixed filter's answers
// win.
void load_command_filters(const PlanHeader* h, const char* base, int code) {
  const auto* profile = reinterpret_cast<const struct sock_filter*>(base + h->profile_off);
  const auto* fixed = reinterpret_cast<const struct sock_filter*>(base + h->fixed_off);
  if (!(h->flags & kPlanNoProfileFilter) && h->profile_count > 0 &&
      load_filter(profile, h->profile_count) != 0) {
    fail(SetupStep::kCommandSeccomp, errno, code);
  }
  if (!(h->flags & kPlanNoFixedFilter) && h->fixed_count > 0 &&
      load_filter(fixed, h->fixed_count) != 0) {
    fail(SetupStep::kCommandSeccomp, errno, code);
  }
}

[[noreturn]] void run_command(const PlanHeader* h, const char* base, char** argv, char** envp,
                              const char* exec_path) {
  // Every disposition is the default but the ones init installed a handler for: the
  // sandbox's child reset them all before it exec'd init (default_all_signals), and an exec
  // keeps only ignored ones.
  for (int sig : kForwardedSignals) {
    default_signal(sig);
  }
  // Only now unblock: a SIGTERM that arrived since the clone was held, and is delivered with
  // its default action instead of init's forwarding handler (which would have swallowed it).
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // A session of its own (job control, and no way to reach a terminal it was not given).
  if (::setsid() < 0) {
    fail(SetupStep::kCommandSetsid, errno, 126);
  }
  if ((h->flags & kPlanTty) && ::ioctl(0, TIOCSCTTY, 0) != 0) {
    fail(SetupStep::kCommandCtty, errno, 126);
  }
  if (!(h->flags & kPlanNoNoNewPrivs) && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    fail(SetupStep::kCommandNoNewPrivs, errno, 126);
  }
  if (!(h->flags & kPlanNoLandlock) && sys::landlock_restrict_self(kFdLandlockCmd, 0) != 0) {
    fail(SetupStep::kCommandLandlock, errno, 126);
  }
  ::close(kFdLandlockCmd);
  ::close(kFdLandlockInit);
  ::close(kFdPlan);
  // The status channel and the exec fd close on exec: the command inherits neither.
  if (::fcntl(kFdStatus, F_SETFD, FD_CLOEXEC) != 0) {
    fail(SetupStep::kCommandExec, errno, 126);
  }
  bool by_path = (h->flags & kPlanExecByPath) != 0;
  if (!by_path && ::fcntl(kFdExec, F_SETFD, FD_CLOEXEC) != 0) {
    fail(SetupStep::kCommandExec, errno, 126);
  }
  // seccomp last: the filters need not allow anything but the exec that follows. A parked
  // init loaded them (the same programs, checked) before its job: the command has them.
  if (!g_filters_preloaded) {
    load_command_filters(h, base, 126);
  }
  if (by_path) {
    ::execve(exec_path, argv, envp);
  } else {
    sys::execveat(kFdExec, "", argv, envp, AT_EMPTY_PATH);
  }
  int err = errno;
  fail(SetupStep::kCommandExec, err, err == ENOENT ? 127 : 126);
}

// Maps the plan at kFdPlan; never returns on a malformed one.
const PlanHeader* map_plan(size_t* size) {
  struct stat st {};
  if (::fstat(kFdPlan, &st) != 0) {
    fail(SetupStep::kInitPlan, errno, 125);
  }
  // Populated at once: one kernel entry instead of a fault per page (a fault costs ~20 µs in a
  // PVM guest, docs/performance.md).
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                     MAP_PRIVATE | MAP_POPULATE, kFdPlan, 0);
  if (map == MAP_FAILED) {
    fail(SetupStep::kInitPlan, errno, 125);
  }
  const auto* h = static_cast<const PlanHeader*>(map);
  if (static_cast<size_t>(st.st_size) < sizeof(PlanHeader) || h->magic != kPlanMagic ||
      h->total_size != static_cast<uint32_t>(st.st_size)) {
    fail(SetupStep::kInitPlan, EINVAL, 125);
  }
  *size = static_cast<size_t>(st.st_size);
  return h;
}

// The command starts as a CLONE_VM child (as posix_spawn does, without its CLONE_VFORK), so
// neither copies a page on write. A fork write-protected all of init's pages, and both then
// faulted on every page they wrote before the exec — ~40 faults on the job's path, each ~20 µs
// in a PVM guest (docs/performance.md, "Warm pool"). The child runs on its own stack, never on
// init's frames, and touches nothing of init's but that stack, errno and the two words of the
// start below; its signal dispositions are its own (no CLONE_SIGHAND), and the termination
// signals stay blocked until it has reset them (run_command).
// The start is a handshake in two futex words (start_command): the child waits, before
// anything else, until init has closed its own copies of the command's stdio (g_stdio_dropped),
// and init then waits, as a vfork's parent would, until the child has exec'd or died (the kernel
// clears g_command_in_mm and wakes it: CLONE_CHILD_CLEARTID). So the command never runs while
// init still holds its stdio: a CLONE_VFORK parent could close its copies only once the command
// had exec'd, and on a loaded host the command could close its stdin, print and be written to
// first, its input accepted into a pipe init still held and lost when init closed it (seen once
// in CI, session 32). The two run at once from the clone until init sleeps in its wait, and
// they share errno (no CLONE_SETTLS), which the child reads in fail(): none of init's calls
// there writes it (closes of open fds, a wake, a wait that fails, EAGAIN, only once the child
// has left the mm), and a call added there must not either.
// While the two share the mm (until the exec), the kernel treats them as one for what acts on
// an mm: an OOM kill in that window takes init too (the job then reads as init's death), and
// on kernels before 5.16 a core-dumping signal in the child would too — only with a dumpable
// mm, which init never has outside the test-walls build (kPlanKeepDumpable). A command whose
// exec blocks (a hung network filesystem) also holds init's forwarding of a SIGTERM until the
// exec returns; the grace's SIGKILL goes to the cgroup and is not held.
constexpr size_t kCommandStackBytes = 32 * 1024;
char* g_command_stack = nullptr;  // kCommandStackBytes, above a PROT_NONE guard page
// argv/envp pointers for a plan with at most this many entries; a larger one maps its own.
constexpr size_t kStaticPointers = 1024;
struct {
  char* pointers[kStaticPointers];
} g_arrays;
ParkedJob g_job;  // 4 KiB of path: static, not on init's small stack

struct CommandStart {
  const PlanHeader* h;
  const char* base;
  char** argv;
  char** envp;
  const char* exec_path;
};

// The command's stack, mapped with an inaccessible page below it: an overflow faults instead
// of writing over init's memory, which the child shares until its exec.
void map_command_stack() {
  const size_t guard = static_cast<size_t>(::getpagesize());
  void* m = ::mmap(nullptr, guard + kCommandStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) {
    fail(SetupStep::kInitFork, errno, 125);
  }
  if (::mprotect(m, guard, PROT_NONE) != 0) {
    fail(SetupStep::kInitFork, errno, 125);
  }
  g_command_stack = static_cast<char*>(m) + guard;
}

// The start's handshake (see above). g_stdio_dropped: 0 while init holds the command's stdio,
// 1 once it has closed them, 2 while the child sleeps waiting for that (then init wakes it).
// g_command_in_mm: 1 from before the clone until the child's exec or exit, when the kernel
// writes 0 and wakes a waiter (mm_release, for a CLONE_CHILD_CLEARTID child: a shared futex,
// so init waits with FUTEX_WAIT, not the private op). Both live in init's .bss, anonymous
// memory the two share until the exec.
int g_stdio_dropped = 0;
pid_t g_command_in_mm = 0;

long futex(void* word, int op, int val) {
  return ::syscall(SYS_futex, word, op, val, nullptr, nullptr, 0);
}

int command_entry(void* arg) {
  int expected = 0;
  if (__atomic_compare_exchange_n(&g_stdio_dropped, &expected, 2, false, __ATOMIC_ACQUIRE,
                                  __ATOMIC_ACQUIRE)) {
    // Asleep until init's store of 1 (an EAGAIN: it came first; an EINTR cannot, every
    // signal init handles is blocked here).
    while (__atomic_load_n(&g_stdio_dropped, __ATOMIC_ACQUIRE) != 1) {
      (void)futex(&g_stdio_dropped, FUTEX_WAIT_PRIVATE, 2);
    }
  }
  const auto* c = static_cast<const CommandStart*>(arg);
  run_command(c->h, c->base, c->argv, c->envp, c->exec_path);
}

// Starts the command and returns its pid once it has exec'd or died, init's own stdio closed
// before the command could run (the handshake above). A failed clone fails init.
pid_t start_command(CommandStart* start) {
  __atomic_store_n(&g_command_in_mm, 1, __ATOMIC_RELEASE);
  pid_t cmd =
      ::clone(command_entry, g_command_stack + kCommandStackBytes,
              CLONE_VM | CLONE_CHILD_CLEARTID | SIGCHLD, start, nullptr, nullptr, &g_command_in_mm);
  if (cmd < 0) {
    fail(SetupStep::kInitFork, errno, 125);
  }
  // The command's stdio is its own from here. While init held the read end of stdin, a
  // command that had closed its own got no EPIPE for input written to it (a write was accepted
  // into a pipe nobody would read), and while it held the write ends its readers saw no EOF.
  ::close(0);
  ::close(1);
  ::close(2);
  if (__atomic_exchange_n(&g_stdio_dropped, 1, __ATOMIC_RELEASE) == 2) {
    (void)futex(&g_stdio_dropped, FUTEX_WAKE_PRIVATE, 1);
  }
  // As a vfork's parent: nothing of init's runs beside the child until its exec (EAGAIN: the
  // kernel cleared the word first; a spurious wake reads it again).
  while (__atomic_load_n(&g_command_in_mm, __ATOMIC_ACQUIRE) != 0) {
    (void)futex(&g_command_in_mm, FUTEX_WAIT, 1);
  }
  return cmd;
}

// A CLONE_VM clone without CLONE_VFORK gives the mm a private futex hash on kernels that have
// them (PR_FUTEX_HASH, 6.16; measured on 6.18: 0 slots before such a clone, 16 after, where a
// prctl(PR_FUTEX_HASH_SET_SLOTS, 0) first kept 0): 16 buckets, ~1 KiB of kernel memory charged
// to the job's cgroup for init's whole life, and an allocation that can fail the clone. Init and
// its command before the exec use two futex words once: the global hash, as any process without
// threads (0 slots), made before the filters are loaded. EINVAL: a kernel without private
// hashes; any other answer leaves the default, which costs that allocation and nothing else.
void use_global_futex_hash() {
  (void)::prctl(sys::kPrFutexHash, sys::kPrFutexHashSetSlots, 0, 0, 0);
}

// Writes every page the job's path will write, while parked: the faults happen now, off that
// path (a CLONE_VM child never write-protects them again).
void touch_job_pages() {
  std::memset(g_command_stack, 0, kCommandStackBytes);
  std::memset(g_arrays.pointers, 0, sizeof g_arrays.pointers);
  std::memset(&g_job, 0, sizeof g_job);
  __atomic_store_n(&g_stdio_dropped, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&g_command_in_mm, 0, __ATOMIC_RELAXED);
}

// The vDSO and its data pages ([vvar], [vvar_vclock], [vdso]), read from /proc/self/maps at
// init's start, while it may still open files (a parked init: off the job's path; an unparked
// one reads ~1 KiB before it starts the command). Once the command has run for a while, init
// drops them with the plan and the command's stack (release_mappings): with every mapping between
// init's heap and its stack gone, the kernel frees that region's page tables too (free_pgtables),
// 12 KiB of kernel memory per sandbox for as long as its command runs. Init needs none of them
// afterwards: it only waits, writes records, forwards signals and exits, through syscalls that
// never go through the vDSO (nothing after the start calls clock_gettime, time, gettimeofday or
// getcpu), and on x86-64 a handler returns through libc's restorer (SA_RESTORER), not the vDSO
// — on arm64 it would return through the vDSO, so the vDSO is kept there.
struct Range {
  uintptr_t lo, hi;
};
constexpr size_t kMaxVdsoRanges = 4;
Range g_vdso[kMaxVdsoRanges];
size_t g_n_vdso = 0;
bool g_maps_unknown = false;  // a line this parser does not know: keep them all mapped

// A hex number up to `stop`, which it steps over; false on anything else.
bool parse_hex(const char*& p, const char* end, char stop, uintptr_t* out) {
  auto [next, ec] = std::from_chars(p, end, *out, 16);
  if (ec != std::errc() || next == end || *next != stop) {
    return false;
  }
  p = next + 1;
  return true;
}

bool has_suffix(const char* line, const char* end, const char* suffix) {
  size_t n = std::strlen(suffix);
  return static_cast<size_t>(end - line) >= n && std::memcmp(end - n, suffix, n) == 0;
}

void note_maps_line(const char* line, const char* end) {
  if (!has_suffix(line, end, " [vdso]") && !has_suffix(line, end, " [vvar]") &&
      !has_suffix(line, end, " [vvar_vclock]")) {
    return;
  }
  Range r{};
  const char* p = line;
  if (!parse_hex(p, end, '-', &r.lo) || !parse_hex(p, end, ' ', &r.hi) || r.hi <= r.lo ||
      g_n_vdso == kMaxVdsoRanges) {
    g_maps_unknown = true;
    return;
  }
  g_vdso[g_n_vdso++] = r;
}

// Best effort: without a readable /proc/self/maps init keeps the vDSO (and those page tables).
// Read into the command's stack, which is touched anyway and free until the command starts.
void find_vdso() {
#if !defined(__x86_64__)
  return;
#endif
  char* const buf = g_command_stack;
  const size_t buf_size = kCommandStackBytes;  // a maps line is ~80 bytes and a path (< 4096)
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return;
  }
  size_t have = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf + have, buf_size - have);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      g_maps_unknown = true;
      break;
    }
    if (n == 0) {
      if (have != 0) {
        g_maps_unknown = true;  // a last line without its newline
      }
      break;
    }
    have += static_cast<size_t>(n);
    char* line = buf;
    char* end = buf + have;
    for (char* nl;
         (nl = static_cast<char*>(std::memchr(line, '\n', static_cast<size_t>(end - line)))) !=
         nullptr;
         line = nl + 1) {
      note_maps_line(line, nl);
    }
    have = static_cast<size_t>(end - line);
    if (have == buf_size) {
      g_maps_unknown = true;  // a line longer than any maps line can be
      break;
    }
    std::memmove(buf, line, have);
  }
  ::close(fd);
  if (g_maps_unknown) {
    g_n_vdso = 0;
  }
}

// What init mapped for the start and no longer reads once the command has exec'd: the job's
// plan and its descriptor (the engine closed its own: the memfd's pages go with the last one),
// a parked init's park plan, the command's stack and a mapped pointer array, the vDSO.
// Released only when the command is still running kReleaseAfterNs after its start (a one-shot
// ITIMER_REAL; its SIGALRM interrupts init's wait): each munmap flushes the TLB, and on the
// start's path the five to seven of them took a CPU from the command that had just exec'd
// (0.2–0.4 ms in this PVM guest, spawn_bench --compare-host); a short command's init exits
// first and the kernel frees them with it. munmap cannot fail on ranges init mapped itself; if
// it did, init would keep pages it no longer reads, which changes nothing else.
struct Mappings {
  const PlanHeader* plan = nullptr;
  size_t plan_size = 0;
  const PlanHeader* park_plan = nullptr;  // a parked init's, until its job came
  size_t park_plan_size = 0;
  void* pointers = nullptr;
  size_t pointers_bytes = 0;
};
Mappings g_mappings;
constexpr long kReleaseAfterNs = 100L * 1000 * 1000;
volatile sig_atomic_t g_release_due = 0;
void release_due(int) { g_release_due = 1; }

void release_mappings() {
  const Mappings& m = g_mappings;
  ::munmap(const_cast<PlanHeader*>(m.plan), m.plan_size);
  ::close(kFdPlan);
  if (m.park_plan != nullptr) {
    ::munmap(const_cast<PlanHeader*>(m.park_plan), m.park_plan_size);
  }
  const size_t guard = static_cast<size_t>(::getpagesize());
  ::munmap(g_command_stack - guard, guard + kCommandStackBytes);
  if (m.pointers != static_cast<void*>(g_arrays.pointers)) {
    ::munmap(m.pointers, m.pointers_bytes);
  }
  for (size_t i = 0; i < g_n_vdso; ++i) {
    ::munmap(reinterpret_cast<void*>(g_vdso[i].lo), g_vdso[i].hi - g_vdso[i].lo);
  }
}

// Opens an absolute path one component at a time from the sandbox's root, following no
// symlink in any of them (O_NOFOLLOW on a directory open: ENOTDIR; the caller's dev/ino check
// then fails anyway), as openat2's RESOLVE_NO_SYMLINKS would: the command's filters, which a
// parked init may run under already, answer openat2 with ENOSYS. "." and ".." are refused
// (the spawner's path is normalized). -1 with errno on failure.
int open_cwd_beneath_root(const char* path) {
  if (path[0] != '/') {
    errno = EINVAL;
    return -1;
  }
  int dir = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  char name[256];
  for (const char* p = path; dir >= 0;) {
    while (*p == '/') {
      ++p;
    }
    if (*p == '\0') {
      return dir;
    }
    size_t len = std::strcspn(p, "/");
    if (len >= sizeof name || (len == 1 && p[0] == '.') ||
        (len == 2 && p[0] == '.' && p[1] == '.')) {
      ::close(dir);
      errno = len >= sizeof name ? ENAMETOOLONG : EINVAL;
      return -1;
    }
    std::memcpy(name, p, len);
    name[len] = '\0';
    p += len;
    int next = ::openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int err = errno;
    ::close(dir);
    errno = err;
    dir = next;
  }
  return -1;
}

// Warm pool: says it is ready, then waits for its job (plan_format.hpp, ParkedJob) and puts
// the job's descriptors at their fixed numbers, enters its cwd and lets the command's ruleset
// reach a pinned executable. EOF: the pool was emptied before a job came.
void receive_job() {
  touch_job_pages();
  StatusRecord ready{};
  ready.kind = RecordKind::kParked;
  send_record(ready);

  ParkedJob& job = g_job;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kParkedJobFds)];
  struct iovec iov {
    &job, sizeof job
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(kFdStatus, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n == 0) {
    ::_exit(0);
  }
  if (n < 0) {
    fail(SetupStep::kInitJob, errno, 125);
  }
  int fds[kParkedJobFds];
  size_t nfds = 0;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      continue;
    }
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && nfds < kParkedJobFds; ++i) {
      std::memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
  }
  bool has_exec = (job.flags & kParkedJobHasExec) != 0;
  if (static_cast<size_t>(n) != sizeof job || job.magic != kParkedJobMagic ||
      (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || nfds != (has_exec ? 5u : 4u) ||
      ::memchr(job.cwd, '\0', sizeof job.cwd) == nullptr) {
    fail(SetupStep::kInitJob, EINVAL, 125);
  }
  // Staged above every target first, so no dup3 clobbers a descriptor still to be moved.
  const int targets[kParkedJobFds] = {kFdPlan, 0, 1, 2, kFdExec};
  for (size_t i = 0; i < nfds; ++i) {
    int staged = ::fcntl(fds[i], F_DUPFD_CLOEXEC, 100);
    if (staged < 0) {
      fail(SetupStep::kInitJob, errno, 125);
    }
    ::close(fds[i]);
    fds[i] = staged;
  }
  for (size_t i = 0; i < nfds; ++i) {
    if (::dup3(fds[i], targets[i], 0) < 0) {
      fail(SetupStep::kInitJob, errno, 125);
    }
    ::close(fds[i]);
  }

  // The cwd, checked against what the spawner resolved (as the unparked child does).
  int cwd = open_cwd_beneath_root(job.cwd);
  if (cwd < 0) {
    int err = errno;
    fail(SetupStep::kCwd,
         err == ELOOP || err == ENOENT || err == ENOTDIR || err == EXDEV ? ESTALE : err, 125);
  }
  struct stat st {};
  if (::fstat(cwd, &st) != 0) {
    fail(SetupStep::kCwd, errno, 125);
  }
  if (st.st_dev != job.cwd_dev || st.st_ino != job.cwd_ino) {
    fail(SetupStep::kCwd, ESTALE, 125);
  }
  if (::fchdir(cwd) != 0) {
    fail(SetupStep::kCwd, errno, 125);
  }
  ::close(cwd);

  // The ruleset is not enforced yet (the command restricts itself with it once started),
  // so a rule can still be added.
  if (has_exec && job.exec_access != 0) {
    sys::LandlockPathBeneathAttr pb{};
    pb.allowed_access = job.exec_access;
    pb.parent_fd = kFdExec;
    if (sys::landlock_add_rule(kFdLandlockCmd, sys::kLandlockRuleTypePathBeneath, &pb, 0) != 0) {
      fail(SetupStep::kLandlock, errno, 125);
    }
  }
}

// Warm pool: loads the command's filters while parked, off the job's path (two JIT-compiled
// programs, ~0.4 ms here, docs/performance.md). From here to its exit init, and the command
// until its exec, run under them; the spawner set kPlanPreloadFilters only for programs that
// allow every call made there (seccomp.cpp, preload_calls). no_new_privs first, as the command
// sets it before loading them.
void preload_command_filters(const PlanHeader* h) {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    fail(SetupStep::kCommandNoNewPrivs, errno, 125);
  }
  load_command_filters(h, reinterpret_cast<const char*>(h), 125);
  g_filters_preloaded = true;
}

// A job's plan must carry the very programs init loaded while parked, with no wall off.
bool same_command_filters(const PlanHeader* parked, const PlanHeader* job) {
  const auto* a = reinterpret_cast<const char*>(parked);
  const auto* b = reinterpret_cast<const char*>(job);
  constexpr size_t kInsn = sizeof(struct sock_filter);
  return (job->flags & (kPlanNoProfileFilter | kPlanNoFixedFilter | kPlanNoNoNewPrivs)) == 0 &&
         job->profile_count == parked->profile_count && job->fixed_count == parked->fixed_count &&
         std::memcmp(a + parked->profile_off, b + job->profile_off,
                     parked->profile_count * kInsn) == 0 &&
         std::memcmp(a + parked->fixed_off, b + job->fixed_off, parked->fixed_count * kInsn) == 0;
}

}  // namespace

int init_main() {
  // First: nobody in the sandbox may ptrace us or read our memory through /proc/1/mem.
  size_t size = 0;
  const PlanHeader* h = map_plan(&size);
  if (!(h->flags & kPlanKeepDumpable) && ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    fail(SetupStep::kInitPlan, errno, 125);
  }
  use_global_futex_hash();
  map_command_stack();
  find_vdso();
  if (h->flags & kPlanParked) {
    if (h->flags & kPlanPreloadFilters) {
      // Only with both programs and no wall off (prepare_plan_file): never a preload that
      // would leave one of them out of the command.
      if ((h->flags & (kPlanNoProfileFilter | kPlanNoFixedFilter | kPlanNoNoNewPrivs)) ||
          h->profile_count == 0 || h->fixed_count == 0) {
        fail(SetupStep::kInitPlan, EINVAL, 125);
      }
      preload_command_filters(h);
    }
    receive_job();
    const PlanHeader* parked = h;
    const size_t parked_size = size;
    h = map_plan(&size);
    if ((h->flags & kPlanParked) || (g_filters_preloaded && !same_command_filters(parked, h))) {
      fail(SetupStep::kInitJob, EINVAL, 125);
    }
    g_mappings.park_plan = parked;  // released with the job's (release_mappings)
    g_mappings.park_plan_size = parked_size;
  }
  const char* base = reinterpret_cast<const char*>(h);

  // argv/envp pointer arrays: static when they fit, else in anonymous memory (init has no
  // heap of its own to speak of).
  size_t nptr = static_cast<size_t>(h->argc) + 1 + h->envc + 1;
  void* arr = g_arrays.pointers;
  if (nptr > kStaticPointers) {
    arr = ::mmap(nullptr, nptr * sizeof(char*), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
    if (arr == MAP_FAILED) {
      fail(SetupStep::kInitPlan, errno, 125);
    }
  }
  char** argv = static_cast<char**>(arr);
  char** envp = argv + h->argc + 1;
  const char* s = base + h->strings_off;
  const char* end = s + h->strings_len;
  for (uint32_t i = 0; i < h->argc + h->envc; ++i) {
    if (s >= end) {
      fail(SetupStep::kInitPlan, EINVAL, 125);
    }
    char** slot = i < h->argc ? &argv[i] : &envp[i - h->argc];
    *slot = const_cast<char*>(s);
    s += std::strlen(s) + 1;
  }
  argv[h->argc] = nullptr;
  envp[h->envc] = nullptr;
  const char* exec_path = s < end ? s : "";

  // Signal forwarding is installed before the command starts so no request is lost.
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : kForwardedSignals) {
    ::sigaction(sig, &sa, nullptr);
  }

  // Blocked across the start: the child must not run init's handler for a termination request
  // (it would forward it to nobody and survive); init itself gets it once the child has
  // exec'd (start_command waits for that), so a request made meanwhile reaches the exec'd
  // command.
  sigset_t term, old;
  sigemptyset(&term);
  for (int sig : kForwardedSignals) {
    sigaddset(&term, sig);
  }
  ::sigprocmask(SIG_BLOCK, &term, &old);
  CommandStart start{h, base, argv, envp, exec_path};
  pid_t cmd = start_command(&start);
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  StatusRecord started{};
  started.kind = RecordKind::kCommandStarted;
  started.pid = cmd;
  send_record(started);

  // Confine ourselves: nothing but reaping, signalling, reporting and, for a command that runs
  // on, releasing the start's mappings is left to do.
  if (!(h->flags & kPlanExecByPath)) {
    ::close(kFdExec);
  }
  ::close(kFdLandlockCmd);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      sys::landlock_restrict_self(kFdLandlockInit, 0) != 0) {
    ::kill(cmd, SIGKILL);
    fail(SetupStep::kInitConfine, errno, 125);
  }
  ::close(kFdLandlockInit);
  // The start's mappings go once the command has run for kReleaseAfterNs (release_mappings):
  // a one-shot timer whose SIGALRM interrupts the wait below (no SA_RESTART). A command that
  // ends first takes them with init's exit. Without the timer (setitimer failed) they go now.
  g_mappings.plan = h;
  g_mappings.plan_size = size;
  g_mappings.pointers = arr;
  g_mappings.pointers_bytes = nptr * sizeof(char*);
  struct sigaction due {};
  due.sa_handler = release_due;
  sigemptyset(&due.sa_mask);
  struct itimerval after {};
  after.it_value.tv_usec = kReleaseAfterNs / 1000;
  if (::sigaction(SIGALRM, &due, nullptr) != 0 || ::setitimer(ITIMER_REAL, &after, nullptr) != 0) {
    g_release_due = 1;
  }
  // init's own filter, from the plan (still mapped).
  const uint32_t init_count = h->init_count;
  if (init_count > kMaxInitFilterInsns) {  // prepare_plan_file refuses that
    ::kill(cmd, SIGKILL);
    fail(SetupStep::kInitConfine, E2BIG, 125);
  }
  if (init_count > 0 && load_filter(reinterpret_cast<const struct sock_filter*>(base + h->init_off),
                                    init_count) != 0) {
    ::kill(cmd, SIGKILL);
    fail(SetupStep::kInitConfine, errno, 125);
  }

  bool released = false;
  for (;;) {
    if (g_release_due && !released) {
      release_mappings();
      released = true;
    }
    int status = 0;
    pid_t pid = static_cast<pid_t>(::syscall(SYS_wait4, -1, &status, 0, nullptr));
    if (pid < 0) {
      if (errno == EINTR) {
        continue;
      }
      // ECHILD before the command was reaped cannot happen: said, with the errno, if it does
      // (session 37: CI saw an init end once without the command's status, cause unknown).
      fail(SetupStep::kInitWait, errno, 125);
    }
    if (pid == cmd) {
      StatusRecord done{};
      done.kind = RecordKind::kCommandExited;
      done.wait_status = status;
      // Reaps what already died; ECHILD: no child of ours is left, so nothing but init is in
      // the pid namespace (status.hpp, kExitedAlone).
      int other = 0;
      pid_t left;
      do {
        left = static_cast<pid_t>(::syscall(SYS_wait4, -1, &other, WNOHANG | __WALL, nullptr));
      } while (left > 0 || (left < 0 && errno == EINTR));
      if (left < 0 && errno == ECHILD) {
        done.flags = kExitedAlone;
      }
      send_record(done);
      // The channel's end is the engine's cue to settle, before our exit's teardown.
      ::close(kFdStatus);
      // Our exit kills every process left in the pid namespace.
      ::_exit(0);
    }
  }
}

}  // namespace cordon::sandbox
