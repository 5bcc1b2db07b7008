#define BOOST_TEST_MODULE engine_starts
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>

#include <boost/test/unit_test.hpp>
#include <functional>
#include <mutex>
#include <thread>

#include "helpers/engine_fixture.hpp"
#include "helpers/engine_host.hpp"

// start() returns before the sandbox exists: starter threads spawn it without the engine's
// lock (docs/engine.md, "Starting"). What that must not change: every job still runs with its
// own output, a kill at any moment of the start reaches the sandbox, input sent early reaches
// the command, a spawn that fails settles `failed` with the cause, and closing the engine
// while starts are in flight leaves no sandbox behind.

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(concurrent_starts_from_several_threads_each_settle_with_their_own_output) {
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", 200}, {"total", 200}}}});
  auto e = open_engine(env);
  constexpr int kThreads = 4, kEach = 25;
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> started;  // task id, the word it echoes
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string word = "job-" + std::to_string(t) + "-" + std::to_string(i);
        auto s = e->start("s", {.argv = {"/bin/echo", word}});
        std::lock_guard lock(mu);
        if (!s) {
          errors.push_back(s.error().message());
        } else if (s->state != "running") {
          errors.push_back(word + " started as " + s->state + ": " + s->error);
        } else {
          started.emplace_back(s->task_id, word);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  BOOST_REQUIRE_MESSAGE(errors.empty(), (errors.empty() ? std::string() : errors.front()));
  BOOST_REQUIRE_EQUAL(started.size(), size_t{kThreads * kEach});
  std::vector<std::string> ids;
  for (const auto& [id, word] : started) ids.push_back(id);
  auto w = e->wait("s", ids, 120s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  BOOST_REQUIRE_EQUAL(w->size(), started.size());
  for (size_t i = 0; i < started.size(); ++i) {
    const auto& st = (*w)[i];
    BOOST_TEST_CONTEXT(started[i].second) {
      BOOST_TEST(st.task_id == started[i].first);
      BOOST_TEST(st.state == "exited", st.state << " " << st.error);
      BOOST_TEST(st.exit_code.value_or(-1) == 0);
      BOOST_TEST(read_all_bytes(*e, "s", st.task_id, "stdout") == started[i].second + "\n");
    }
  }
  BOOST_TEST(e->counters("s").running == 0u);
}

namespace {

// 40 `sleep`s, each sent `signals(i)` (in order) right after its start() returned, so the
// kills land at a different point of the start each time: while the job waits for a starter,
// while its sandbox is being spawned, or after. Returns their settled statuses.
std::vector<JobStatus> start_and_kill(Engine& e,
                                      const std::function<std::vector<int>(int)>& signals) {
  std::vector<std::string> ids;
  for (int i = 0; i < 40; ++i) {
    auto s = e.start("s", {.argv = {"/bin/sleep", "1000"}});
    BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
    for (int sig : signals(i)) {
      auto k = e.kill("s", s->task_id, sig);
      BOOST_REQUIRE_MESSAGE(k.has_value(), describe(k));
    }
    ids.push_back(s->task_id);
  }
  auto w = e.wait("s", ids, 120s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  return *w;
}

const nlohmann::json kHundredSlots = {{"concurrency", {{"perSession", 100}, {"total", 100}}}};

}  // namespace

// Every job killed right after its start settles `killed` and no sandboxed process is left.
BOOST_AUTO_TEST_CASE(a_kill_racing_a_start_kills_the_sandbox) {
  EngineEnv env(kHundredSlots);
  auto e = open_engine(env);
  // Half with SIGTERM, which init forwards only once the command runs (held until then).
  for (const auto& st :
       start_and_kill(*e, [](int i) { return std::vector<int>{i % 2 == 0 ? SIGKILL : SIGTERM}; })) {
    BOOST_TEST(st.state == "killed", st.task_id << " " << st.state << " " << st.error);
  }
  BOOST_TEST(e->counters("s").running == 0u);
  BOOST_TEST(eventually([&] { return env.sandbox_pids().empty(); }),
             env.sandbox_pids().size() << " sandboxed processes left");
}

// SIGKILL, then at once SIGTERM: wherever the two land, the job ends by SIGKILL. A kill held
// for the attach used to be replaced by the later SIGTERM (and its grace period).
BOOST_AUTO_TEST_CASE(a_sigterm_after_a_sigkill_never_softens_it) {
  EngineEnv env(kHundredSlots);
  auto e = open_engine(env);
  for (const auto& st : start_and_kill(*e, [](int) {
         return std::vector<int>{SIGKILL, SIGTERM};
       })) {
    BOOST_TEST(st.state == "killed", st.task_id << " " << st.state << " " << st.error);
    BOOST_TEST(st.signal.value_or("") == "SIGKILL", st.task_id << " " << st.signal.value_or(""));
  }
}

BOOST_AUTO_TEST_CASE(input_written_before_the_sandbox_exists_reaches_the_command) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  // At once: most likely before the starter attached the sandbox's stdin.
  auto w1 = e->write("s", s->task_id, {.data = "early\n"});
  BOOST_REQUIRE_MESSAGE(w1.has_value(), describe(w1));
  auto w2 = e->write("s", s->task_id, {.data = "more\n", .eof = true});
  BOOST_REQUIRE_MESSAGE(w2.has_value(), describe(w2));
  // After eof nothing more is taken, attached or not.
  auto w3 = e->write("s", s->task_id, {.data = "late\n"});
  BOOST_TEST(!w3.has_value());
  auto st = e->status("s", s->task_id, 30s);
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "exited", st->state << " " << st->error);
  BOOST_TEST(read_all_bytes(*e, "s", s->task_id, "stdout") == "early\nmore\n");
}

// The spawn fails after start() returned (here: the only host uid is leased by a running
// job): the job settles `failed`, saying why, like every other start that cannot run.
BOOST_AUTO_TEST_CASE(a_spawn_that_fails_after_start_returned_settles_failed_with_the_cause) {
  EngineEnv env;
  env.host_id_count = 1;
  auto e = open_engine(env);
  auto holder = e->start("s", {.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe});
  BOOST_REQUIRE_MESSAGE(holder.has_value(), describe(holder));
  // The holder's sandbox exists once it accepted input and echoed it.
  BOOST_REQUIRE(e->write("s", holder->task_id, {.data = "x"}).has_value());
  BOOST_REQUIRE(eventually([&] {
    auto st = e->status("s", holder->task_id);
    return st && st->stdout_bytes == 1;
  }));
  auto s = e->start("s", {.argv = {"/bin/echo", "never"}, .label = "no uid"});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  BOOST_TEST(!s->task_id.empty());
  auto st = e->status("s", s->task_id, 30s);
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "failed");
  BOOST_TEST(st->error.find("could not start") != std::string::npos, st->error);
  BOOST_TEST(st->error.find("all 1 ids in use") != std::string::npos, st->error);
  BOOST_TEST(st->label == "no uid");
  BOOST_TEST(!st->ended_at.empty());
  // Its cgroups and record are gone with it; the holder is unaffected and ends normally.
  BOOST_TEST(e->write("s", holder->task_id, {.eof = true}).has_value());
  auto h = e->status("s", holder->task_id, 30s);
  BOOST_REQUIRE(h.has_value());
  BOOST_TEST(h->state == "exited", h->state << " " << h->error);
  auto again = e->start("s", {.argv = {"/bin/echo", "now"}});
  BOOST_REQUIRE_MESSAGE(again.has_value(), describe(again));
  auto a = e->status("s", again->task_id, 30s);
  BOOST_REQUIRE(a.has_value());
  BOOST_TEST(a->state == "exited", a->state << " " << a->error);
  BOOST_TEST(read_all_bytes(*e, "s", again->task_id, "stdout") == "now\n");
}

