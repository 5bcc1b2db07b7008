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

// The figure, 1000 at once (CORDON_SCALE_JOBS overrides). Before epoll events carried
// watch ids this crashed: an event for a job settled earlier in the same batch used freed memory.
BOOST_AUTO_TEST_CASE(many_concurrent_jobs_start_and_are_all_killed) {
  const char* want = std::getenv("CORDON_SCALE_JOBS");
  const unsigned jobs = want ? static_cast<unsigned>(std::atoi(want)) : 1000u;
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", jobs + 8}, {"total", jobs + 8}}}});
  env.host_id_count = std::max(256u, jobs + 16);
  auto e = open_engine(env);
  // The warm pool fills once a first job named the shape and settled; from then on the
  // engine's fds are the baseline (each entry holds its cgroups, record and host id).
  auto first = e->start("s", {.argv = {"/bin/true"}});
  BOOST_REQUIRE_MESSAGE(first.has_value(), describe(first));
  BOOST_REQUIRE(e->status("s", first->task_id, 30s).has_value());
  const size_t pool_size = EngineOptions{}.warm_pool_size;
  BOOST_REQUIRE(eventually(
      [&] { return sandbox::parked_pool_pids(env.state_dir + "/cgroups").size() == pool_size; }));
  // The last entry's init pidfd is opened just after its sandbox appears, and the first job's
  // mount namespace is dropped by the releaser after its settle: the baseline is the count
  // once it read the same five times in a row.
  size_t baseline = 0;
  int same = 0;
  BOOST_REQUIRE(eventually([&] {
    size_t n = open_fds();
    same = n == baseline ? same + 1 : 0;
    baseline = n;
    return same >= 5;
  }));
  std::vector<std::string> ids;
  for (unsigned i = 0; i < jobs; ++i) {
    auto s = e->start("s", {.argv = {"/bin/sleep", "1000"}});
    BOOST_REQUIRE_MESSAGE(s.has_value(), i << ": " << describe(s));
    BOOST_REQUIRE_MESSAGE(s->state == "running", i << ": " << s->state);
    ids.push_back(s->task_id);
  }
  BOOST_TEST(e->counters("s").running == jobs);
  // start() returns before the sandbox exists (the starter threads spawn it); every one of
  // them comes up.
  BOOST_TEST(eventually([&] { return env.sandbox_pids().size() >= jobs; }, 120s),
             env.sandbox_pids().size() << " sandboxes of " << jobs);
  // Budgeted per running job (measured 13 on this hybrid host: pidfd, status channel, two
  // pipes, two logs, four cgroup dirfds, the cgroup record lock, the host-uid lease): 1000 jobs
  // stay under the fd limit of 20000.
  BOOST_TEST(open_fds() - baseline <= jobs * 16, open_fds() - baseline);
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
  // The warm pool refills in the background as jobs settle; once full again it holds what it
  // held before the jobs.
  BOOST_TEST(eventually([&] { return open_fds() == baseline; }), open_fds() << " != " << baseline);
}
