#define BOOST_TEST_MODULE engine_output
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <boost/test/unit_test.hpp>

#include "helpers/engine_fixture.hpp"

// Output through the public API against the real sandbox: every byte kept, paged back
// byte-exact, capped exactly, kept across kill and timeout.

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

// The bytes the generator below prints, computed here independently.
std::string generated(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    s[i] = static_cast<char>((i * 31 + (i >> 8)) & 255);
  }
  return s;
}
const char* kGenerator =
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "sys.stdout.buffer.write(bytes(((i * 31 + (i >> 8)) & 255) for i in range(n)))\n";

}  // namespace

BOOST_AUTO_TEST_CASE(both_streams_are_banked_byte_exact_with_a_nonzero_exit) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c",
                                   "head -c 2500000 /dev/urandom; "
                                   "head -c 700001 /dev/urandom >&2; exit 3"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e->status("s", s->task_id, 60s);
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "exited");
  BOOST_TEST(st->exit_code.value_or(-1) == 3);
  BOOST_TEST(st->error.empty(), st->error);  // a non-zero exit is data, not an error
  BOOST_TEST(st->stdout_bytes == 2500000u);
  BOOST_TEST(st->stderr_bytes == 700001u);
  struct Want {
    std::optional<ArtifactRef> art;
    const char* stream;
    uint64_t size;
  };
  for (const Want& w : {Want{st->stdout_artifact, "stdout", 2500000},
                        Want{st->stderr_artifact, "stderr", 700001}}) {
    BOOST_TEST_CONTEXT(w.stream) {
      BOOST_REQUIRE(w.art.has_value());
      BOOST_TEST(w.art->size_bytes == w.size);
      BOOST_TEST(w.art->stream == w.stream);
      BOOST_TEST(w.art->kind == "command-output");
      std::string path = env.artifact_path(w.art->artifact_id);
      std::string bytes = read_file(path);
      BOOST_TEST(bytes.size() == w.size);
      // The digest the engine computed while writing equals one computed from the file.
      BOOST_TEST(sha256_hex(bytes) == w.art->sha256);
      // The artifact is read-only on disk, and the log and the artifact are the same file.
      struct stat a {
      }, l{};
      BOOST_REQUIRE(::stat(path.c_str(), &a) == 0);
      BOOST_REQUIRE(::stat((env.job_dir(s->task_id) + "/" + w.stream + ".log").c_str(), &l) == 0);
      BOOST_TEST((a.st_mode & 0222) == 0u);
      BOOST_TEST(a.st_ino == l.st_ino);
      // Paged back through the API, byte for byte.
      BOOST_TEST((read_all_bytes(*e, "s", s->task_id, w.stream) == bytes));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_running_job_can_be_polled_while_its_output_grows) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  auto stdout_bytes = [&] {
    auto st = e->status("s", id);
    return st ? st->stdout_bytes : 0;
  };

  BOOST_REQUIRE(e->write("s", id, {.data = std::string(1000, 'a')}).has_value());
  BOOST_REQUIRE(eventually([&] { return stdout_bytes() == 1000; }));
  auto p1 = e->output("s", id, {});
  BOOST_REQUIRE_MESSAGE(p1.has_value(), describe(p1));
  BOOST_TEST(p1->content == std::string(1000, 'a'));
  BOOST_TEST(!p1->complete);  // still running: total_size is not final

  // The first two bytes of "€" (E2 82 AC): the page must stop before them.
  BOOST_REQUIRE(e->write("s", id, {.data = std::string("x\xE2\x82")}).has_value());
  BOOST_REQUIRE(eventually([&] { return stdout_bytes() == 1003; }));
  auto st = e->status("s", id);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "running");
  auto p2 = e->output("s", id, {.offset = 1000});
  BOOST_REQUIRE_MESSAGE(p2.has_value(), describe(p2));
  BOOST_TEST(p2->content == "x", p2->content);
  BOOST_TEST(p2->next_offset == 1001u);
  auto b = e->output("s", id, {.offset = 1000, .unit = OutputUnit::kBytes});
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST(base64_decode(b->content) == std::string("x\xE2\x82"));

  // The rest of the character arrives: the next page starts with it, whole.
  BOOST_REQUIRE(e->write("s", id, {.data = std::string("\xAC!\n")}).has_value());
  BOOST_REQUIRE(eventually([&] { return stdout_bytes() == 1006; }));
  auto p3 = e->output("s", id, {.offset = p2->next_offset});
  BOOST_REQUIRE_MESSAGE(p3.has_value(), describe(p3));
  BOOST_TEST(p3->content == "\xE2\x82\xAC!\n", p3->content);
  auto tail = e->status("s", id);
  BOOST_REQUIRE(tail.has_value());
  BOOST_TEST(tail->tail_preview.find("x\xE2\x82\xAC!") != std::string::npos, tail->tail_preview);

  BOOST_REQUIRE(e->write("s", id, {.eof = true}).has_value());
  auto done = e->status("s", id, 20s);
  BOOST_REQUIRE(done.has_value());
  BOOST_TEST(done->state == "exited");
  auto all = e->output("s", id, {.limit = 200000});
  BOOST_REQUIRE(all.has_value());
  BOOST_TEST(all->complete);
  BOOST_TEST(!all->has_more);
  BOOST_TEST(all->content == std::string(1000, 'a') + "x\xE2\x82\xAC!\n");
}

