#define BOOST_TEST_MODULE engine_scale
#include <dirent.h>

#include <boost/test/unit_test.hpp>

#include "helpers/engine_fixture.hpp"

// Many jobs at once: they all start, they all die, and the engine gives back every fd.

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

size_t open_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_hundred_concurrent_jobs_start_and_are_all_killed) {
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", 256}, {"total", 256}}}});
  auto e = open_engine(env);
  const size_t baseline = open_fds();
  std::vector<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    auto s = e->start("s", {.argv = {"/bin/sleep", "1000"}});
    BOOST_REQUIRE_MESSAGE(s.has_value(), i << ": " << describe(s));
    BOOST_REQUIRE_MESSAGE(s->state == "running", i << ": " << s->state);
    ids.push_back(s->task_id);
  }
  BOOST_TEST(e->counters("s").running == 200u);
  BOOST_TEST(env.sandbox_pids().size() >= 200u);
  // Budgeted per running job (measured 13 on this hybrid host: pidfd, status channel, two
  // pipes, two logs, four cgroup dirfds, the cgroup record lock, the host-uid lease): 1000 jobs
  // stay under the fd limit of 20000.
  BOOST_TEST(open_fds() - baseline <= 200u * 16, open_fds() - baseline);
  for (const auto& id : ids) {
    auto k = e->kill("s", id, SIGKILL);
    BOOST_REQUIRE_MESSAGE(k.has_value(), describe(k));
  }
  auto w = e->wait("s", ids, 120s, true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  for (const auto& st : *w) {
    BOOST_TEST(st.state == "killed", st.task_id << " " << st.state << " " << st.error);
  }
  BOOST_TEST(e->counters("s").running == 0u);
  BOOST_TEST(env.sandbox_pids().empty());
  BOOST_TEST(open_fds() == baseline);
}
