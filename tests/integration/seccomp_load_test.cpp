#define BOOST_TEST_MODULE seccomp_load
#include <boost/test/unit_test.hpp>

// Forks children that load the real compiled filters (the shipped default profile, then the
// fixed filter) exactly as the sandbox child does, make one syscall and exit with the errno
// they got. Controls run the same syscall without the filter in question, so a pass proves
// the filter, not the environment.

#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "policy/seccomp_profile.hpp"
#include "sandbox/seccomp.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;
using namespace cordon::sandbox;

namespace {

constexpr int kLoadFailed = 200;  // exit codes at or above this: the child could not confine

struct Outcome {
  bool signaled = false;
  int signal = 0;
  int err = 0;  // 0: the syscall succeeded
};
std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return o.signaled ? os << "signal " << o.signal : os << "errno " << o.err;
}

struct Fixture {
  CompiledFilters filters;
  BpfProgram init;
  std::string dir;

  Fixture() {
    auto profile = policy::load_seccomp_profile(std::string(CORDON_SECCOMP_DIR) + "/default.json");
    BOOST_REQUIRE(profile.has_value());
    auto compiled = compile_filters(*profile, {});
    BOOST_REQUIRE(compiled.has_value());
    filters = std::move(*compiled);
    auto i = compile_init_filter();
    BOOST_REQUIRE(i.has_value());
    init = std::move(*i);
    char tmpl[] = "/tmp/cordon-seccomp-XXXXXX";
    BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~Fixture() { std::system(("rm -rf -- '" + dir + "'").c_str()); }
};

// Runs `call` in a forked child after loading `progs` in order; `call` returns a raw syscall
// result. Only raw syscalls run in the child between fork and _exit.
Outcome run_confined(const std::vector<const BpfProgram*>& progs,
                     const std::function<long()>& call) {
  pid_t pid = ::fork();
  BOOST_REQUIRE_MESSAGE(pid >= 0, "fork: " << errno);
  if (pid == 0) {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      ::_exit(kLoadFailed);
    }
    for (const BpfProgram* p : progs) {
      struct sock_fprog fprog = {static_cast<unsigned short>(p->insns.size()),
                                 const_cast<sock_filter*>(p->insns.data())};
      if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) {
        ::_exit(kLoadFailed + 1);
      }
    }
    long r = call();
    int code = r < 0 ? errno : 0;
    // exit_group itself, not _exit(): a sanitizer runtime intercepts _exit to run its exit
    // hooks (LeakSanitizer's check clones and ptraces), which the filter just loaded kills.
    ::syscall(SYS_exit_group, code);
    ::_exit(code);
  }
  int status = 0;
  pid_t w;
  do {
    w = ::waitpid(pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  BOOST_REQUIRE_MESSAGE(w == pid, "waitpid: " << errno);
  Outcome o;
  if (WIFSIGNALED(status)) {
    o.signaled = true;
    o.signal = WTERMSIG(status);
  } else {
    o.err = WEXITSTATUS(status);
    BOOST_REQUIRE_MESSAGE(o.err < kLoadFailed, "the child could not load its filters");
  }
  return o;
}

Outcome errno_is(int err) { return Outcome{false, 0, err}; }
bool same(const Outcome& a, const Outcome& b) {
  return a.signaled == b.signaled && a.signal == b.signal && a.err == b.err;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(kernel_answers, Fixture)

// With the opt-in (`--allow-netlink`, policy allowNetlinkRoute), NETLINK_ROUTE only.
BOOST_AUTO_TEST_CASE(netlink_route_only_with_its_opt_in) {
  auto profile = policy::load_seccomp_profile(std::string(CORDON_SECCOMP_DIR) + "/default.json");
  BOOST_REQUIRE(profile.has_value());
  auto opted = compile_filters(*profile, {.allow_netlink_route = true});
  BOOST_REQUIRE(opted.has_value());
  const std::vector<const BpfProgram*> both = {&opted->profile, &opted->fixed};
  Outcome route = run_confined(both, [] { return ::syscall(SYS_socket, AF_NETLINK, SOCK_RAW, 0); });
  BOOST_TEST(same(route, errno_is(0)), route);
  Outcome audit = run_confined(both, [] { return ::syscall(SYS_socket, AF_NETLINK, SOCK_RAW, 9); });
  BOOST_TEST(same(audit, errno_is(EAFNOSUPPORT)), audit);
}

BOOST_AUTO_TEST_CASE(answers_as_the_profile_and_fixed_filter_say) {
  const std::vector<const BpfProgram*> both = {&filters.profile, &filters.fixed};
  auto check = [&](const char* what, const std::function<long()>& call, Outcome want) {
    Outcome got = run_confined(both, call);
    BOOST_TEST(same(got, want), what << ": got " << got << ", want " << want);
  };
  check(
      "getpid", [] { return ::syscall(SYS_getpid); }, errno_is(0));
  check(
      "mount", [] { return ::syscall(SYS_mount, "none", "/mnt", "tmpfs", 0, nullptr); },
      errno_is(EPERM));
  check(
      "syscall 1000", [] { return ::syscall(1000); }, errno_is(ENOSYS));
  check(
      "clone3", [] { return ::syscall(SYS_clone3, nullptr, 0); }, errno_is(ENOSYS));
  check(
      "openat2", [] { return ::syscall(SYS_openat2, AT_FDCWD, "/", nullptr, 0); },
      errno_is(ENOSYS));
  check(
      "ioctl TIOCSTI with bit 32",
      [] {
        char c = 'x';
        return ::syscall(SYS_ioctl, 0, (1UL << 32) | TIOCSTI, &c);
      },
      errno_is(EPERM));
  check(
      "socket AF_VSOCK", [] { return ::syscall(SYS_socket, 40, SOCK_STREAM, 0); },
      errno_is(EAFNOSUPPORT));
  check(
      "socket AF_PACKET", [] { return ::syscall(SYS_socket, AF_PACKET, SOCK_RAW, 0); },
      errno_is(EAFNOSUPPORT));
  check(
      "socket AF_INET", [] { return ::syscall(SYS_socket, AF_INET, SOCK_STREAM, 0); }, errno_is(0));
  check(
      "socket AF_NETLINK ROUTE", [] { return ::syscall(SYS_socket, AF_NETLINK, SOCK_RAW, 0); },
      errno_is(EAFNOSUPPORT));
  check(
      "socket AF_NETLINK AUDIT", [] { return ::syscall(SYS_socket, AF_NETLINK, SOCK_RAW, 9); },
      errno_is(EAFNOSUPPORT));
  check(
      "unshare CLONE_NEWUSER", [] { return ::syscall(SYS_unshare, CLONE_NEWUSER); },
      errno_is(EPERM));
  check(
      "clone CLONE_NEWUSER",
      [] {
        long r = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, nullptr, nullptr, nullptr, 0);
        if (r == 0) {
          ::_exit(0);  // the grandchild, if the filter failed
        }
        return r;
      },
      errno_is(EPERM));
  check(
      "personality ADDR_NO_RANDOMIZE", [] { return ::syscall(SYS_personality, ADDR_NO_RANDOMIZE); },
      errno_is(EPERM));
  check(
      "personality query", [] { return ::syscall(SYS_personality, 0xffffffffUL); }, errno_is(0));
  check(
      "ptrace", [] { return ::syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0); }, errno_is(EPERM));

  // A foreign ABI kills the process: x32 (bit 30 in the number) and i386 (int 0x80).
  Outcome sigsys{true, SIGSYS, 0};
  check(
      "x32 getpid", [] { return ::syscall(0x40000000L | SYS_getpid); }, sigsys);
  auto i386_getpid = [] {
    // The default action for SIGSEGV, past a sanitizer's handler (a raw rt_sigaction), so a
    // fault reads as one.
    struct {
      unsigned long handler, flags, restorer, mask;
    } dfl{};
    ::syscall(SYS_rt_sigaction, SIGSEGV, &dfl, nullptr, 8);
    long ret = 20;  // __NR_getpid on i386
    asm volatile("int $0x80" : "+a"(ret) : : "memory");
    return ret;
  };
  // Control, no filter: where the host delivers int $0x80 (IA32 emulation), getpid runs.
  // A host without an i386 entry (a PVM guest: no int $0x80 gate, the CPU faults before the
  // kernel sees a syscall) refuses it itself; there the confined call must fault the same way
  // (the filters' i386 answer is checked on their BPF in sandbox_seccomp's unit test).
  Outcome control = run_confined({}, i386_getpid);
  const bool host_runs_i386 = same(control, errno_is(0));
  BOOST_TEST((host_runs_i386 || same(control, Outcome{true, SIGSEGV, 0})),
             "i386 getpid without a filter: " << control);
  check("i386 getpid", i386_getpid, host_runs_i386 ? sigsys : Outcome{true, SIGSEGV, 0});
}