BOOST_AUTO_TEST_CASE(three_megabytes_page_back_byte_exact) {
  EngineEnv env;
  env.box.write("gen.py", kGenerator);
  auto e = open_engine(env);
  constexpr size_t kSize = 3 * 1000 * 1000 + 17;
  auto s = e->start("s", {.argv = {"/usr/bin/python3", "gen.py", std::to_string(kSize)}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e->status("s", s->task_id, 60s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->error << st->tail_preview);
  BOOST_TEST(st->stdout_bytes == kSize);
  const std::string want = generated(kSize);
  // Full-size pages and an odd page size that never lines up with anything.
  BOOST_TEST((read_all_bytes(*e, "s", s->task_id, "stdout", 200000) == want));
  BOOST_TEST((read_all_bytes(*e, "s", s->task_id, "stdout", 65537) == want));
  // The artifact pages the same bytes.
  std::string art;
  uint64_t off = 0;
  for (;;) {
    auto p = e->retrieve(st->session, st->stdout_artifact->artifact_id,
                         {.offset = off, .limit = 200000, .unit = OutputUnit::kBytes});
    BOOST_REQUIRE_MESSAGE(p.has_value(), describe(p));
    BOOST_TEST(p->total_size == kSize);
    art += base64_decode(p->content);
    off = p->next_offset;
    if (!p->has_more) break;
  }
  BOOST_TEST((art == want));
  BOOST_TEST(st->stdout_artifact->sha256 == sha256_hex(want));
}

BOOST_AUTO_TEST_CASE(the_cap_lands_mid_chunk_and_keeps_exactly_the_limit) {
  // 1000003 is no multiple of the pipe size (64 KiB or 1 MiB) nor of the 8-byte line.
  EngineEnv env(nlohmann::json{{"maxOutputBytes", 1000003}});
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/usr/bin/yes", "abcdefg"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e->status("s", s->task_id, 30s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "output-limit");
  BOOST_TEST(st->stdout_bytes == 1000003u);
  BOOST_TEST(st->error.find("1000003") != std::string::npos, st->error);
  BOOST_TEST(st->error.find("banked") != std::string::npos, st->error);
  std::string want;
  while (want.size() < 1000003) want += "abcdefg\n";
  want.resize(1000003);
  std::string got = read_file(env.artifact_path(st->stdout_artifact->artifact_id));
  BOOST_TEST((got == want));
  BOOST_TEST(st->stdout_artifact->sha256 == sha256_hex(want));

  // On stderr, one 3 MB write (far larger than the pipe): the cap cuts inside a read.
  env.box.write("big.py", "import os\nos.write(2, b'E' * 3000000)\n");
  auto s2 = e->start("s", {.argv = {"/usr/bin/python3", "big.py"}});
  BOOST_REQUIRE_MESSAGE(s2.has_value(), describe(s2));
  auto st2 = e->status("s", s2->task_id, 30s);
  BOOST_REQUIRE(st2.has_value());
  BOOST_TEST(st2->state == "output-limit");
  BOOST_TEST(st2->stderr_bytes == 1000003u);
  BOOST_TEST(st2->error.find("stderr") != std::string::npos, st2->error);
  BOOST_TEST((read_file(env.artifact_path(st2->stderr_artifact->artifact_id)) ==
              std::string(1000003, 'E')));
}

BOOST_AUTO_TEST_CASE(kill_keeps_the_output) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c", "echo before; echo err >&2; exec sleep 1000"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  BOOST_REQUIRE(eventually([&] {
    auto st = e->status("s", s->task_id);
    return st && st->stdout_bytes == 7 && st->stderr_bytes == 4;
  }));
  auto k = e->kill("s", s->task_id);
  BOOST_REQUIRE_MESSAGE(k.has_value(), describe(k));
  auto st = e->status("s", s->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "killed");
  BOOST_TEST(st->signal.value_or("") == "SIGTERM");
  BOOST_TEST(!st->exit_code.has_value());
  BOOST_REQUIRE(st->stdout_artifact.has_value());
  BOOST_TEST(read_file(env.artifact_path(st->stdout_artifact->artifact_id)) == "before\n");
  BOOST_TEST(read_file(env.artifact_path(st->stderr_artifact->artifact_id)) == "err\n");
  BOOST_TEST(st->tail_preview.find("before") != std::string::npos, st->tail_preview);
  BOOST_TEST(env.sandbox_pids().empty());
}

