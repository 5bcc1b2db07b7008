#define BOOST_TEST_MODULE engine_pty
#include <boost/test/unit_test.hpp>

#include "helpers/engine_fixture.hpp"

// A real interactive program on the sandbox's pty: keys (including cursor keys in readline's
// application mode), bracketed paste, submit, EOF, and resize.

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

std::string pty_text(Engine& e, const std::string& id) {
  auto p = e.output("s", id, {.stream = "pty", .limit = 200000});
  return p ? p->content : std::string();
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// Starts `/bin/sh -c script` on a pty (the script prints "ready" once it is set up) and
// returns its task id once "ready" is on the terminal.
std::string start_shell_ready(Engine& e, const std::string& script) {
  auto s = e.start("s", {.argv = {"/bin/sh", "-c", script}, .pty = true});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  BOOST_REQUIRE(eventually([&] { return pty_text(e, id).find("ready") != std::string::npos; }));
  return id;
}

}  // namespace

BOOST_AUTO_TEST_CASE(python_repl_takes_keys_paste_and_eof) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/usr/bin/python3", "-q", "-i"}, .pty = true});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  BOOST_REQUIRE_MESSAGE(
      eventually([&] { return pty_text(*e, id).find(">>> ") != std::string::npos; }),
      pty_text(*e, id));
  // Typed out of order, fixed with a cursor key: "rint(40+2)", Home, "p", Enter.
  BOOST_REQUIRE(e->write("s", id, {.data = "rint(40+2)"}).has_value());
  BOOST_REQUIRE(e->write("s", id, {.keys = {"Home"}}).has_value());
  BOOST_REQUIRE(e->write("s", id, {.data = "p", .keys = {"Enter"}}).has_value());
  BOOST_REQUIRE_MESSAGE(
      eventually([&] { return pty_text(*e, id).find("\r\n42\r\n") != std::string::npos; }),
      pty_text(*e, id));
  // A paste (bracketed: readline enables it), submitted with CR.
  BOOST_REQUIRE(e->write("s", id, {.paste = "print(1000+234)", .submit = true}).has_value());
  BOOST_REQUIRE_MESSAGE(eventually([&] { return count(pty_text(*e, id), "\r\n1234\r\n") == 1; }),
                        pty_text(*e, id));
  // History through the Up key (application cursor mode when readline asked for it).
  BOOST_REQUIRE(e->write("s", id, {.keys = {"Up", "Enter"}}).has_value());
  BOOST_REQUIRE_MESSAGE(eventually([&] { return count(pty_text(*e, id), "\r\n1234\r\n") == 2; }),
                        pty_text(*e, id));
  // C-u kills the typed line; Tab and BSpace edit; then the line runs.
  BOOST_REQUIRE(e->write("s", id, {.data = "garbage", .keys = {"C-u"}}).has_value());
  BOOST_REQUIRE(
      e->write("s", id, {.data = "print('t'+'ab')x", .keys = {"BSpace", "Enter"}}).has_value());
  BOOST_REQUIRE_MESSAGE(
      eventually([&] { return pty_text(*e, id).find("\r\ntab\r\n") != std::string::npos; }),
      pty_text(*e, id));
  // EOF on an empty line ends the REPL with status 0. Sent once the next prompt is there: in a
  // loaded sanitized suite (session 11) a ^D sent right after the output did not end the REPL
  // within 20 s, not reproduced in 12 runs alone; most likely it arrived while readline had the
  // terminal in cooked mode between two lines, where the line discipline takes ^D itself.
  BOOST_REQUIRE_MESSAGE(eventually([&] {
                          std::string t = pty_text(*e, id);
                          size_t at = t.find("\r\ntab\r\n");
                          return at != std::string::npos && t.find(">>> ", at) != std::string::npos;
                        }),
                        pty_text(*e, id));
  BOOST_REQUIRE(e->write("s", id, {.eof = true}).has_value());
  auto st = e->status("s", id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->error);
  BOOST_TEST(st->exit_code.value_or(-1) == 0);
  BOOST_TEST(st->pty);
  BOOST_REQUIRE(st->stdout_artifact.has_value());
  BOOST_TEST(st->stdout_artifact->stream == "pty");
  BOOST_TEST(st->tail_preview.find("1234") != std::string::npos, st->tail_preview);
  // A settled pty job takes no more input.
  BOOST_TEST(!e->write("s", id, {.data = "x"}).has_value());
}