BOOST_AUTO_TEST_CASE(refuses_setuid_bits_and_the_control_shows_the_filter_did_it) {
  const std::vector<const BpfProgram*> both = {&filters.profile, &filters.fixed};
  const std::vector<const BpfProgram*> profile_only = {&filters.profile};
  std::string file = dir + "/f";
  int fd = ::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  BOOST_REQUIRE(fd >= 0);
  ::close(fd);
  const char* f = file.c_str();
  auto mode_of = [&] {
    struct stat st {};
    BOOST_REQUIRE(::stat(f, &st) == 0);
    return st.st_mode & 07777;
  };

  auto chmod_to = [f](mode_t m) { return [f, m] { return ::syscall(SYS_chmod, f, m); }; };
  BOOST_TEST(same(run_confined(both, chmod_to(04755)), errno_is(EPERM)));
  BOOST_TEST(same(run_confined(both, chmod_to(02755)), errno_is(EPERM)));
  BOOST_TEST(mode_of() == 0644u);
  BOOST_TEST(same(run_confined(both, chmod_to(0755)), errno_is(0)));
  BOOST_TEST(mode_of() == 0755u);
  BOOST_TEST(
      same(run_confined(both, [f] { return ::syscall(sys::kNrFchmodat2, AT_FDCWD, f, 04755, 0); }),
           errno_is(EPERM)));
  // Control: the profile alone allows chmod, so the same call succeeds.
  BOOST_TEST(same(run_confined(profile_only, chmod_to(04755)), errno_is(0)));
  BOOST_TEST(mode_of() == 04755u);

  std::string created = dir + "/new";
  const char* c = created.c_str();
  BOOST_TEST(
      same(run_confined(
               both, [c] { return ::syscall(SYS_open, c, O_CREAT | O_WRONLY | O_CLOEXEC, 06755); }),
           errno_is(EPERM)));
  BOOST_TEST(::access(c, F_OK) != 0);
  BOOST_TEST(same(run_confined(both,
                               [c] {
                                 return ::syscall(SYS_openat, AT_FDCWD, c,
                                                  O_CREAT | O_WRONLY | O_CLOEXEC, 04755);
                               }),
                  errno_is(EPERM)));
  std::string d = dir;
  BOOST_TEST(same(run_confined(both,
                               [&d] {
                                 return ::syscall(SYS_openat, AT_FDCWD, d.c_str(),
                                                  O_TMPFILE | O_RDWR, 04755);
                               }),
                  errno_is(EPERM)));
  BOOST_TEST(same(run_confined(both,
                               [c] {
                                 return ::syscall(SYS_openat, AT_FDCWD, c,
                                                  O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
                               }),
                  errno_is(0)));
}

BOOST_AUTO_TEST_CASE(controls_without_the_fixed_filter_reach_the_kernel) {
  const std::vector<const BpfProgram*> none = {};
  // As root and without filters these succeed or fail differently, so the answers above are
  // the filters' own.
  BOOST_TEST(
      same(run_confined(none, [] { return ::syscall(SYS_unshare, CLONE_NEWUSER); }), errno_is(0)));
  BOOST_TEST(
      same(run_confined(none, [] { return ::syscall(SYS_clone3, nullptr, 0); }), errno_is(EINVAL)));
  Outcome ioctl = run_confined(none, [] {
    char ch = 'x';
    int fds[2];
    if (::pipe(fds) != 0) {
      return -1L;
    }
    return ::syscall(SYS_ioctl, fds[0], (1UL << 32) | TIOCSTI, &ch);
  });
  BOOST_TEST(same(ioctl, errno_is(ENOTTY)), ioctl);
  Outcome vsock = run_confined(none, [] { return ::syscall(SYS_socket, 40, SOCK_STREAM, 0); });
  BOOST_TEST(!same(vsock, errno_is(EAFNOSUPPORT)), "AF_VSOCK without the filter: " << vsock);
}

BOOST_AUTO_TEST_CASE(init_filter_kills_anything_off_its_list) {
  const std::vector<const BpfProgram*> init_only = {&init};
  BOOST_TEST(same(run_confined(init_only, [] { return ::syscall(SYS_getpid); }),
                  Outcome{true, SIGSYS, 0}));
  BOOST_TEST(
      same(run_confined(init_only, [] { return ::syscall(SYS_close, 999); }), errno_is(EBADF)));
  BOOST_TEST(same(run_confined(init_only, [] { return ::syscall(SYS_kill, 0, 0); }), errno_is(0)));
}

BOOST_AUTO_TEST_SUITE_END()