BOOST_AUTO_TEST_CASE(kill_after_settle_returns_the_status_unchanged) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c", "echo done; exit 4"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e->status("s", s->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_REQUIRE(st->state == "exited");
  for (int sig : {SIGTERM, SIGKILL}) {
    auto k = e->kill("s", s->task_id, sig);
    BOOST_REQUIRE_MESSAGE(k.has_value(), describe(k));
    BOOST_TEST(k->state == "exited");
    BOOST_TEST(k->exit_code.value_or(-1) == 4);
    BOOST_TEST(!k->signal.has_value());
    BOOST_TEST(k->ended_at == st->ended_at);
    BOOST_TEST(k->duration_ms == st->duration_ms);
    BOOST_TEST(k->error == st->error);
    BOOST_TEST(k->stdout_artifact->sha256 == st->stdout_artifact->sha256);
  }
  auto again = e->status("s", s->task_id);
  BOOST_REQUIRE(again.has_value());
  BOOST_TEST(again->state == "exited");
  BOOST_TEST(again->ended_at == st->ended_at);
}

BOOST_AUTO_TEST_CASE(timeout_names_the_budget_and_keeps_the_output) {
  EngineEnv env;
  auto e = open_engine(env);
  auto t0 = std::chrono::steady_clock::now();
  // The budget counts from start(), spawn included: long enough for a sanitized build on a
  // loaded machine to print first (it once printed nothing within 300 ms).
  auto s = e->start(
      "s", {.argv = {"/bin/sh", "-c", "echo started; exec sleep 1000"}, .timeout_ms = 2000});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e->status("s", s->task_id, 30s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "timeout");
  BOOST_TEST(st->error.find("2000 ms") != std::string::npos, st->error);
  BOOST_TEST((std::chrono::steady_clock::now() - t0 >= 2000ms));
  BOOST_TEST(st->duration_ms >= 2000u);
  BOOST_TEST(read_file(env.artifact_path(st->stdout_artifact->artifact_id)) == "started\n");
  BOOST_TEST(env.sandbox_pids().empty());
}

// A command and its grandchildren ignore SIGTERM (an ignored disposition survives exec): the
// grace runs out, SIGKILL takes the whole sandbox, and no process of its host uid is left.
BOOST_AUTO_TEST_CASE(a_child_that_ignores_sigterm_is_killed_with_its_grandchildren) {
  EngineEnv env(nlohmann::json{{"killGraceMs", 300}});
  auto e = open_engine(env);
  const char* script =
      "trap '' TERM; (sleep 1000; echo never) & sh -c 'sleep 1000' & "
      "echo ready; wait; echo unreachable";
  for (bool by_timeout : {false, true}) {
    BOOST_TEST_CONTEXT("by_timeout " << by_timeout) {
      StartOptions o{.argv = {"/bin/sh", "-c", script}};
      // The budget counts from start(), spawn included, and "ready" has to be printed within
      // it: a sanitized build on a loaded CI machine once took more than 400 ms to get there.
      if (by_timeout) o.timeout_ms = 3000;
      auto s = e->start("s", o);
      BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
      BOOST_REQUIRE(eventually([&] {
        auto st = e->status("s", s->task_id);
        return st && st->stdout_bytes == 6;
      }));
      // init, sh, the subshell, its sleep, sh -c and its sleep.
      BOOST_TEST(env.sandbox_pids().size() >= 4u);
      auto t0 = std::chrono::steady_clock::now();
      if (!by_timeout) {
        BOOST_REQUIRE(e->kill("s", s->task_id).has_value());
      }
      auto st = e->status("s", s->task_id, 30s);
      BOOST_REQUIRE(st.has_value());
      BOOST_TEST(st->state == (by_timeout ? "timeout" : "killed"));
      if (!by_timeout) {
        BOOST_TEST(st->signal.value_or("") == "SIGKILL");  // SIGTERM was ignored
        BOOST_TEST((std::chrono::steady_clock::now() - t0 >= 300ms));
      }
      BOOST_TEST(read_file(env.artifact_path(st->stdout_artifact->artifact_id)) == "ready\n");
      auto left = env.sandbox_pids();
      BOOST_TEST(left.empty(), "left: " << left.size());
    }
  }
}

