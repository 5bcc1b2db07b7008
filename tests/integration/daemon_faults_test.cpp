#define BOOST_TEST_MODULE daemon_faults
#include <boost/test/unit_test.hpp>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "helpers/daemon_fixture.hpp"

// Faults at the daemon (issue 7): a client that disconnects mid-call, one that sends half a
// line and stalls, one that sends a 100 MB line, 100 clients at once. In each, another
// client's call must complete in bounded time and the daemon must stay up; the abusive
// connection is answered with an error or closed.

using namespace cordon::test;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A second client's whole call, on a loaded 2-core machine: as the hundred clients' own (a
// sanitized build there once took longer than 10 s, the default yield, to run the bystander's
// echo among them: CI, session 14).
constexpr auto kServed = 60s;
constexpr int kStallMs = 3000;  // daemon.stallTimeoutMs: a line begun and not finished

// Room for the hundred-client case, and a stall timeout the stall case can outwait.
json faults_policy() {
  return {{"concurrency", {{"perSession", 200}, {"total", 200}}},
          {"daemon", {{"stallTimeoutMs", kStallMs}}}};
}

// A fresh client, served start to finish: handshake, run_command echo, its output inline.
// Returns how long it took, or nullopt when it was not served.
std::optional<std::chrono::milliseconds> served(const DaemonProcess& d, const std::string& word) {
  auto t0 = std::chrono::steady_clock::now();
  LineClient c(d);
  if (c.fd() < 0 || !c.handshake("bystander") || !c.initialize()) return std::nullopt;
  json r = c.call("run_command", {{"argv", {"/bin/echo", word}}, {"yieldMs", 30000}}, kServed);
  if (!r.contains("result")) return std::nullopt;
  json sc = r["result"]["structuredContent"];
  if (sc.value("state", "") != "exited" || sc["output"]["stdout"]["content"] != word + "\n") {
    return std::nullopt;
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0);
}

// Sends `bytes` one byte at a time, `every` apart (waiting on the socket meanwhile, so a close
// is seen at once); returns how long until the daemon closed the connection, or nullopt when
// it was still open after `limit`.
std::optional<std::chrono::milliseconds> trickle_until_closed(LineClient& c,
                                                              const std::string& bytes,
                                                              std::chrono::milliseconds every,
                                                              std::chrono::milliseconds limit) {
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; std::chrono::steady_clock::now() - t0 < limit; ++i) {
    if (!c.send_raw(bytes.substr(i % bytes.size(), 1)) || c.closed_within(every)) {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - t0);
    }
  }
  return std::nullopt;
}

}  // namespace

// Failure fixed: the handshake's 10 s and daemon.stallTimeoutMs bounded each wait for more
// bytes, not the line, and the idle limit was reset by any byte: a client sending one byte
// at a time, or a bare newline now and then, held its connection (and a thread) for ever.
BOOST_AUTO_TEST_CASE(a_trickled_handshake_a_trickled_line_and_bare_newlines_are_closed) {
  DaemonProcess d(json{{"daemon", {{"stallTimeoutMs", 1000}, {"idleTimeoutMs", 1500}}}});
  LineClient hs(d), line(d), blank(d);
  BOOST_REQUIRE(line.handshake("line") && line.initialize());
  BOOST_REQUIRE(blank.handshake("blank") && blank.initialize());
  // Boost.Test's checks are not thread-safe: the threads only measure.
  std::optional<std::chrono::milliseconds> t_line, t_blank;
  std::thread t1([&] {
    t_line =
        trickle_until_closed(line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"", 200ms, 15s);
  });
  std::thread t2([&] { t_blank = trickle_until_closed(blank, "\n", 200ms, 15s); });
  // The handshake: 10 s for the whole line, however its bytes come.
  auto t_hs =
      trickle_until_closed(hs, "{\"cordon\":\"connect\",\"session\":\"a-long-name\"", 300ms, 25s);
  t1.join();
  t2.join();
  BOOST_TEST(t_line.has_value(), "a line trickled byte by byte was never closed");
  if (t_line) BOOST_TEST(t_line->count() < 6000, t_line->count() << " ms");
  BOOST_TEST(t_blank.has_value(), "bare newlines kept an idle connection open");
  if (t_blank) BOOST_TEST(t_blank->count() < 6000, t_blank->count() << " ms");
  BOOST_TEST(t_hs.has_value(), "a handshake trickled byte by byte was never closed");
  if (t_hs) BOOST_TEST(t_hs->count() < 15000, t_hs->count() << " ms");
  BOOST_TEST(d.alive(), d.death());
  BOOST_TEST(served(d, "after").has_value());
}