BOOST_AUTO_TEST_CASE(resize_reaches_the_program) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s =
      e->start("s", {.argv = {"/bin/sh", "-c", "stty size; read x; stty size; echo TERM=$TERM"},
                     .pty = true,
                     .cols = 100,
                     .rows = 40});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  BOOST_REQUIRE_MESSAGE(
      eventually([&] { return pty_text(*e, id).find("40 100") != std::string::npos; }),
      pty_text(*e, id));
  BOOST_REQUIRE(eventually([&] { return e->resize("s", id, 132, 43).has_value(); }));
  BOOST_REQUIRE(e->write("s", id, {.submit = true}).has_value());
  auto st = e->status("s", id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited");
  std::string out = pty_text(*e, id);
  BOOST_TEST(out.find("43 132") != std::string::npos, out);
  BOOST_TEST(out.find("TERM=xterm-256color") != std::string::npos, out);
  BOOST_TEST(st->cols == 132);  // the status says the size, the last resize's
  BOOST_TEST(st->rows == 43);
  // Resizing a settled job or a pipe job is refused.
  BOOST_TEST(!e->resize("s", id, 80, 24).has_value());
  auto p = e->start("s", {.argv = {"/bin/true"}});
  BOOST_REQUIRE(p.has_value());
  auto r = e->resize("s", p->task_id, 80, 24);
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("no terminal") != std::string::npos);
  BOOST_TEST(r.error().message().find("without pty") != std::string::npos, r.error().message());
  auto settled = e->resize("s", id, 80, 24);
  BOOST_REQUIRE(!settled.has_value());
  BOOST_TEST(settled.error().message().find("settled (exited)") != std::string::npos,
             settled.error().message());
  BOOST_TEST(e->status("s", p->task_id)->cols == 0);  // no terminal, no size
  // The size is in the job's record: a restarted engine still says it.
  e.reset();
  auto e2 = open_engine(env);
  auto again = e2->status("s", id);
  BOOST_REQUIRE_MESSAGE(again.has_value(), describe(again));
  BOOST_TEST(again->cols == 132);
  BOOST_TEST(again->rows == 43);
}

// A resize right after the start, before the terminal's master has reached the engine (it
// comes over the sandbox's status channel), takes effect once it does. Failure fixed
// (session 32): such a resize was refused as "no terminal", though the job had one coming.
// The record of a running job says its last size: an engine that dies while the job runs
// still knows it (session 33; before, meta.json kept the start's size until the settle).
BOOST_AUTO_TEST_CASE(a_running_jobs_record_has_its_last_size) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c", "read x"}, .pty = true});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  auto meta = [&] { return nlohmann::json::parse(read_file(env.job_dir(id) + "/meta.json")); };
  BOOST_TEST(meta().value("cols", 0) == 120);
  BOOST_REQUIRE(eventually([&] { return e->resize("s", id, 90, 33).has_value(); }));
  nlohmann::json running = meta();
  BOOST_TEST(running.value("state", "") == "running");
  BOOST_TEST(running.value("cols", 0) == 90);
  BOOST_TEST(running.value("rows", 0) == 33);
  BOOST_REQUIRE(e->write("s", id, {.submit = true}).has_value());
  BOOST_TEST(e->status("s", id, 20s)->state == "exited");
}

BOOST_AUTO_TEST_CASE(a_resize_before_the_terminal_is_attached_is_kept) {
  EngineEnv env;
  auto e = open_engine(env);
  for (int i = 0; i < 5; ++i) {  // the master arrives within moments: a few tries hit both ways
    auto s = e->start("s", {.argv = {"/bin/sh", "-c", "read x; stty size"}, .pty = true});
    BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
    auto r = e->resize("s", s->task_id, 91, 17);
    BOOST_REQUIRE_MESSAGE(r.has_value(), describe(r));
    BOOST_REQUIRE(e->write("s", s->task_id, {.submit = true}).has_value());
    auto st = e->status("s", s->task_id, 20s);
    BOOST_REQUIRE(st.has_value());
    BOOST_TEST(st->state == "exited", st->error);
    std::string out = pty_text(*e, s->task_id);
    BOOST_TEST(out.find("17 91") != std::string::npos, out);
  }
}

