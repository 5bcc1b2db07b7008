#define BOOST_TEST_MODULE load
#include <boost/test/unit_test.hpp>

#include "helpers/cordon_fixture.hpp"

// Short versions of the soak and chaos runs (issue 7; tools/soak/soak.cpp, results of the long
// runs in docs/reliability.md). The tool does the checking; this asserts its verdicts.

using namespace cordon::test;
using nlohmann::json;

namespace {

std::string soak_bin() {
  std::string bin = cordon_bin();
  return bin.substr(0, bin.rfind('/')) + "/cordon-soak";
}

json run_soak(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {soak_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_process(argv, {.deadline = std::chrono::seconds(240)});
  BOOST_TEST_MESSAGE(
      "cordon-soak stderr (tail): " << r.err.substr(r.err.size() > 2000 ? r.err.size() - 2000 : 0));
  BOOST_REQUIRE_MESSAGE(!r.timed_out, "cordon-soak ran past its deadline");
  std::string out = r.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  std::string last = out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  json j = json::parse(last, nullptr, false);
  BOOST_REQUIRE_MESSAGE(j.is_object(), "no summary line: " << r.out << r.err);
  BOOST_TEST_MESSAGE(j.dump());
  BOOST_TEST((r.exit_code() == (j.value("ok", false) ? 0 : 1)));
  return j;
}

}  // namespace

// 150 short jobs one after another, then 100 at once, with a settled cache of 32 (filled by the
// warm-up): every byte back exactly, and fds, heap, RSS and sandbox processes back at their
// baseline. The memory cgroup count is machine-wide and the suite runs other tests alongside
// (1000-job ones among them): reported here, judged by the long soak run alone.
BOOST_AUTO_TEST_CASE(short_soak_returns_to_baseline_and_keeps_every_byte) {
  json j = run_soak({"load", "--cache", "32", "--warmup", "40", "--sequential", "150",
                     "--concurrent", "100", "--memcg", "report"});
  BOOST_TEST(j["bad"] == 0, j["firstBad"]);
  BOOST_TEST(j["jobs"] == 290);
  BOOST_TEST(j["peakRunning"] == 100);
  BOOST_TEST(j["checks"]["fds"] == true, j["before"]["fds"] << " → " << j["after"]["fds"]);
  if (!j.value("memoryJudged", true)) {
    BOOST_TEST_MESSAGE(
        "sanitizer build: heap and RSS growth reported, not judged (ASan's "
        "quarantine holds freed memory); LeakSanitizer checks the soak at exit");
  }
  BOOST_TEST(j["checks"]["heap"] == true, j["heapGrowthKiB"] << " KiB");
  BOOST_TEST(j["checks"]["rss"] == true, j["rssGrowthKiB"] << " KiB");
  BOOST_TEST_MESSAGE("memory cgroups: " << j["memoryCgroupGrowth"] << " more than before");
  BOOST_TEST(j["checks"]["leftovers"] == true, j["after"]);
  BOOST_TEST(j["ok"] == true);
}

// The engine SIGKILLed 10 times at random moments (some during its own recovery) while jobs
// run: no byte that reached a log is lost, nothing is left behind, every state is truthful.
BOOST_AUTO_TEST_CASE(short_chaos_loses_no_byte_and_leaves_nothing) {
  json j = run_soak({"chaos", "--kills", "10", "--jobs", "6"});
  BOOST_TEST(j["bad"] == 0, j["firstBad"]);
  BOOST_TEST(j["kills"] == 10);
  BOOST_TEST(j["leftoverProcesses"] == 0);
  BOOST_TEST(j["leftoverCgroups"] == 0);
  BOOST_TEST(j["leftoverRecords"] == 0);
  BOOST_TEST(j["spawnersLeft"] == 0);
  BOOST_TEST(j["ok"] == true);
}