// A client starts a call that waits (run_command on a 3 s sleep) and hangs up. The daemon
// serves others meanwhile, later finds the client gone when the reply is due (EPIPE, not
// SIGPIPE), and keeps serving; the command itself ran to its end.
BOOST_AUTO_TEST_CASE(a_client_that_disconnects_mid_call_does_not_disturb_others) {
  DaemonProcess d(faults_policy());
  BOOST_REQUIRE_MESSAGE(d.alive(), d.death());
  std::string task;
  {
    LineClient a(d);
    BOOST_REQUIRE(a.handshake("leaver") && a.initialize());
    json started = a.call("run_command_bg", {{"argv", {"/bin/sleep", "3"}}});
    BOOST_REQUIRE(started.contains("result"));
    task = started["result"]["structuredContent"]["taskId"].get<std::string>();
    a.call_async("command_wait", {{"taskIds", {task}}, {"timeoutMs", 60000}});
    a.call_async("run_command", {{"argv", {"/bin/sleep", "3"}}, {"yieldMs", 60000}});
    a.close();  // mid-call
  }
  auto t = served(d, "during");
  BOOST_TEST(t.has_value());
  // The waits end (the sleeps finish) and their replies meet a closed socket.
  LineClient again(d);
  BOOST_REQUIRE(again.handshake("leaver") && again.initialize());
  json st = again.call("command_status", {{"taskId", task}, {"waitMs", 15000}});
  BOOST_REQUIRE(st.contains("result"));
  BOOST_TEST(st["result"]["structuredContent"]["state"] == "exited");
  // Both of the leaver's jobs end; the abandoned calls' replies are then attempted.
  json listed = again.call("command_list", json::object());
  BOOST_REQUIRE(listed.contains("result"));
  std::vector<std::string> ids;
  for (const auto& j : listed["result"]["structuredContent"]["jobs"])
    ids.push_back(j["taskId"].get<std::string>());
  // The run_command sent just before the hang-up may have been cancelled before it started.
  BOOST_TEST(ids.size() >= 1u);
  json all = again.call("command_wait", {{"taskIds", ids}, {"mode", "all"}, {"timeoutMs", 15000}});
  BOOST_REQUIRE(all.contains("result"));
  BOOST_TEST(d.alive(), d.death());
  BOOST_TEST(served(d, "after").has_value());
}

// Half a line after the handshake, then nothing: only that connection waits, and only until
// daemon.stallTimeoutMs closes it.
BOOST_AUTO_TEST_CASE(half_a_line_then_a_stall_blocks_only_that_connection) {
  DaemonProcess d(faults_policy());
  LineClient stalled(d);
  BOOST_REQUIRE(stalled.handshake("staller") && stalled.initialize());
  BOOST_REQUIRE(stalled.send_raw("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/ca"));
  LineClient pre(d);
  BOOST_REQUIRE(pre.fd() >= 0);
  BOOST_REQUIRE(pre.send_raw("{\"cordon\":\"conn"));  // and one stalled mid-handshake
  for (int i = 0; i < 3; ++i) {
    auto t = served(d, "word" + std::to_string(i));
    BOOST_TEST(t.has_value());
    if (t) BOOST_TEST(t->count() < 10000, t->count() << " ms");
  }
  BOOST_TEST(d.alive(), d.death());
  // Both stalled connections are closed when their time runs out: the half request line after
  // daemon.stallTimeoutMs, the half handshake after the handshake timeout (10 s).
  BOOST_TEST(stalled.closed_within(std::chrono::milliseconds(kStallMs) + 10s),
             "the stalled request line is still open");
  BOOST_TEST(pre.closed_within(20s), "the stalled handshake is still open after 20 s");
}