// A queued pty job (no concurrency slot free) starts at the size a resize gave it meanwhile.
BOOST_AUTO_TEST_CASE(a_queued_pty_job_starts_at_the_size_it_was_resized_to) {
  EngineEnv env(nlohmann::json{{"concurrency", {{"perSession", 1}, {"total", 4}}}});
  auto e = open_engine(env);
  auto holder = e->start("s", {.argv = {"/bin/cat"}, .stdin_mode = StdinMode::kPipe});
  BOOST_REQUIRE_MESSAGE(holder.has_value(), describe(holder));
  auto queued = e->start("s", {.argv = {"/bin/sh", "-c", "stty size"}, .pty = true});
  BOOST_REQUIRE_MESSAGE(queued.has_value(), describe(queued));
  BOOST_REQUIRE(queued->state == "queued");
  BOOST_REQUIRE(e->resize("s", queued->task_id, 77, 11).has_value());
  BOOST_REQUIRE(e->write("s", holder->task_id, {.eof = true}).has_value());
  auto st = e->status("s", queued->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->error);
  std::string out = pty_text(*e, queued->task_id);
  BOOST_TEST(out.find("11 77") != std::string::npos, out);
}

// The foreground program is told (SIGWINCH), as a terminal emulator's resize tells it.
BOOST_AUTO_TEST_CASE(a_resize_sends_sigwinch_to_the_program) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c",
                                   "trap 'echo WINCH; stty size; exit 3' WINCH; echo ready; "
                                   "while :; do /bin/sleep 0.05; done"},
                          .pty = true});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  BOOST_REQUIRE(eventually([&] { return pty_text(*e, id).find("ready") != std::string::npos; }));
  BOOST_REQUIRE(e->resize("s", id, 150, 45).has_value());
  auto st = e->status("s", id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->error);
  BOOST_TEST(st->exit_code.value_or(-1) == 3);
  std::string out = pty_text(*e, id);
  BOOST_TEST(out.find("WINCH\r\n45 150") != std::string::npos, out);
}

// A terminal of 0 or of more than kMaxTerminalSide a side is refused at the start and at a
// resize, naming the bounds: a program divides by its size, and a full-screen one allocates a
// cell for each character of it.
BOOST_AUTO_TEST_CASE(terminal_sizes_outside_the_bounds_are_refused) {
  EngineEnv env;
  auto e = open_engine(env);
  for (auto [cols, rows] :
       {std::pair<uint16_t, uint16_t>{0, 24}, {80, 0}, {1001, 24}, {80, 1001}, {65535, 65535}}) {
    auto s = e->start("s", {.argv = {"/bin/true"}, .pty = true, .cols = cols, .rows = rows});
    BOOST_REQUIRE(!s.has_value());
    BOOST_TEST((s.error().code() == ErrorCode::kInvalid));
    BOOST_TEST(s.error().message().find("each side is 1 to 1000") != std::string::npos,
               s.error().message());
  }
  auto big = e->start("s", {.argv = {"/bin/sh", "-c", "stty size; read x; stty size"},
                            .pty = true,
                            .cols = kMaxTerminalSide,
                            .rows = 1});
  BOOST_REQUIRE_MESSAGE(big.has_value(), describe(big));
  const std::string id = big->task_id;
  BOOST_REQUIRE(eventually([&] { return pty_text(*e, id).find("1 1000") != std::string::npos; }));
  for (auto [cols, rows] : {std::pair<uint16_t, uint16_t>{0, 1}, {1, 0}, {1001, 1}}) {
    auto r = e->resize("s", id, cols, rows);
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().code() == ErrorCode::kInvalid));
  }
  BOOST_REQUIRE(e->resize("s", id, 1, kMaxTerminalSide).has_value());
  BOOST_REQUIRE(e->write("s", id, {.submit = true}).has_value());
  BOOST_REQUIRE(e->status("s", id, 20s).has_value());
  std::string out = pty_text(*e, id);
  BOOST_TEST(out.find("1000 1\r\n") != std::string::npos, out);
}