// Build scripts write to /dev/stdout and /dev/stderr and read /dev/stdin by name, which
// reopens the job's pipes through /proc/self/fd: the kernel checks the pipe's owner there, so
// the pipes belong to the job's host uid. Both ways a job gets them: made with its sandbox
// (the pool is empty until a job names its shape), and sent to a sandbox the warm pool built
// ahead (the spawner's prepare_job).
BOOST_AUTO_TEST_CASE(a_job_opens_dev_stdout_stderr_and_stdin_by_name_pooled_or_not) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string records = env.state_dir + "/cgroups";
  for (bool want_pooled : {false, true}) {
    BOOST_TEST_CONTEXT((want_pooled ? "pooled" : "unpooled")) {
      if (want_pooled) {
        BOOST_REQUIRE(eventually([&] {
          return sandbox::parked_pool_pids(records).size() == EngineOptions{}.warm_pool_size;
        }));
      }
      std::vector<pid_t> parked = sandbox::parked_pool_pids(records);
      // `read` takes the first line byte by byte and leaves the rest for cat.
      auto s = e->start("s", {.argv = {"/bin/sh", "-c",
                                       "echo up; read x; echo out > /dev/stdout; "
                                       "echo err > /dev/stderr; cat /dev/stdin"},
                              .stdin_mode = StdinMode::kPipe});
      BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
      BOOST_REQUIRE(eventually([&] {
        auto st = e->status("s", s->task_id);
        return st && (st->stdout_bytes > 0 || st->settled());
      }));
      // A pooled job runs in an init that was parked before it started.
      bool pooled = std::ranges::any_of(env.sandbox_pids(), [&](pid_t p) {
        return std::find(parked.begin(), parked.end(), p) != parked.end();
      });
      BOOST_TEST(pooled == want_pooled);
      BOOST_REQUIRE(e->write("s", s->task_id, {.data = "go\nin\n", .eof = true}).has_value());
      auto st = e->status("s", s->task_id, 20s);
      BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
      BOOST_TEST(st->state == "exited");
      BOOST_TEST(st->exit_code.value_or(-1) == 0);
      BOOST_TEST(read_all_bytes(*e, "s", s->task_id, "stdout") == "up\nout\nin\n");
      BOOST_TEST(read_all_bytes(*e, "s", s->task_id, "stderr") == "err\n");
    }
  }
}

// Every process of a sandbox is gone when its job settles, but a write end of its stdout can
// outlive them: the command hands it over a unix socket in its root to a process outside (here
// the test). The engine waits 2 s for the stream's EOF, reads what the pipe holds, and settles;
// found by a review (session 33): the job then read as whole while what came later was not
// read. Now its error says so. What the outside process wrote inside the 2 s is kept.
BOOST_AUTO_TEST_CASE(a_stream_held_open_outside_the_sandbox_is_named_at_the_settle) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string path = env.box.root + "/out.sock";
  UniqueFd listener(listen_unix(path));
  auto s = e->start("s", {.argv = {"/usr/bin/python3", "-c", kHandOverStdout, path}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  BOOST_REQUIRE(conn);
  UniqueFd held(receive_fd(conn.get()));
  BOOST_REQUIRE(held);
  BOOST_REQUIRE(::write(conn.get(), "k", 1) == 1);
  // The command ends; its stdout lives on here. Written inside the 2 s: kept.
  BOOST_REQUIRE(eventually([&] {
    auto p = e->output("s", s->task_id, {});
    return p && p->content == "handed over\n";
  }));
  BOOST_REQUIRE(::write(held.get(), "late\n", 5) == 5);
  auto st = e->status("s", s->task_id, 20s);
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "exited");
  BOOST_TEST(st->exit_code.value_or(-1) == 0);
  BOOST_TEST(
      st->error.find("stdout was still open 2000 ms after the command ended") != std::string::npos,
      st->error);
  BOOST_TEST(st->error.find("stderr") == std::string::npos, st->error);
  auto out = e->output("s", s->task_id, {});
  BOOST_REQUIRE(out.has_value());
  BOOST_TEST(out->content == "handed over\nlate\n");
}