// A 100 MB line (no newline until the end): the daemon keeps serving others while it arrives,
// discards it with a JSON-RPC error (or closes the connection), and the sender's session works
// afterwards on the same connection when it was kept.
BOOST_AUTO_TEST_CASE(a_hundred_megabyte_line_is_refused_and_others_are_served) {
  DaemonProcess d(faults_policy());
  LineClient big(d);
  BOOST_REQUIRE(big.handshake("big") && big.initialize());
  std::atomic<bool> sent_all{false};
  std::atomic<bool> send_failed{false};
  std::thread sender([&] {
    std::string chunk(1 << 20, 'x');
    std::string head = "{\"jsonrpc\":\"2.0\",\"id\":77,\"method\":\"tools/call\",\"params\":\"";
    if (!big.send_raw(head)) {
      send_failed = true;
      return;
    }
    for (int i = 0; i < 100; ++i) {
      if (!big.send_raw(chunk)) {
        send_failed = true;  // the daemon closed it: acceptable
        return;
      }
    }
    if (!big.send_raw("\"}\n")) {
      send_failed = true;
      return;
    }
    sent_all = true;
  });
  auto t = served(d, "meanwhile");
  BOOST_TEST(t.has_value());
  sender.join();
  BOOST_TEST(d.alive(), d.death());
  if (sent_all) {
    // Answered in band: an Invalid Request error naming the limit (with id null: the id was
    // in the discarded line), or the connection closed; a kept session goes on working.
    json answer;
    bool eof = false;
    auto until = std::chrono::steady_clock::now() + 30s;
    while (answer.is_null() && !eof && std::chrono::steady_clock::now() < until) {
      auto l = big.line(std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now()));
      if (!l) {
        eof = big.closed();  // not a timeout: the daemon closed the connection
        break;
      }
      json m = json::parse(*l, nullptr, false);
      if (m.is_object() && m.contains("error")) answer = m;
    }
    BOOST_TEST_MESSAGE("100 MB line answered with: " << answer.dump() << (eof ? " (closed)" : ""));
    BOOST_TEST((!answer.is_null() || eof));
    if (!answer.is_null()) {
      BOOST_TEST(answer["error"]["code"] == -32600);
      BOOST_TEST(answer["error"]["message"].get<std::string>().find("longer than") !=
                 std::string::npos);
      json r = big.call("command_list", json::object());
      BOOST_TEST(r.contains("result"));
    }
  } else {
    BOOST_TEST_MESSAGE("the daemon closed the connection during the 100 MB line");
    BOOST_TEST(send_failed.load());
  }
  BOOST_TEST(served(d, "after").has_value());
}

// 100 clients connect at once and each runs a command; every one is answered with its own
// output, and a bystander is served meanwhile.
BOOST_AUTO_TEST_CASE(a_hundred_clients_at_once_are_all_served) {
  DaemonProcess d(faults_policy());
  constexpr int kClients = 100;
  std::vector<std::unique_ptr<LineClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<LineClient>(d));
    BOOST_REQUIRE_MESSAGE(clients.back()->fd() >= 0, "connect " << i);
  }
  std::atomic<int> ok{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;  // what a client that was not served got instead
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      LineClient& c = *clients[static_cast<size_t>(i)];
      auto fail = [&](const std::string& why) {
        std::lock_guard<std::mutex> lock(failures_mu);
        failures.push_back("client " + std::to_string(i) + ": " + why);
      };
      if (!c.handshake("crowd" + std::to_string(i % 10)) || !c.initialize()) {
        fail("no handshake");
        return;
      }
      std::string word = "client" + std::to_string(i);
      // Waits up to 30 s (the most), not the default 10 s: a sanitized build on a loaded 2-core CI
      // machine once took longer than that to spawn all 100 sandboxes (6 were still running).
      json r = c.call("run_command", {{"argv", {"/bin/echo", word}}, {"yieldMs", 30000}}, 60s);
      if (r.contains("result") &&
          r["result"]["structuredContent"]["output"]["stdout"]["content"] == word + "\n") {
        ++ok;
      } else {
        fail(r.dump().substr(0, 2000));
      }
    });
  }
  auto t = served(d, "bystander");
  for (auto& th : threads) th.join();
  BOOST_TEST(ok.load() == kClients);
  std::string first;  // the first three, enough to tell why
  for (size_t i = 0; i < std::min<size_t>(failures.size(), 3); ++i) {
    first += "\n" + failures[i];
  }
  BOOST_TEST(failures.empty(), failures.size() << " not served:" << first);
  BOOST_TEST(t.has_value());
  if (t) BOOST_TEST_MESSAGE("bystander served in " << t->count() << " ms among 100 clients");
  BOOST_TEST(d.alive(), d.death());
}