// A settled job's cgroups, record and host id are given back by the releaser thread right
// after the settle (docs/engine.md, "Settling and teardown"). A start that finds every id taken
// waits for those teardowns: with as many host ids as jobs, jobs started the moment the previous
// ones settled (a batch killed together, so the releaser has a queue) each get one.
BOOST_AUTO_TEST_CASE(starts_right_after_settles_get_the_host_ids_those_jobs_gave_back) {
  constexpr int kJobs = 8;
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", kJobs}, {"total", kJobs}}}});
  env.host_id_count = kJobs;
  EngineOptions o = env.options();
  o.warm_pool = false;  // parked sandboxes would hold ids too
  auto opened = Engine::open(o);
  BOOST_REQUIRE_MESSAGE(opened.has_value(), describe(opened));
  auto& e = *opened;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::string> ids;
    for (int i = 0; i < kJobs; ++i) {
      auto s = e->start("s", {.argv = {"/bin/sleep", "1000"}});
      BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
      ids.push_back(s->task_id);
    }
    BOOST_REQUIRE(eventually([&] { return env.sandbox_pids().size() >= 2 * kJobs; }));
    BOOST_REQUIRE(e->kill_many("s", ids, SIGKILL).has_value());
    auto w = e->wait("s", ids, 30s, true);
    BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
    for (const auto& st : *w) {
      BOOST_REQUIRE_MESSAGE(st.state == "killed", st.state << " " << st.error);
    }
  }
  // And the last batch's ids, at once, to jobs that run to their end.
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    auto s = e->start("s", {.argv = {"/bin/echo", std::to_string(i)}});
    BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
    ids.push_back(s->task_id);
  }
  auto w = e->wait("s", ids, 30s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  for (const auto& st : *w) {
    BOOST_TEST(st.state == "exited", st.state << " " << st.error);
  }
}

