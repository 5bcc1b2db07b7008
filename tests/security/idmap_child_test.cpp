#define BOOST_TEST_MODULE security_idmap_child

// The host side of every sandbox build: before it mounts the working root idmapped, cordon (the
// spawner, or `cordon run` itself) makes a user namespace for the idmapping, with a child that
// only waits while the maps are written; on x86-64 the child shares cordon's memory and
// descriptor table. A namespace owned by root would give every process of euid 0, even one
// that dropped every capability, CAP_SYS_PTRACE over that child. The attack: such a process
// (root without capabilities, like a service that dropped them) watches for the child and
// opens its /proc/<pid>/mem (cordon's memory) for reading and for writing, reads a descriptor
// through /proc/<pid>/fd and takes one with pidfd_getfd, and opens /proc/<pid>/ns/user (the
// namespace whose maps cordon is writing). The wall: the child is made with the effective ids
// of the sandbox's host id, so the namespace is that id's and the child's credentials are not
// the attacker's (the kernel also turns cordon non-dumpable at that change of its effective
// ids, fs.suid_dumpable 0: a second wall for memory and descriptors while the child lives,
// not for a child that is exiting on kernels before the fix of CVE-2026-46333; the first holds
// there too). The control: the same attacker against a child made as root (a fork in a new
// user namespace, as cordon made it before session 25) gets all of them, so the refusal is the
// wall's, not the attacker's blindness.

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/nsfs.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/userns.hpp"

namespace {

constexpr uid_t kHostBase = 0x7B100000;

// What the attacker finds: in the caller's memory (at the same address in a copy of it) and
// in its descriptor table (a memfd of this name).
char g_secret[64] = "cordon-idmap-child-secret-5b1e";
constexpr const char* kMarkerName = "cordon-idmap-marker";

struct Tally {
  std::atomic<int> stop{0};
  std::atomic<int> ready{0};        // 1: capabilities dropped; -1: could not drop them
  std::atomic<long> tries{0};       // a child found and its /proc/<pid>/mem tried
  std::atomic<long> refused{0};     // ... refused (EACCES/EPERM)
  std::atomic<long> mem_opened{0};  // ... opened
  std::atomic<long> leaked{0};      // ... and the secret read from it
  std::atomic<long> writable{0};    // ... opened for writing (never written)
  std::atomic<long> fd_refused{0};  // /proc/<pid>/fd/<marker> refused
  std::atomic<long> fd_read{0};     // ... read, naming the marker
  std::atomic<long> fd_taken{0};    // the marker taken with pidfd_getfd
  std::atomic<long> ns_opened{0};   // /proc/<pid>/ns/user opened
  std::atomic<long> rounds{0};      // passes over the children list, each one finished
};

// Root with no capability at all (effective, permitted, inheritable), as the attacker.
bool drop_all_capabilities() {
  __user_cap_header_struct hdr{};
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  hdr.pid = 0;
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capset, &hdr, data) != 0) {
    return false;
  }
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      return line.find_first_not_of("0\t ", 7) == std::string::npos && ::geteuid() == 0;
    }
  }
  return false;
}

// The attacker's loop: the children of the victim's thread, each one's memory and descriptor.
[[noreturn]] void attack(Tally* t, pid_t victim, pid_t victim_tid, int marker_fd) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || ::getppid() != victim ||
      !drop_all_capabilities()) {
    t->ready = -1;
    ::_exit(1);
  }
  t->ready = 1;
  const pid_t self = ::getpid();
  const std::string children =
      "/proc/" + std::to_string(victim) + "/task/" + std::to_string(victim_tid) + "/children";
  char buf[sizeof g_secret];
  while (t->stop.load() == 0) {
    std::ifstream in(children);
    pid_t pid = 0;
    while (in >> pid) {
      if (pid == self) {
        continue;
      }
      const std::string proc = "/proc/" + std::to_string(pid);
      int fd = ::open((proc + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        ++t->tries;
        ++t->mem_opened;
        ssize_t n =
            ::pread(fd, buf, sizeof buf, static_cast<off_t>(reinterpret_cast<uintptr_t>(g_secret)));
        if (n == static_cast<ssize_t>(sizeof buf) && std::strcmp(buf, g_secret) == 0) {
          ++t->leaked;
        }
        ::close(fd);
      } else if (errno == EACCES || errno == EPERM) {
        ++t->tries;
        ++t->refused;
      }
      fd = ::open((proc + "/mem").c_str(), O_RDWR | O_CLOEXEC);
      if (fd >= 0) {
        ++t->writable;
        ::close(fd);
      }
      char link[256];
      ssize_t n =
          ::readlink((proc + "/fd/" + std::to_string(marker_fd)).c_str(), link, sizeof link - 1);
      if (n > 0) {
        link[n] = '\0';
        if (std::strstr(link, kMarkerName) != nullptr) {
          ++t->fd_read;
        }
      } else if (errno == EACCES || errno == EPERM) {
        ++t->fd_refused;
      }
      int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (pidfd >= 0) {
        int taken = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, marker_fd, 0));
        if (taken >= 0) {
          ++t->fd_taken;
          ::close(taken);
        }
        ::close(pidfd);
      }
      fd = ::open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        ++t->ns_opened;
        ::close(fd);
      }
    }
    ++t->rounds;
  }
  ::_exit(0);
}

