#define BOOST_TEST_MODULE engine_keys_pty
#include <boost/test/unit_test.hpp>

// The key encoder against real interactive programs on a real pty (openpty + fork/exec, no
// sandbox): the bytes encode_write() produces, chosen by the modes ModeTracker read from the
// program's own output, do what a person at a terminal would get. Every wait is a poll on the
// master or the pidfd with a deadline; nothing sleeps.

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.hpp"
#include "engine/keys.hpp"

using namespace cordon;
using namespace cordon::engine;

namespace {

constexpr auto kDeadline = std::chrono::seconds(20);
constexpr std::string_view kBashPrompt = "CORDON$ ";

// Output with control bytes visible, for failure messages.
std::string visible(std::string_view s) {
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

boost::test_tools::assertion_result executable(const char* path) {
  boost::test_tools::assertion_result r(::access(path, X_OK) == 0);
  r.message() << path << " is not installed";
  return r;
}

// One program on a fresh pty: its session leader, the pty slave its controlling terminal.
class PtyProgram {
 public:
  PtyProgram(const std::vector<std::string>& argv, bool echo) {
    char tmpl[] = "/tmp/cordon-keys-XXXXXX";
    BOOST_REQUIRE_MESSAGE(::mkdtemp(tmpl) != nullptr, "mkdtemp: " << std::strerror(errno));
    home_ = tmpl;
    std::vector<std::string> env = {
        "TERM=xterm-256color", "HOME=" + home_,     "PATH=/usr/bin:/bin",
        "LANG=C.UTF-8",        "INPUTRC=/dev/null", "PS1=" + std::string(kBashPrompt),
    };

    int master = -1, slave = -1;
    struct winsize ws = {.ws_row = 24, .ws_col = 200, .ws_xpixel = 0, .ws_ypixel = 0};
    BOOST_REQUIRE_MESSAGE(::openpty(&master, &slave, nullptr, nullptr, &ws) == 0,
                          "openpty: " << std::strerror(errno));
    master_.reset(master);
    UniqueFd slave_fd(slave);
    ::fcntl(master_.get(), F_SETFD, FD_CLOEXEC);
    if (!echo) {
      // cat's output alone then shows what arrived, not the line discipline's echo of it.
      struct termios t;
      BOOST_REQUIRE(::tcgetattr(slave, &t) == 0);
      t.c_lflag &= ~static_cast<tcflag_t>(ECHO);
      BOOST_REQUIRE(::tcsetattr(slave, TCSANOW, &t) == 0);
    }

    std::vector<char*> av, ev;
    for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    for (const auto& e : env) ev.push_back(const_cast<char*>(e.c_str()));
    ev.push_back(nullptr);

    pid_ = ::fork();
    BOOST_REQUIRE_MESSAGE(pid_ >= 0, "fork: " << std::strerror(errno));
    if (pid_ == 0) {
      // The child of a single-threaded test: only async-signal-safe calls until execve.
      ::close(master);
      if (::setsid() < 0 || ::ioctl(slave, TIOCSCTTY, 0) < 0 || ::dup2(slave, 0) < 0 ||
          ::dup2(slave, 1) < 0 || ::dup2(slave, 2) < 0) {
        ::_exit(126);
      }
      if (slave > 2) {
        ::close(slave);
      }
      // SIG_IGN survives execve: a test run from a script's background job has SIGINT
      // ignored, and C-c would then do nothing. Start from defaults, as a terminal does.
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      for (int sig = 1; sig < NSIG; ++sig) {
        ::sigaction(sig, &dfl, nullptr);  // fails harmlessly for SIGKILL, SIGSTOP, gaps
      }
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execve(av[0], av.data(), ev.data());
      ::_exit(127);
    }
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    BOOST_REQUIRE_MESSAGE(pidfd >= 0, "pidfd_open: " << std::strerror(errno));
    pidfd_.reset(pidfd);
  }

  ~PtyProgram() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(home_, ec);
  }

  const TerminalModes& modes() const { return tracker_.modes(); }

  // Encodes `req` under the modes seen so far, as the engine will, and writes it all.
  std::string write(const WriteRequest& req) {
    auto bytes = encode_write(req, modes());
    if (!bytes.has_value()) {  // Boost would build a _MESSAGE even when the check passes
      BOOST_FAIL(bytes.error().message());
    }
    size_t done = 0;
    while (done < bytes->size()) {
      ssize_t n = ::write(master_.get(), bytes->data() + done, bytes->size() - done);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      BOOST_REQUIRE_MESSAGE(n > 0, "write pty master: " << std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    return *bytes;
  }
  std::string write_data(std::string data, bool submit = true) {
    return write(WriteRequest{.data = std::move(data), .submit = submit});
  }
  std::string write_keys(std::vector<std::string> keys, bool submit = false) {
    return write(WriteRequest{.keys = std::move(keys), .submit = submit});
  }

  // Reads until `needle` appears after what earlier waits consumed, and consumes up to it.
  void wait_for(std::string_view needle) {
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    for (;;) {
      size_t at = out_.find(needle, cursor_);
      if (at != std::string::npos) {
        cursor_ = at + needle.size();
        return;
      }
      if (!read_some(deadline)) {
        BOOST_FAIL("waiting for `" << visible(needle) << "`; output after the last match: `"
                                   << visible(std::string_view(out_).substr(cursor_)) << "`");
      }
    }
  }

  // Waits (draining the master) for the program to exit; returns its wait status.
  int wait_exit() {
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    for (;;) {
      struct pollfd p = {pidfd_.get(), POLLIN, 0};
      int n = ::poll(&p, 1, 0);
      if (n == 1) {
        break;
      }
      if (!read_some(deadline) && std::chrono::steady_clock::now() >= deadline) {
        BOOST_FAIL("program did not exit; output: `" << visible(out_.substr(cursor_)) << "`");
      }
    }
    int status = 0;
    BOOST_REQUIRE(::waitpid(pid_, &status, 0) == pid_);
    pid_ = -1;
    return status;
  }

 private:
  // One read from the master, or false at the deadline or once the slave side is gone.
  bool read_some(std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return false;
    }
    struct pollfd p[2] = {{master_.get(), POLLIN, 0}, {pidfd_.get(), POLLIN, 0}};
    int n = ::poll(p, 2, static_cast<int>(left.count()));
    if (n < 0) {
      return errno == EINTR;
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      ssize_t k = ::read(master_.get(), buf, sizeof buf);
      if (k > 0) {
        tracker_.feed(std::string_view(buf, static_cast<size_t>(k)));
        out_.append(buf, static_cast<size_t>(k));
        return true;
      }
      return false;  // EIO: every slave fd is closed
    }
    // The program exited with nothing left to read: no more output can come.
    return !(p[1].revents & POLLIN);
  }

  UniqueFd master_, pidfd_;
  pid_t pid_ = -1;
  std::string home_;
  std::string out_;
  size_t cursor_ = 0;
  ModeTracker tracker_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(cat_receives_the_exact_key_bytes,
                     *boost::unit_test::precondition([](auto) { return executable("/bin/cat"); })) {
  PtyProgram cat({"/bin/cat", "-vT"}, /*echo=*/false);
  BOOST_REQUIRE(!cat.modes().application_cursor);
  cat.write_keys({"Up", "C-Left", "S-Up", "F1", "F5", "F12", "PageDown", "Delete", "M-a", "Tab",
                  "BTab", "\xc3\xa9", "word"},
                 /*submit=*/true);
  // cat -vT shows ESC as ^[, TAB as ^I and bytes >= 0x80 in M- notation; Enter's CR became
  // NL (ICRNL) and came back as CR NL (ONLCR).
  cat.wait_for("^[[A^[[1;5D^[[1;2A^[OP^[[15~^[[24~^[[6~^[[3~^[a^I^[[ZM-CM-)word\r\n");
  cat.write(WriteRequest{.eof = true});
  int status = cat.wait_exit();
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(arrow_bytes_follow_the_cursor_mode_the_program_switches,
                     *boost::unit_test::precondition([](auto) { return executable("/bin/sh"); })) {
  // The program itself switches DECCKM on, reads a line, switches it off, reads another.
  PtyProgram sh({"/bin/sh", "-c",
                 "printf '\\033[?1hON\\n'; IFS= read -r a; printf '%s\\n' \"$a\" | cat -v; "
                 "printf '\\033[?1lOFF\\n'; IFS= read -r b; printf '%s\\n' \"$b\" | cat -v"},
                /*echo=*/false);
  sh.wait_for("ON\r\n");
  BOOST_REQUIRE(sh.modes().application_cursor);
  BOOST_TEST(sh.write_keys({"Up", "Down", "Right", "Left", "Home", "End", "C-Up"}, true) ==
             "\x1bOA\x1bOB\x1bOC\x1bOD\x1bOH\x1bOF\x1b[1;5A\r");
  sh.wait_for("^[OA^[OB^[OC^[OD^[OH^[OF^[[1;5A\r\n");
  sh.wait_for("OFF\r\n");
  BOOST_REQUIRE(!sh.modes().application_cursor);
  BOOST_TEST(sh.write_keys({"Up", "Down", "Right", "Left", "Home", "End", "C-Up"}, true) ==
             "\x1b[A\x1b[B\x1b[C\x1b[D\x1b[H\x1b[F\x1b[1;5A\r");
  sh.wait_for("^[[A^[[B^[[C^[[D^[[H^[[F^[[1;5A\r\n");
  int status = sh.wait_exit();
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(ctrl_c_interrupts_cat,
                     *boost::unit_test::precondition([](auto) { return executable("/bin/cat"); })) {
  PtyProgram cat({"/bin/cat"}, /*echo=*/false);
  cat.write_data("alive");
  cat.wait_for("alive\r\n");  // cat runs and reads the terminal
  BOOST_TEST(cat.write_keys({"C-c"}) == "\x03");
  int status = cat.wait_exit();
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST(WTERMSIG(status) == SIGINT);
}

BOOST_AUTO_TEST_CASE(eof_ends_cat_only_at_the_start_of_a_line,
                     *boost::unit_test::precondition([](auto) { return executable("/bin/cat"); })) {
  PtyProgram cat({"/bin/cat"}, /*echo=*/false);
  // After a partial line ^D hands the line over without a newline; cat keeps reading.
  cat.write(WriteRequest{.data = "partial", .eof = true});
  cat.wait_for("partial");
  // Now at the start of a line: ^D is end of file.
  cat.write(WriteRequest{.eof = true});
  int status = cat.wait_exit();
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(bash_enter_history_paste_and_eof, *boost::unit_test::precondition([](auto) {
                       return executable("/bin/bash");
                     })) {
  PtyProgram bash({"/bin/bash", "--norc", "--noprofile", "-i"}, /*echo=*/true);
  bash.wait_for(kBashPrompt);
  // Debian 12's bash 5.2 (readline 8.2) turns bracketed paste on while it reads a line.
  BOOST_REQUIRE(bash.modes().bracketed_paste);
  BOOST_REQUIRE(!bash.modes().application_cursor);

  // Enter submits.
  bash.write_data("echo hist_$((40+2))");
  bash.wait_for("hist_42\r\n");
  bash.wait_for(kBashPrompt);

  // Up recalls history, normal cursor mode.
  BOOST_TEST(bash.write_keys({"Up"}, /*submit=*/true) == "\x1b[A\r");
  bash.wait_for("hist_42\r\n");
  bash.wait_for(kBashPrompt);

  // readline sends smkx (ESC[?1h ESC=) at each prompt once the keypad is enabled: the
  // tracker sees it and Up becomes ESC O A, which recalls history too.
  bash.write_data("bind 'set enable-keypad on'");
  bash.wait_for(kBashPrompt);
  BOOST_REQUIRE(bash.modes().application_cursor);
  BOOST_TEST(bash.write_keys({"Up", "Up"}, /*submit=*/true) == "\x1bOA\x1bOA\r");
  bash.wait_for("hist_42\r\n");
  bash.wait_for(kBashPrompt);
  bash.write_data("bind 'set enable-keypad off'");
  bash.wait_for(kBashPrompt);
  BOOST_REQUIRE(!bash.modes().application_cursor);

  // Bracketed paste: the pasted ^A is text in the line, so echo prints it...
  BOOST_REQUIRE(bash.modes().bracketed_paste);
  BOOST_TEST(bash.write(WriteRequest{.paste = "echo X\x01Y", .submit = true}) ==
             "\x1b[200~echo X\x01Y\x1b[201~\r");
  bash.wait_for("X\x01Y\r\n");
  bash.wait_for(kBashPrompt);
  // ...whereas typed, ^A is beginning-of-line and the Y lands in front of the command.
  bash.write_data("echo X\x01Y");
  bash.wait_for("Yecho: command not found");
  bash.wait_for(kBashPrompt);
  // A paste cannot end itself early: the embedded end marker is stripped, so the ^A after it
  // stays text instead of acting as a typed key.
  bash.write(WriteRequest{.paste = "echo P\x1b[201~\x01Q", .submit = true});
  bash.wait_for("P\x01Q\r\n");
  bash.wait_for(kBashPrompt);

  // With bracketed paste off, the tracker sees ESC[?2004l and no new ESC[?2004h, and the
  // same paste goes out unbracketed: readline then acts on the ^A.
  bash.write_data("bind 'set enable-bracketed-paste off'");
  bash.wait_for(kBashPrompt);
  BOOST_REQUIRE(!bash.modes().bracketed_paste);
  BOOST_TEST(bash.write(WriteRequest{.paste = "echo X\x01Z", .submit = true}) == "echo X\x01Z\r");
  bash.wait_for("Zecho: command not found");
  bash.wait_for(kBashPrompt);

  // C-c interrupts the foreground command. (Not C-c at the prompt: bash 5.2's readline
  // sometimes loses the redisplay after a SIGINT at the prompt, a race of its own.)
  // Type only once READY shows that readline gave the terminal back (canonical, ICRNL):
  // earlier type-ahead would meet readline's raw settings and its CR would stay a CR.
  bash.write_data("echo RE''ADY; cat");
  bash.wait_for("READY\r\n");
  bash.write_data("ping_$((5+5))");
  bash.wait_for("ping_$((5+5))\r\nping_$((5+5))\r\n");  // the echo, then cat's copy: it runs
  BOOST_TEST(bash.write_keys({"C-c"}) == "\x03");
  bash.wait_for(kBashPrompt);
  bash.write_data("echo status_$?");
  bash.wait_for("status_130\r\n");  // 128 + SIGINT
  bash.wait_for(kBashPrompt);

  // C-d on an empty line ends the shell.
  bash.write(WriteRequest{.eof = true});
  int status = bash.wait_exit();
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}

BOOST_AUTO_TEST_CASE(python_repl_interrupt_and_eof, *boost::unit_test::precondition([](auto) {
                       return executable("/usr/bin/python3");
                     })) {
  PtyProgram py({"/usr/bin/python3", "-q", "-i"}, /*echo=*/true);
  py.wait_for(">>> ");
  // An endless loop that first says it started ('RE'+'ADY' so the echo cannot match). It
  // runs bytecode, where Python checks for signals (a loop inside one C call would not).
  py.write_data("print('RE'+'ADY', flush=True); exec('while True: pass')");
  py.wait_for("READY\r\n");
  py.write_keys({"C-c"});
  py.wait_for("KeyboardInterrupt");
  py.wait_for(">>> ");
  py.write_data("print(6*7)");
  py.wait_for("42\r\n");
  py.wait_for(">>> ");
  py.write(WriteRequest{.eof = true});
  int status = py.wait_exit();
  BOOST_TEST(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0);
}