// Failure fixed (a review, session 13): the engine closed the pty master the first time the
// command held no descriptor of its terminal (`exec </dev/null >/dev/null 2>&1`, as daemons
// do), which hangs the terminal up: the command was killed by SIGHUP (`cordon run --tty` let
// it run on), and input written afterwards was answered as accepted and never delivered.
BOOST_AUTO_TEST_CASE(a_command_that_closes_its_terminal_runs_on_and_input_is_refused) {
  EngineEnv env;
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/bin/sh", "-c",
                                   "echo start; exec </dev/null >/dev/null 2>&1; sleep 1; "
                                   "echo alive > alive; sleep 2"},
                          .pty = true});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  const std::string id = s->task_id;
  BOOST_REQUIRE(eventually([&] { return pty_text(*e, id).find("start") != std::string::npos; }));
  // Until the exec closes the terminal a write is taken (it is the terminal's); after it,
  // every write is refused with the reason.
  std::string refusal;
  BOOST_REQUIRE(eventually([&] {
    auto w = e->write("s", id, {.data = "hello\n"});
    if (!w) refusal = w.error().message();
    return !w.has_value();
  }));
  BOOST_TEST(refusal.find("closed its terminal") != std::string::npos, refusal);
  auto again = e->write("s", id, {.data = "x"});
  BOOST_REQUIRE(!again.has_value());
  BOOST_TEST(again.error().message().find("nothing of this write was sent") != std::string::npos,
             again.error().message());
  auto st = e->status("s", id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited",
             st->state << " " << st->signal.value_or("") << " " << st->error);
  BOOST_TEST(st->exit_code.value_or(-1) == 0);
  BOOST_TEST(read_file(env.box.root + "/alive") == "alive\n");
}

// Failure fixed (a review, session 13): a paste is text, but the line discipline acted on the
// control bytes in it: a pasted ^C killed a program reading a line (SIGINT), a ^U erased it.
// The bytes the terminal's termios gives a meaning now are dropped from a paste.
BOOST_AUTO_TEST_CASE(a_paste_holding_control_bytes_stays_text) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string id = start_shell_ready(*e, "echo ready; read x; echo \"got:$x\"");
  BOOST_REQUIRE(e->write("s", id, {.paste = "line\x15 one\x03 rest", .submit = true}).has_value());
  auto st = e->status("s", id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->state << " " << st->signal.value_or(""));
  BOOST_TEST(pty_text(*e, id).find("got:line one rest") != std::string::npos, pty_text(*e, id));
}

// With ISTRIP (the program's own `stty istrip`) the line discipline clears each byte's high
// bit first: a pasted U+00C3 (C3 83) held a ^C and the shell got SIGINT (found by a review,
// session 29). The paste is filtered as the terminal will see it.
BOOST_AUTO_TEST_CASE(a_paste_on_a_terminal_stripping_the_high_bit_sends_no_signal) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string id = start_shell_ready(*e, "stty istrip; echo ready; read x; echo \"got:$x\"");
  BOOST_REQUIRE(e->write("s", id,
                         {.paste = "A\xc3\x83"
                                   "B",
                          .submit = true})
                    .has_value());
  auto st = e->status("s", id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->state << " " << st->signal.value_or(""));
  BOOST_TEST(pty_text(*e, id).find("got:AC") != std::string::npos, pty_text(*e, id));
}

// Failures fixed (a review, session 13), on a terminal in canonical mode: (1) `eof` after a
// partial line sent one ^D, which only hands the partial line over: `cat` kept waiting; now
// it is doubled there. (2) A line longer than the kernel's line buffer (4095 bytes) reached
// `read` cut to 4095, the rest dropped without a word; now the write is refused whole.
BOOST_AUTO_TEST_CASE(eof_after_a_partial_line_ends_input_and_an_overlong_line_is_refused) {
  EngineEnv env;
  auto e = open_engine(env);
  auto cat = e->start("s", {.argv = {"/bin/cat"}, .pty = true});
  BOOST_REQUIRE_MESSAGE(cat.has_value(), describe(cat));
  BOOST_REQUIRE(e->write("s", cat->task_id, {.data = "hello", .eof = true}).has_value());
  auto st = e->status("s", cat->task_id, 10s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->state << ": cat still waits for input");

  const std::string id = start_shell_ready(*e, "echo ready; read x; echo \"LEN=${#x}\"");
  // 4000 bytes now and 200 more later make one line of 4200: the second write is refused.
  BOOST_REQUIRE(e->write("s", id, {.data = std::string(4000, 'a')}).has_value());
  auto over = e->write("s", id, {.data = std::string(200, 'b'), .submit = true});
  BOOST_REQUIRE(!over.has_value());
  BOOST_TEST(over.error().message().find("at most 4095 bytes of a line") != std::string::npos,
             over.error().message());
  BOOST_TEST(over.error().message().find("line of 4200 bytes") != std::string::npos,
             over.error().message());
  BOOST_REQUIRE(e->write("s", id, {.data = std::string(95, 'c'), .submit = true}).has_value());
  auto done = e->status("s", id, 10s);
  BOOST_REQUIRE(done.has_value());
  BOOST_TEST(done->state == "exited");
  BOOST_TEST(pty_text(*e, id).find("LEN=4095") != std::string::npos, pty_text(*e, id));
}

