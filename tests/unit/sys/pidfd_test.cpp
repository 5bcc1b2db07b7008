#define BOOST_TEST_MODULE sys_pidfd
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <thread>

#include "base/unique_fd.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;

// The engine tells an OOM-killed sandbox init from one that died otherwise by its wait status,
// which the spawner (its parent, not the engine) reaps: PIDFD_GET_INFO gives it to any holder
// of a pidfd once the process is reaped (Linux 6.15; this machine runs 6.18).
BOOST_AUTO_TEST_CASE(the_wait_status_comes_once_the_parent_reaped) {
  for (int sig : {SIGKILL, SIGUSR1}) {
    int ready[2];
    BOOST_TEST_REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
    pid_t child = ::fork();
    BOOST_TEST_REQUIRE(child >= 0);
    if (child == 0) {
      // Default disposition and nothing blocked (whatever Boost.Test set up), then say so.
      ::signal(SIGUSR1, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      (void)!::write(ready[1], "r", 1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char r = 0;
    BOOST_TEST_REQUIRE(::read(ready[0], &r, 1) == 1);
    ::close(ready[0]);
    UniqueFd pidfd(sys::pidfd_open(child, 0));
    BOOST_TEST_REQUIRE(pidfd.get() >= 0);
    BOOST_TEST_REQUIRE(::kill(child, sig) == 0);
    // Dead but not reaped: no status yet, and the wait is bounded.
    siginfo_t info{};
    BOOST_TEST_REQUIRE(::waitid(P_PID, child, &info, WEXITED | WNOWAIT) == 0);
    BOOST_TEST(!sys::reaped_wait_status(pidfd.get(), 20).has_value());
    // Reaped by someone else meanwhile (here a thread, for the spawner): the status arrives.
    std::thread reaper([child] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      int status = 0;
      ::waitpid(child, &status, 0);
    });
    auto status = sys::reaped_wait_status(pidfd.get(), 2000);
    reaper.join();
    BOOST_TEST_REQUIRE(status.has_value());
    BOOST_TEST(WIFSIGNALED(*status));
    BOOST_TEST(WTERMSIG(*status) == sig);
  }
  // An exit code reads as one.
  pid_t child = ::fork();
  BOOST_TEST_REQUIRE(child >= 0);
  if (child == 0) {
    ::_exit(7);
  }
  UniqueFd pidfd(sys::pidfd_open(child, 0));
  BOOST_TEST_REQUIRE(pidfd.get() >= 0);
  int reaped = 0;
  BOOST_TEST_REQUIRE(::waitpid(child, &reaped, 0) == child);
  auto status = sys::reaped_wait_status(pidfd.get(), 0);
  BOOST_TEST_REQUIRE(status.has_value());
  BOOST_TEST(WIFEXITED(*status));
  BOOST_TEST(WEXITSTATUS(*status) == 7);
}