namespace {

// A pids cgroup of this test's own (v1 pids hierarchy, or a cgroup2 root that delegates pids),
// removed at the end; nullopt on a host with neither.
struct OwnPidsCgroup {
  std::string dir;
  static std::optional<OwnPidsCgroup> make() {
    std::string parent;
    if (::access("/sys/fs/cgroup/pids/cgroup.procs", W_OK) == 0) {
      parent = "/sys/fs/cgroup/pids";
    } else if (read_text_file("/sys/fs/cgroup/cgroup.subtree_control").find("pids") !=
               std::string::npos) {
      parent = "/sys/fs/cgroup";
    } else {
      return std::nullopt;
    }
    OwnPidsCgroup c(parent + "/cordon-daemon-faults-" + std::to_string(::getpid()));
    if (::mkdir(c.dir.c_str(), 0755) != 0) return std::nullopt;
    return c;
  }
  // The kernel's answer: "" or the errno's name.
  std::string write(const std::string& file, const std::string& text) const {
    int fd = ::open((dir + "/" + file).c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return "open: " + std::string(strerrorname_np(errno));
    ssize_t n = ::write(fd, text.data(), text.size());
    int err = errno;
    ::close(fd);
    return n == static_cast<ssize_t>(text.size()) ? ""
                                                  : "write: " + std::string(strerrorname_np(err));
  }
  explicit OwnPidsCgroup(std::string d) : dir(std::move(d)) {}
  OwnPidsCgroup(OwnPidsCgroup&& o) noexcept : dir(std::exchange(o.dir, {})) {}
  OwnPidsCgroup(const OwnPidsCgroup&) = delete;
  ~OwnPidsCgroup() {
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
};

size_t threads_of(pid_t pid) {
  std::string status = read_text_file("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find("Threads:");
  return at == std::string::npos ? 0 : std::stoul(status.substr(at + 8));
}

}  // namespace

// The daemon runs a thread per connection and per call. When the kernel refuses one (a pids
// limit here; RLIMIT_NPROC or a service's TasksMax in life), the call or connection is turned
// away with a message and the daemon serves on; std::thread's exception used to end it.
BOOST_AUTO_TEST_CASE(a_refused_thread_turns_a_call_away_and_the_daemon_serves_on) {
  auto cg = OwnPidsCgroup::make();
  BOOST_REQUIRE_MESSAGE(cg.has_value(), "no pids cgroup to make on this host");
  DaemonProcess d(faults_policy());
  BOOST_REQUIRE(d.alive());
  LineClient c(d);
  BOOST_REQUIRE(c.handshake("threads") && c.initialize());
  // The daemon and its threads (the spawner it started is a process of its own, elsewhere)
  // go into a cgroup with no room for one more.
  BOOST_REQUIRE_EQUAL(cg->write("cgroup.procs", std::to_string(d.pid())), "");
  BOOST_REQUIRE_EQUAL(cg->write("pids.max", std::to_string(threads_of(d.pid()))), "");
  json r = c.call("run_command", {{"argv", {"/bin/echo", "squeezed"}}});
  BOOST_TEST(r["error"]["code"] == -32000, r.dump());
  BOOST_TEST(r["error"]["message"].get<std::string>().find("no thread for this request") !=
                 std::string::npos,
             r.dump());
  LineClient late(d);
  BOOST_TEST(!late.handshake("late"));
  BOOST_TEST(d.alive(), d.death());
  // Room again: the same connection and a new one are served.
  BOOST_REQUIRE_EQUAL(cg->write("pids.max", "max"), "");
  r = c.call("run_command", {{"argv", {"/bin/echo", "roomy"}}});
  BOOST_TEST(r["result"]["structuredContent"]["output"]["stdout"]["content"] == "roomy\n",
             r.dump());
  BOOST_TEST(served(d, "after").has_value());
  BOOST_TEST(d.alive(), d.death());
  d.stop();  // out of the cgroup before it is removed
}

// An engine that cannot have its threads at all (a pids limit of one: the daemon's own task)
// fails to open and the daemon exits 1 saying why. std::thread's exception used to end it
// with SIGABRT from Engine::open.
BOOST_AUTO_TEST_CASE(a_daemon_refused_every_thread_exits_saying_why) {
  auto cg = OwnPidsCgroup::make();
  BOOST_REQUIRE_MESSAGE(cg.has_value(), "no pids cgroup to make on this host");
  BOOST_REQUIRE_EQUAL(cg->write("pids.max", "1"), "");
  DaemonProcess d(faults_policy(), {}, /*start_now=*/false);
  std::vector<std::string> args = {
      cordon_bin(),  "daemon",      "--policy", d.box().base + "/policy.json",
      "--state-dir", d.box().state, "--socket", d.sock()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // LeakSanitizer's exit check needs a thread of its own, which the limit refuses too.
  std::string no_leak_check = "ASAN_OPTIONS=detect_leaks=0";
  std::vector<char*> envp = {no_leak_check.data(), nullptr};
  int logfd = ::open(d.log().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int go[2];
  BOOST_REQUIRE(logfd >= 0 && ::pipe2(go, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    char c;
    if (::read(go[0], &c, 1) != 1 || ::dup2(logfd, 2) < 0) ::_exit(98);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(99);
  }
  ::close(go[0]);
  ::close(logfd);
  BOOST_REQUIRE(pid > 0);
  std::string moved = cg->write("cgroup.procs", std::to_string(pid));
  BOOST_REQUIRE(::write(go[1], "x", 1) == 1);
  ::close(go[1]);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  struct pollfd p = {pidfd, POLLIN, 0};
  bool ended = ::poll(&p, 1, 20000) == 1;
  if (!ended) ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  ::close(pidfd);
  BOOST_REQUIRE_EQUAL(moved, "");
  BOOST_TEST(ended);
  std::string log = d.log_text();
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 1), "wait status " << st << "; log: " << log);
  BOOST_TEST(log.find("cannot start") != std::string::npos, log);
  BOOST_TEST(log.find("thread") != std::string::npos, log);
}