// The line the kernel holds is what the limit counts, as the kernel makes it: after VLNEXT
// (^V) a newline, a kill (^U) or an interrupt (^C) is a plain byte of the line, and with INLCR
// a newline is a carriage return, which ends no line. Failure fixed (a review, session 31):
// each of these writes was counted as short lines and let through, and the kernel cut the line
// at 4095 bytes without a word; an eof after a trailing ^V was taken as a literal ^D and `cat`
// kept waiting.
BOOST_AUTO_TEST_CASE(a_literal_next_byte_and_inlcr_are_counted_as_the_kernel_keeps_them) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string a(3000, 'a'), b(3000, 'b');
  // The shell's `read` stops at the first newline of the line it gets: after "ab^V\ncd\n" it
  // holds "ab"; the escaped ^U and ^C stay in it (5 bytes).
  for (const auto& [sep, fits] : {std::pair<std::string, const char*>{"\x16\n", "LEN=2"},
                                  {"\x16\x15", "LEN=5"},
                                  {"\x16\x03", "LEN=5"}}) {
    BOOST_TEST_CONTEXT("separator " << (sep[1] == '\n'   ? "^V newline"
                                        : sep[1] == 0x15 ? "^V^U"
                                                         : "^V^C")) {
      const std::string id = start_shell_ready(*e, "echo ready; read x; echo \"LEN=${#x}\"");
      auto over = e->write("s", id, {.data = a + sep + b + "\n"});
      BOOST_REQUIRE(!over.has_value());
      BOOST_TEST(over.error().message().find("line of 6001 bytes") != std::string::npos,
                 over.error().message());
      BOOST_REQUIRE(e->write("s", id, {.data = "ab" + sep + "cd\n"}).has_value());
      auto done = e->status("s", id, 10s);
      BOOST_REQUIRE(done.has_value());
      BOOST_TEST(done->state == "exited", done->state << " " << done->signal.value_or(""));
      BOOST_TEST(pty_text(*e, id).find(fits) != std::string::npos, pty_text(*e, id));
    }
  }
  const std::string inlcr =
      start_shell_ready(*e, "stty inlcr; echo ready; read x; echo \"LEN=${#x}\"");
  auto over = e->write("s", inlcr, {.data = a + "\n" + b + "\n"});
  BOOST_REQUIRE(!over.has_value());
  BOOST_TEST(over.error().message().find("line of 6002 bytes") != std::string::npos,
             over.error().message());
  BOOST_REQUIRE(e->write("s", inlcr, {.data = "xyz\r"}).has_value());  // ICRNL: a line end
  auto done = e->status("s", inlcr, 10s);
  BOOST_REQUIRE(done.has_value());
  BOOST_TEST(done->state == "exited");
  BOOST_TEST(pty_text(*e, inlcr).find("LEN=3") != std::string::npos, pty_text(*e, inlcr));

  auto cat = e->start("s", {.argv = {"/bin/cat"}, .pty = true});
  BOOST_REQUIRE_MESSAGE(cat.has_value(), describe(cat));
  BOOST_REQUIRE(e->write("s", cat->task_id, {.data = "abc\x16", .eof = true}).has_value());
  auto st = e->status("s", cat->task_id, 10s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->state << ": cat still waits for input");
}

// The line the kernel holds is what the limit counts: a signal character (^C, here ignored by
// the command) flushes the partial line, so 4000 bytes, ^C and 200 more make a line of 200.
BOOST_AUTO_TEST_CASE(a_signal_character_starts_the_counted_line_anew) {
  EngineEnv env;
  auto e = open_engine(env);
  const std::string id =
      start_shell_ready(*e, "trap '' INT; echo ready; read x; echo \"LEN=${#x}\"");
  BOOST_REQUIRE(e->write("s", id, {.data = std::string(4000, 'a')}).has_value());
  BOOST_REQUIRE(e->write("s", id, {.keys = {"C-c"}}).has_value());
  auto w = e->write("s", id, {.data = std::string(200, 'b'), .submit = true});
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  auto done = e->status("s", id, 10s);
  BOOST_REQUIRE(done.has_value());
  BOOST_TEST(done->state == "exited");
  BOOST_TEST(pty_text(*e, id).find("LEN=200") != std::string::npos, pty_text(*e, id));
}
