#define BOOST_TEST_MODULE engine_paging_index
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

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

BOOST_AUTO_TEST_CASE(a_settled_logs_index_survives_a_restart) {
  EngineEnv env;
  std::string id;
  {
    auto e = open_engine(env);
    id = run_lines_job(*e);
  }
  const std::string idx = env.job_dir(id) + "/stdout.idx";
  struct stat st {};
  BOOST_REQUIRE_MESSAGE(::stat(idx.c_str(), &st) == 0, "no " << idx);
  BOOST_TEST(st.st_size < 1024);  // 4 checkpoints of 32 bytes and a header
  // A small log gets no index file: it is scanned in one read anyway.
  struct stat none {};
  BOOST_TEST(::stat((env.job_dir(id) + "/stderr.idx").c_str(), &none) != 0);

  rewrite_head(env.job_dir(id) + "/stdout.log");
  auto e = open_engine(env);
  OutputRequest last_line{.offset = kLines - 1, .limit = 1, .unit = OutputUnit::kLines};
  // The restarted engine's first page uses the persisted index, not a scan of the file.
  BOOST_TEST(total_lines(e->output("s", id, last_line)) == kLines);
}

BOOST_AUTO_TEST_CASE(a_job_evicted_from_the_settled_cache_loads_its_index) {
  EngineEnv env;
  EngineOptions o = env.options();
  o.settled_cache = 1;
  auto opened = Engine::open(o);
  BOOST_REQUIRE_MESSAGE(opened.has_value(), describe(opened));
  auto& e = **opened;
  const std::string first = run_lines_job(e);
  (void)run_lines_job(e);  // the settled cache now holds only this one
  rewrite_head(env.job_dir(first) + "/stdout.log");
  OutputRequest last_line{.offset = kLines - 1, .limit = 1, .unit = OutputUnit::kLines};
  BOOST_TEST(total_lines(e.output("s", first, last_line)) == kLines);
}

BOOST_AUTO_TEST_CASE(a_bad_index_file_falls_back_to_scanning) {
  EngineEnv env;
  std::string id;
  {
    auto e = open_engine(env);
    id = run_lines_job(*e);
  }
  const std::string idx = env.job_dir(id) + "/stdout.idx";
  const std::string good = read_file(idx);
  BOOST_REQUIRE(!good.empty());
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x01;
  // Each one replaces the index; the log's head is rewritten, so a page that used the bad
  // index would report the old line count, and a scan reports the new one.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"empty", ""},
      {"truncated", good.substr(0, good.size() - 1)},
      {"half", good.substr(0, good.size() / 2)},
      {"a flipped bit", flipped},
      {"garbage", std::string(good.size(), '\xA5')},
      {"huge", std::string(size_t{8} << 20, '\0')},
  };
  rewrite_head(env.job_dir(id) + "/stdout.log");
  const uint64_t rewritten = kLines - (1u << 20) / kLineBytes;
  for (const auto& [what, bytes] : bad) {
    BOOST_TEST_CONTEXT(what) {
      { std::ofstream(idx, std::ios::binary | std::ios::trunc) << bytes; }
      auto e = open_engine(env);
      OutputRequest last{.offset = rewritten - 1, .limit = 1, .unit = OutputUnit::kLines};
      auto p = e->output("s", id, last);
      BOOST_REQUIRE_MESSAGE(p.has_value(), describe(p));
      BOOST_TEST(p->total_size == rewritten);
      BOOST_TEST(p->content == "0123456789abcd");
      auto c = e->output("s", id, {.offset = kLogBytes - 3, .limit = 10});
      BOOST_REQUIRE_MESSAGE(c.has_value(), describe(c));
      BOOST_TEST(c->content == "bcd");
    }
  }
}

