#define BOOST_TEST_MODULE engine_paging_index
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include "helpers/engine_fixture.hpp"

// Which checkpoint index the engine pages with, seen through the public API. The probe: the
// log is rewritten behind the engine's back (same size, same inode, other line count), so a
// page answered by a fresh scan of the file sees the new count and a page answered by the
// index the engine already holds still sees the old one.

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kLogBytes = 3u << 20;  // three checkpoint intervals
constexpr uint64_t kLineBytes = 17;       // "0123456789abcdef\n"

// A settled job whose stdout is kLogBytes of 17-byte lines.
std::string run_lines_job(Engine& e) {
  auto s = e.start("s", {.argv = {"/bin/sh", "-c",
                                  "yes 0123456789abcdef | head -c " + std::to_string(kLogBytes)}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e.status("s", s->task_id, 60s);
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_REQUIRE_MESSAGE(st->state == "exited", st->state << " " << st->error);
  BOOST_REQUIRE(st->stdout_bytes == kLogBytes);
  return s->task_id;
}

// Overwrites the first MiB of the file with spaces: the file keeps its size and inode but
// loses (1 MiB / 17) newlines, which only a scan of the file can notice.
void rewrite_head(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // root: mode 0444 does not stop it
  BOOST_REQUIRE_MESSAGE(fd >= 0, "open " << path << ": errno " << errno);
  std::string spaces(1u << 20, ' ');
  BOOST_REQUIRE(::pwrite(fd, spaces.data(), spaces.size(), 0) ==
                static_cast<ssize_t>(spaces.size()));
  ::close(fd);
}

uint64_t total_lines(const Result<OutputPage>& p) {
  BOOST_REQUIRE_MESSAGE(p.has_value(), describe(p));
  return p->total_size;
}

const uint64_t kLines = (kLogBytes + kLineBytes - 1) / kLineBytes;  // the last one unterminated

}  // namespace

BOOST_AUTO_TEST_CASE(retrieve_pages_an_artifact_with_its_jobs_index) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string id = run_lines_job(*e);
  auto st = e->status("s", id);
  BOOST_REQUIRE(st.has_value() && st->stdout_artifact.has_value());
  const std::string art = st->stdout_artifact->artifact_id;
  OutputRequest last_line{.offset = kLines - 1, .limit = 1, .unit = OutputUnit::kLines};
  // The job's index is built by this page (or earlier), before the file changes.
  BOOST_TEST(total_lines(e->output("s", id, last_line)) == kLines);
  rewrite_head(env.job_dir(id) + "/stdout.log");
  // Before the fix every retrieve built a fresh index, so it saw the rewritten head.
  BOOST_TEST(total_lines(e->retrieve("s", art, last_line)) == kLines);
  auto p = e->retrieve("s", art, last_line);
  BOOST_REQUIRE(p.has_value());
  // The unterminated last line (3 MiB mod 17 = 14 bytes), read from the file.
  BOOST_TEST(p->content == "0123456789abcd");
  // Another session still cannot reach it.
  BOOST_TEST(!e->retrieve("other", art, last_line).has_value());
}

BOOST_AUTO_TEST_CASE(retrieve_keeps_an_index_for_an_artifact_that_is_not_the_log) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string id = run_lines_job(*e);
  auto st = e->status("s", id);
  BOOST_REQUIRE(st.has_value() && st->stdout_artifact.has_value());
  const std::string art = st->stdout_artifact->artifact_id;
  // Replace the hard link by a copy: another inode, so the job's index must not serve it.
  const std::string path = env.artifact_path(art);
  std::string bytes = read_file(path);
  BOOST_REQUIRE(::unlink(path.c_str()) == 0);
  {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  }
  OutputRequest last_line{.offset = kLines - 1, .limit = 1, .unit = OutputUnit::kLines};
  BOOST_TEST(total_lines(e->output("s", id, last_line)) == kLines);
  rewrite_head(path);
  // The copy's own first index sees the copy as it is now, not the job's index ...
  const uint64_t rewritten = kLines - (1u << 20) / kLineBytes;
  BOOST_TEST(total_lines(e->retrieve("s", art, last_line)) == rewritten);
  // ... and is kept: putting the original head back is not rescanned.
  {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(::pwrite(fd, bytes.data(), 1u << 20, 0) == (1 << 20));
    ::close(fd);
  }
  BOOST_TEST(total_lines(e->retrieve("s", art, last_line)) == rewritten);
}

BOOST_AUTO_TEST_CASE(capture_indexes_the_log_as_it_is_written) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string id = run_lines_job(*e);
  // No page was read yet: the only index is the one capture built from the bytes it wrote.
  rewrite_head(env.job_dir(id) + "/stdout.log");
  OutputRequest last_line{.offset = kLines - 1, .limit = 1, .unit = OutputUnit::kLines};
  BOOST_TEST(total_lines(e->output("s", id, last_line)) == kLines);
  auto chars = e->output("s", id, {.offset = kLogBytes - 3, .limit = 10});
  BOOST_REQUIRE_MESSAGE(chars.has_value(), describe(chars));
  BOOST_TEST(chars->total_size == kLogBytes);  // ASCII: one char per byte
  BOOST_TEST(chars->content == "bcd");
}