struct Attacker {
  Tally* t = nullptr;
  pid_t pid = -1;
  int marker = -1;
  Attacker() {
    void* m =
        ::mmap(nullptr, sizeof(Tally), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    BOOST_REQUIRE(m != MAP_FAILED);
    t = new (m) Tally();
    marker = ::memfd_create(kMarkerName, 0);  // inherited by every child we make
    BOOST_REQUIRE(marker >= 0);
    const pid_t victim = ::getpid();
    const pid_t victim_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      attack(t, victim, victim_tid, marker);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (t->ready.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    BOOST_REQUIRE_MESSAGE(t->ready.load() == 1, "the attacker could not drop its capabilities");
  }
  ~Attacker() {
    t->stop = 1;
    int st = 0;
    ::waitpid(pid, &st, 0);
    ::close(marker);
    ::munmap(t, sizeof(Tally));
  }
  // Zeroes the tally once every pass that may have met an earlier child is finished (a pass
  // under way could count what it found before the reset after it).
  void reset() {
    const long now = t->rounds.load();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (t->rounds.load() < now + 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    BOOST_REQUIRE(t->rounds.load() >= now + 2);
    t->tries = t->refused = t->mem_opened = t->leaked = t->writable = 0;
    t->fd_refused = t->fd_read = t->fd_taken = t->ns_opened = 0;
  }
};

// A child made as make_idmap_userns made its own before session 25: a fork, as root, in a new
// user namespace, that waits for its pipe's EOF. Returns its pidfd; `hold` is the write end.
int root_owned_child(int& hold) {
  int p[2];
  BOOST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  int pidfd = -1;
  clone_args args{};
  args.flags = CLONE_NEWUSER | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    char c;
    ::close(p[1]);
    while (::read(p[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  ::close(p[0]);
  hold = p[1];
  return pidfd;
}

template <typename Pred>
bool wait_for(Pred pred, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_root_without_capabilities_cannot_reach_into_the_idmap_child) {
  BOOST_REQUIRE_MESSAGE(::geteuid() == 0, "needs root (the idmap child's namespace is root's)");
  // The control needs us dumpable: no make_idmap_userns has run in this process yet (a change
  // of the effective ids turns a process non-dumpable, fs.suid_dumpable).
  BOOST_REQUIRE(::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1);
  Attacker a;

  // Control: a child in a namespace of root's gives the attacker our memory, descriptors and
  // namespace.
  int hold = -1;
  int pidfd = root_owned_child(hold);
  bool reached = wait_for(
      [&] {
        return a.t->leaked.load() > 0 && a.t->writable.load() > 0 && a.t->fd_read.load() > 0 &&
               a.t->fd_taken.load() > 0 && a.t->ns_opened.load() > 0;
      },
      std::chrono::seconds(10));
  ::close(hold);
  siginfo_t info{};
  BOOST_TEST(::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) ==
             0);
  ::close(pidfd);
  BOOST_REQUIRE_MESSAGE(reached, "the control: from a root-owned child the attacker read memory ("
                                     << a.t->leaked.load() << "), opened it for writing ("
                                     << a.t->writable.load() << "), read a descriptor ("
                                     << a.t->fd_read.load() << "), took one ("
                                     << a.t->fd_taken.load() << ") and opened the namespace ("
                                     << a.t->ns_opened.load() << ")");

  // The wall: make_idmap_userns's child, as often as it takes the attacker to meet it alive.
  a.reset();
  int made = 0, wrong_owner = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((a.t->refused.load() < 20 || made < 200) && std::chrono::steady_clock::now() < deadline) {
    auto ns = cordon::sandbox::make_idmap_userns(1000, 1000, kHostBase, kHostBase);
    BOOST_REQUIRE_MESSAGE(ns.has_value(), (ns ? std::string() : ns.error().message()));
    ++made;
    // The wall itself (on a host where fs.suid_dumpable is 0 the refusals above would also
    // come from our non-dumpable memory): the namespace is the host id's.
    uid_t owner = 0;
    if (::ioctl(ns->get(), NS_GET_OWNER_UID, &owner) != 0 || owner != kHostBase) {
      ++wrong_owner;
    }
  }
  // The last child is reaped: nothing the attacker counts from here on is ours.
  BOOST_TEST_MESSAGE("builds " << made << ", tries " << a.t->tries.load() << ", refused "
                               << a.t->refused.load() << ", fd refused " << a.t->fd_refused.load());
  BOOST_TEST(wrong_owner == 0);
  BOOST_TEST(a.t->refused.load() >= 20);  // it met the children alive, and was refused
  BOOST_TEST(a.t->mem_opened.load() == 0);
  BOOST_TEST(a.t->leaked.load() == 0);
  BOOST_TEST(a.t->writable.load() == 0);
  BOOST_TEST(a.t->fd_read.load() == 0);
  BOOST_TEST(a.t->fd_taken.load() == 0);
  BOOST_TEST(a.t->ns_opened.load() == 0);
  BOOST_TEST(a.t->fd_refused.load() > 0);
  // The caller is root again.
  BOOST_TEST(::geteuid() == 0u);
  BOOST_TEST(::getegid() == 0u);
}