namespace {

// The CPU time (user + system, in clock ticks) a thread of this process has used so far.
long cpu_ticks_of(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(in, line);
  size_t paren = line.rfind(')');
  if (paren == std::string::npos) {
    return 0;
  }
  std::istringstream fields(line.substr(paren + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_slow_page_does_not_hold_up_other_calls) {
  EngineEnv env;
  auto e = open_engine(env);
  // Job A's log is made 1 GiB (sparse: no disk, reads as zeros) with no index: a lines page
  // at its end scans all of it, a page that takes seconds. (It was a FIFO whose open blocked;
  // logs are now only opened as regular files, never blocking.)
  auto a = e->start("s", {.argv = {"/bin/true"}});
  BOOST_REQUIRE_MESSAGE(a.has_value(), describe(a));
  auto b = e->start("s", {.argv = {"/bin/echo", "hello"}});
  BOOST_REQUIRE_MESSAGE(b.has_value(), describe(b));
  BOOST_REQUIRE(e->status("s", a->task_id, 60s).value().settled());
  BOOST_REQUIRE(e->status("s", b->task_id, 60s).value().settled());
  const std::string log = env.job_dir(a->task_id) + "/stdout.log";
  BOOST_REQUIRE(::chmod(log.c_str(), 0644) == 0);
  BOOST_REQUIRE(::truncate(log.c_str(), off_t{1} << 30) == 0);

  std::atomic<pid_t> pager_tid{0};
  std::atomic<bool> page_done{false};
  std::thread pager([&] {
    pager_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    (void)e->output("s", a->task_id, {.offset = 1u << 30, .unit = OutputUnit::kLines});
    page_done = true;
  });
  // Wait until the pager has spent 100 ms of CPU inside output(): it is in the scan, past
  // taking the engine's lock (which the old code held for the whole page).
  BOOST_REQUIRE(eventually([&] { return pager_tid != 0 && cpu_ticks_of(pager_tid) >= 10; }, 60s));
  BOOST_REQUIRE_MESSAGE(!page_done, "the page ended before the test could look: a faster disk?");

  // Another job's status completes while that page is still in progress. Before the fix
  // output() held the engine's lock for the whole page and this call waited for it.
  auto other = std::async(std::launch::async, [&] { return e->status("s", b->task_id); });
  bool answered = other.wait_for(60s) == std::future_status::ready;  // a guard, not a timing
  BOOST_TEST(answered);
  BOOST_TEST(!page_done);
  pager.join();
  BOOST_TEST(page_done);
  auto st = other.get();
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->tail_preview == "hello\n");
}

// A chatty job paged by lines and chars while it prints: the loop feeds the index after every
// write, so a page that read the log's size before taking the index's lock saw an index
// already past that size and failed ("shorter than the N already indexed"). Every page of a
// growing log must succeed, and the pages read in order must be the log's lines in order.
BOOST_AUTO_TEST_CASE(a_log_paged_while_the_job_prints_never_fails_a_page) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c",
                                   "i=0; while [ $i -lt 200000 ]; do "
                                   "echo \"line $i\"; i=$((i+1)); done"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  uint64_t line_offset = 0, next_line = 0, pages = 0;
  bool in_order = true;
  for (;;) {
    auto st = e->status("s", s->task_id);
    BOOST_REQUIRE(st.has_value());
    bool settled = st->settled();
    auto chars =
        e->output("s", s->task_id, {.offset = 0, .limit = 100, .unit = OutputUnit::kChars});
    BOOST_REQUIRE_MESSAGE(chars.has_value(), "chars page " << pages << ": " << describe(chars));
    auto lines = e->output("s", s->task_id,
                           {.offset = line_offset, .limit = 5000, .unit = OutputUnit::kLines});
    BOOST_REQUIRE_MESSAGE(lines.has_value(), "lines page " << pages << ": " << describe(lines));
    ++pages;
    std::istringstream in(lines->content);
    for (std::string l; std::getline(in, l);) {
      in_order = in_order && l == "line " + std::to_string(next_line++);
    }
    line_offset = lines->next_offset;
    if (settled && !lines->has_more) {
      break;
    }
  }
  BOOST_TEST(in_order);
  BOOST_TEST(next_line == 200000u);
  BOOST_TEST_MESSAGE(pages << " rounds of pages while the job printed");
}