// Closing the engine right after a batch settled finishes their teardowns first (the
// releaser has a queue: eight cgroup sets and mount namespaces): no cgroup and no record of
// any of them is left behind, and their host ids are free.
BOOST_AUTO_TEST_CASE(closing_right_after_a_killed_batch_settled_leaves_no_cgroup_or_record) {
  constexpr int kJobs = 8;
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", kJobs}, {"total", kJobs}}}});
  EngineOptions o = env.options();
  o.warm_pool = false;  // cgroups named after the jobs
  auto opened = Engine::open(o);
  BOOST_REQUIRE_MESSAGE(opened.has_value(), describe(opened));
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    auto s = (*opened)->start("s", {.argv = {"/bin/sleep", "1000"}});
    BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
    ids.push_back(s->task_id);
  }
  BOOST_REQUIRE(eventually([&] { return env.sandbox_pids().size() >= 2 * kJobs; }));
  BOOST_REQUIRE((*opened)->kill_many("s", ids, SIGKILL).has_value());
  auto w = (*opened)->wait("s", ids, 30s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  opened->reset();
  for (const auto& id : ids) {
    BOOST_TEST(existing_job_cgroups(id).empty(), id);
    BOOST_TEST(!std::filesystem::exists(env.state_dir + "/cgroups/" + id + ".cgroups"), id);
  }
  BOOST_TEST(env.sandbox_pids().empty());
}

// Closing the engine right after many starts: spawns in flight finish and are killed with
// the rest, jobs no starter took never run, and the next engine answers every job as settled.
BOOST_AUTO_TEST_CASE(closing_the_engine_during_starts_leaves_no_sandbox) {
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", 100}, {"total", 100}}}});
  std::vector<std::string> ids;
  {
    auto e = open_engine(env);
    for (int i = 0; i < 30; ++i) {
      auto s = e->start("s", {.argv = {"/bin/sleep", "1000"}});
      BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
      ids.push_back(s->task_id);
    }
  }
  BOOST_TEST(eventually([&] { return env.sandbox_pids().empty(); }),
             env.sandbox_pids().size() << " sandboxed processes left");
  auto e = open_engine(env);
  for (const auto& id : ids) {
    auto st = e->status("s", id);
    BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
    BOOST_TEST(st->settled(), id << " " << st->state);
  }
  BOOST_TEST(e->counters("s").running == 0u);
}

// Failure fixed (a review, session 13): a start whose record could not be written for want of
// descriptors (EMFILE: ~1000 queued jobs under a soft limit of 1024) told the caller to free
// space in the state dir. The refusal names the cause it has.
BOOST_AUTO_TEST_CASE(a_start_refused_for_want_of_descriptors_says_so) {
  EngineEnv env;
  auto e = open_engine(env);
  struct rlimit mine {};
  BOOST_REQUIRE(::getrlimit(RLIMIT_NOFILE, &mine) == 0);
  // The lowest free descriptor is the limit: the next open fails with EMFILE.
  int probe = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  BOOST_REQUIRE(probe >= 0);
  ::close(probe);
  struct rlimit low = {static_cast<rlim_t>(probe), mine.rlim_max};
  BOOST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto s = e->start("s", {.argv = {"/bin/echo", "x"}});
  BOOST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &mine) == 0);
  BOOST_REQUIRE(!s.has_value());
  const std::string m = s.error().message();
  BOOST_TEST(m.find("out of file descriptors") != std::string::npos, m);
  BOOST_TEST(m.find("EMFILE") != std::string::npos, m);
  BOOST_TEST(m.find("free space") == std::string::npos, m);
  auto ok = e->start("s", {.argv = {"/bin/echo", "x"}});
  BOOST_REQUIRE_MESSAGE(ok.has_value(), describe(ok));
  BOOST_TEST(e->status("s", ok->task_id, 20s)->state == "exited");
}
