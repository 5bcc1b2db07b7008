#define BOOST_TEST_MODULE engine_kill_many
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/unique_fd.hpp"
#include "helpers/engine_fixture.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> start_sleeps(Engine& e, const std::string& session, int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    auto s = e.start(session, {.argv = {"/bin/sleep", "30"}});
    BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
    ids.push_back(s->task_id);
  }
  return ids;
}

// Every sandbox runs its init and its `sleep`: two processes per job.
void wait_running(const EngineEnv& env, size_t jobs) {
  BOOST_REQUIRE(eventually([&] { return env.sandbox_pids().size() == 2 * jobs; }));
}

ino_t inode_of(const std::string& path) {
  struct stat st {};
  BOOST_REQUIRE_MESSAGE(::stat(path.c_str(), &st) == 0, "stat " << path);
  return st.st_ino;
}

}  // namespace

BOOST_AUTO_TEST_CASE(kill_many_kills_every_listed_job_and_no_other) {
  EngineEnv env;
  auto e = open_engine(env);
  auto ids = start_sleeps(*e, "s1", 3);
  wait_running(env, 3);

  auto killed = e->kill_many("s1", {ids[0], ids[1]}, SIGKILL);
  BOOST_REQUIRE_MESSAGE(killed.has_value(), describe(killed));
  BOOST_REQUIRE_EQUAL(killed->size(), 2u);
  BOOST_TEST((*killed)[0].task_id == ids[0]);  // in the order asked
  BOOST_TEST((*killed)[1].task_id == ids[1]);

  auto w = e->wait("s1", {ids[0], ids[1]}, 20s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  for (const auto& st : *w) {
    BOOST_TEST(st.state == "killed");
    BOOST_TEST(st.signal.value_or("") == "SIGKILL");
  }
  auto third = e->status("s1", ids[2]);
  BOOST_REQUIRE_MESSAGE(third.has_value(), describe(third));
  BOOST_TEST(third->state == "running");
  BOOST_TEST(env.sandbox_pids().size() == 2u);  // the third sandbox's init and sleep

  BOOST_REQUIRE(e->kill_many("s1", {ids[2]}, SIGKILL).has_value());
  auto last = e->wait("s1", {ids[2]}, 20s, true);
  BOOST_REQUIRE_MESSAGE(last.has_value(), describe(last));
  BOOST_TEST(last->at(0).state == "killed");
}

BOOST_AUTO_TEST_CASE(kill_many_with_an_unknown_id_signals_none) {
  EngineEnv env;
  auto e = open_engine(env);
  auto ids = start_sleeps(*e, "s1", 2);
  wait_running(env, 2);

  auto refused = e->kill_many("s1", {ids[0], "t-no-such-task", ids[1]}, SIGKILL);
  BOOST_REQUIRE(!refused.has_value());
  // Another session's job is as unknown as a made-up id.
  auto other = e->start("s2", {.argv = {"/bin/sleep", "30"}});
  BOOST_REQUIRE_MESSAGE(other.has_value(), describe(other));
  wait_running(env, 3);
  BOOST_REQUIRE(!e->kill_many("s1", {ids[0], other->task_id}, SIGKILL).has_value());
  for (const auto& id : ids) {
    auto st = e->status("s1", id);
    BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
    BOOST_TEST(st->state == "running");
  }
  BOOST_TEST(env.sandbox_pids().size() == 6u);

  BOOST_REQUIRE(e->kill_many("s1", ids, SIGKILL).has_value());
  BOOST_REQUIRE(e->kill_many("s2", {other->task_id}, SIGKILL).has_value());
  BOOST_REQUIRE(e->wait("s1", ids, 20s, true).has_value());
  BOOST_REQUIRE(e->wait("s2", {other->task_id}, 20s, true).has_value());
}

BOOST_AUTO_TEST_CASE(kill_many_of_settled_and_repeated_ids_returns_their_statuses) {
  EngineEnv env;
  auto e = open_engine(env);
  auto done = e->start("s1", {.argv = {"/bin/sh", "-c", "exit 4"}});
  BOOST_REQUIRE_MESSAGE(done.has_value(), describe(done));
  auto settled = e->wait("s1", {done->task_id}, 20s, true);
  BOOST_REQUIRE_MESSAGE(settled.has_value(), describe(settled));
  BOOST_REQUIRE(settled->at(0).state == "exited");
  auto ids = start_sleeps(*e, "s1", 1);
  wait_running(env, 1);

  auto r = e->kill_many("s1", {done->task_id, ids[0], ids[0]}, SIGKILL);
  BOOST_REQUIRE_MESSAGE(r.has_value(), describe(r));
  BOOST_REQUIRE_EQUAL(r->size(), 3u);
  BOOST_TEST(r->at(0).state == "exited");  // a settled job's status comes back unchanged
  BOOST_TEST(r->at(0).exit_code.value_or(-1) == 4);
  auto w = e->wait("s1", {ids[0]}, 20s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  BOOST_TEST(w->at(0).state == "killed");
}

// The engine holds each sandbox's mount namespace (from its attach), so the dying processes do
// not tear it down themselves; the settle hands it to the releaser thread, which drops it. The
// engine must not keep it (a leak of every killed sandbox's mount tree) once the job settled.
BOOST_AUTO_TEST_CASE(a_killed_sandbox_s_mount_namespace_is_dropped_after_its_settle) {
  EngineEnv env;
  auto e = open_engine(env);
  auto ids = start_sleeps(*e, "s1", 2);
  wait_running(env, 2);
  std::vector<ino_t> namespaces;
  for (pid_t pid : env.sandbox_pids()) {
    namespaces.push_back(inode_of("/proc/" + std::to_string(pid) + "/ns/mnt"));
  }
  std::sort(namespaces.begin(), namespaces.end());
  namespaces.erase(std::unique(namespaces.begin(), namespaces.end()), namespaces.end());
  BOOST_REQUIRE_EQUAL(namespaces.size(), 2u);  // one per sandbox, its init's and command's
  BOOST_REQUIRE(namespaces[0] != inode_of("/proc/self/ns/mnt"));
  // Held from the attach, while the jobs run.
  for (ino_t ns : namespaces) {
    BOOST_TEST(eventually([&] { return fds_on_mount_ns(ns) == 1; }));
  }

  BOOST_REQUIRE(e->kill_many("s1", ids, SIGKILL).has_value());
  auto w = e->wait("s1", ids, 20s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  for (const auto& st : *w) {
    BOOST_TEST(st.state == "killed");
  }
  for (ino_t ns : namespaces) {
    BOOST_TEST(eventually([&] { return fds_on_mount_ns(ns) == 0; }));
  }
}

// A command that ends by itself: its sandbox's namespace is held while it runs (so its init's
// exit does not unmount the tree on the way out) and dropped after its settle.
BOOST_AUTO_TEST_CASE(a_finished_sandbox_s_mount_namespace_is_held_until_its_settle) {
  EngineEnv env;
  auto e = open_engine(env);
  auto t =
      e->start("s1", {.argv = {"/bin/sh", "-c", "read x; exit 3"}, .stdin_mode = StdinMode::kPipe});
  BOOST_REQUIRE_MESSAGE(t.has_value(), describe(t));
  wait_running(env, 1);
  auto pids = env.sandbox_pids();
  BOOST_REQUIRE(!pids.empty());
  ino_t ns = inode_of("/proc/" + std::to_string(pids[0]) + "/ns/mnt");
  BOOST_TEST(eventually([&] { return fds_on_mount_ns(ns) == 1; }));
  BOOST_REQUIRE(e->write("s1", t->task_id, {.eof = true}).has_value());
  auto w = e->wait("s1", {t->task_id}, 20s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  BOOST_TEST(w->at(0).state == "exited");
  BOOST_TEST(w->at(0).exit_code.value_or(-1) == 3);
  BOOST_TEST(eventually([&] { return fds_on_mount_ns(ns) == 0; }));
}

// The kernel mechanism the engine relies on, with the constant cordon defines itself (the
// 6.1 headers lack it): ioctl(pidfd, PIDFD_GET_MNT_NAMESPACE) returns the process's own mount
// namespace, and while that fd is open the namespace keeps its mounts after its last process
// is dead and reaped — its teardown happens when the fd is closed, not in the exit.
BOOST_AUTO_TEST_CASE(a_pidfd_s_mount_namespace_outlives_its_last_process) {
  char tmpl[] = "/tmp/cordon-mntns.XXXXXX";
  BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  int ready[2], go[2];
  BOOST_REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  BOOST_REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
  pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    char c = 0;
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0 ||
        ::write(ready[1], &c, 1) != 1) {
      ::_exit(1);
    }
    (void)::read(go[0], &c, 1);  // until killed
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(go[0]);
  UniqueFd go_w(go[1]);
  char c = 0;
  BOOST_REQUIRE_EQUAL(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  UniqueFd pidfd(sys::pidfd_open(child, 0));
  BOOST_REQUIRE(pidfd.valid());

  UniqueFd ns(::ioctl(pidfd.get(), sys::kPidfdGetMntNamespace, 0));
  BOOST_REQUIRE_MESSAGE(ns.valid(), "ioctl PIDFD_GET_MNT_NAMESPACE: " << std::strerror(errno));
  struct stat held {};
  BOOST_REQUIRE(::fstat(ns.get(), &held) == 0);
  BOOST_TEST(held.st_ino == inode_of("/proc/" + std::to_string(child) + "/ns/mnt"));
  BOOST_TEST(held.st_ino != inode_of("/proc/self/ns/mnt"));
  BOOST_REQUIRE(::fcntl(ns.get(), F_GETFD) & FD_CLOEXEC);  // never inherited by a spawn

  BOOST_REQUIRE(sys::pidfd_send_signal(pidfd.get(), SIGKILL, nullptr, 0) == 0);
  int status = 0;
  BOOST_REQUIRE_EQUAL(::waitpid(child, &status, 0), child);
  BOOST_REQUIRE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // Once dead, the process has no namespaces left to hand out.
  BOOST_TEST(::ioctl(pidfd.get(), sys::kPidfdGetMntNamespace, 0) < 0);

  // Entered through the held fd (in a child of ours: setns changes the caller), the dead
  // process's namespace still has its tmpfs on `dir`; ours never had it.
  struct statfs here {};
  BOOST_REQUIRE(::statfs(dir.c_str(), &here) == 0);
  BOOST_TEST(here.f_type != TMPFS_MAGIC);
  pid_t probe = ::fork();
  BOOST_REQUIRE(probe >= 0);
  if (probe == 0) {
    struct statfs there {};
    bool tmpfs = ::setns(ns.get(), CLONE_NEWNS) == 0 && ::statfs(dir.c_str(), &there) == 0 &&
                 there.f_type == TMPFS_MAGIC;
    ::_exit(tmpfs ? 0 : 1);
  }
  BOOST_REQUIRE_EQUAL(::waitpid(probe, &status, 0), probe);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  ns.reset();  // the teardown: the tmpfs was never mounted in ours, nothing to undo here
  BOOST_TEST(::rmdir(dir.c_str()) == 0);
}
