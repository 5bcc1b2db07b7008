#define BOOST_TEST_MODULE engine_settle
#include <boost/test/unit_test.hpp>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <vector>

#include "base/scope_exit.hpp"
#include "helpers/engine_fixture.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Engine> open_or_fail(const EngineEnv& env) {
  auto e = env.open();
  BOOST_REQUIRE_MESSAGE(e.has_value(), describe(e));
  return std::move(*e);
}

// What a subscriber saw, waited on through a condition variable (never a sleep).
struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<JobStatus> settled;

  SettleCallback callback() {
    return [this](const JobStatus& s) {
      std::lock_guard<std::mutex> lock(mu);
      settled.push_back(s);
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return settled.size() >= n; });
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_subscriber_hears_each_settle_with_the_final_status) {
  EngineEnv env;
  auto e = open_or_fail(env);
  Seen seen;
  uint64_t sub = e->subscribe_settled(seen.callback());
  auto s = e->start("s1", {.argv = {"/bin/sh", "-c", "echo done; exit 3"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  BOOST_REQUIRE(seen.wait_for(1, 20s));
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    BOOST_TEST(seen.settled[0].task_id == s->task_id);
    BOOST_TEST(seen.settled[0].session == "s1");
    BOOST_TEST(seen.settled[0].state == "exited");
    BOOST_TEST(seen.settled[0].exit_code.value_or(-1) == 3);
    BOOST_TEST(seen.settled[0].tail_preview.find("done") != std::string::npos);
  }
  // The record is on disk and not read yet when the subscriber hears of it.
  BOOST_TEST(e->counters("s1").finished == 1u);
  e->unsubscribe_settled(sub);
}

BOOST_AUTO_TEST_CASE(a_killed_queued_job_is_announced_with_its_final_state) {
  // One slot: the second job queues behind the first.
  nlohmann::json one_slot = {{"concurrency", {{"total", 1}, {"perSession", 1}}}};
  EngineEnv env(one_slot);
  auto e = open_or_fail(env);
  Seen seen;
  uint64_t sub = e->subscribe_settled(seen.callback());
  auto first = e->start("s1", {.argv = {"/bin/sleep", "30"}});
  BOOST_REQUIRE_MESSAGE(first.has_value(), describe(first));
  auto second = e->start("s1", {.argv = {"/bin/sleep", "30"}});
  BOOST_REQUIRE_MESSAGE(second.has_value(), describe(second));
  BOOST_REQUIRE(second->state == "queued");
  BOOST_REQUIRE(e->kill("s1", second->task_id).has_value());
  BOOST_REQUIRE(seen.wait_for(1, 10s));
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    BOOST_TEST(seen.settled[0].task_id == second->task_id);
    BOOST_TEST(seen.settled[0].state == "killed");  // not the interim state settle() computed
  }
  BOOST_REQUIRE(e->kill("s1", first->task_id).has_value());
  BOOST_REQUIRE(seen.wait_for(2, 20s));
  e->unsubscribe_settled(sub);
}

BOOST_AUTO_TEST_CASE(an_unsubscribed_callback_is_never_called) {
  EngineEnv env;
  auto e = open_or_fail(env);
  Seen gone, kept;
  uint64_t a = e->subscribe_settled(gone.callback());
  uint64_t b = e->subscribe_settled(kept.callback());
  e->unsubscribe_settled(a);
  auto s = e->start("s1", {.argv = {"/bin/echo", "hi"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  BOOST_REQUIRE(kept.wait_for(1, 20s));
  std::lock_guard<std::mutex> lock(gone.mu);
  BOOST_TEST(gone.settled.empty());
  e->unsubscribe_settled(b);
}

namespace {

// The pid of the sandbox init among `pids` (pid 1 of its own namespace: NSpid ends in 1).
pid_t init_among(const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    std::ifstream in("/proc/" + std::to_string(p) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("NSpid:", 0) == 0 && line.size() > 2 && line.ends_with("\t1")) return p;
    }
  }
  return -1;
}

}  // namespace

// A settle is told once the sandbox's init has exited, and with it every process of the
// sandbox. When the command ends with nothing else left in the sandbox, init says so and the
// settle's work runs beside init's exit (kExitedAlone); the end is still told only after it.
// Checked at the moment it is told (the subscriber runs as the settle announces it), in 20
// rounds: with the wait for init's exit cut out, it caught init still exiting in 9 of them. The
// command (`cat`) ends when its stdin is closed, once the test holds a pidfd of the init.
BOOST_AUTO_TEST_CASE(a_settle_is_told_once_the_sandboxs_init_has_exited) {
  EngineEnv env;
  auto e = open_or_fail(env);
  for (int round = 0; round < 20; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      std::mutex mu;
      UniqueFd init;
      std::optional<bool> init_gone;
      uint64_t sub = e->subscribe_settled([&](const JobStatus&) {
        std::lock_guard<std::mutex> lock(mu);
        if (init) init_gone = sys::exits_within(init.get(), 0);
      });
      ScopeExit unsubscribe([&] { e->unsubscribe_settled(sub); });
      auto s = e->start("s", {.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe});
      BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
      pid_t pid = -1;
      BOOST_REQUIRE(eventually([&] { return (pid = init_among(env.sandbox_pids())) > 0; }));
      {
        std::lock_guard<std::mutex> lock(mu);
        init.reset(sys::pidfd_open(pid, 0));
        BOOST_REQUIRE_MESSAGE(init.valid(), "pidfd_open " << pid << ": " << errno_name(errno));
      }
      BOOST_REQUIRE(e->write("s", s->task_id, {.eof = true}).has_value());
      auto st = e->status("s", s->task_id, 20s);
      BOOST_REQUIRE(st.has_value());
      BOOST_TEST(st->state == "exited");
      std::lock_guard<std::mutex> lock(mu);
      BOOST_REQUIRE(init_gone.has_value());
      BOOST_TEST(*init_gone);
    }
  }
}
