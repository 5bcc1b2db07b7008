#define BOOST_TEST_MODULE daemon
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "helpers/cordon_fixture.hpp"
#include "helpers/daemon_fixture.hpp"

using namespace cordon::test;

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// Runs `fn` as uid `uid` in a child; returns what it wrote to the pipe.
template <class Fn>
std::string as_uid(uid_t uid, Fn fn) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipefd[0]);
    if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(2);
    std::string r = fn();
    (void)::write(pipefd[1], r.data(), r.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int st = 0;
  ::waitpid(child, &st, 0);
  return got;
}

}  // namespace

BOOST_AUTO_TEST_CASE(socket_is_0600_when_only_root_is_served_and_the_kernel_refuses_others) {
  DaemonProcess d;
  struct stat st {};
  BOOST_REQUIRE(::stat(d.sock().c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 07777) == 0600u);
  std::string got = as_uid(65534, [&] {
    int fd = d.connect_fd();
    return fd < 0 ? std::string("connect: ") + std::strerror(errno) : std::string("connected");
  });
  BOOST_TEST(got == "connect: Permission denied");
}

// Failure fixed (a review, session 13): a daemon started with systemd's default soft fd limit
// (1024) kept it, so ~1000 queued jobs made every start and listing fail with EMFILE. It raises
// the soft limit to the hard one. And a daemon that serves other uids on a socket they cannot
// reach (the default, in the 0700 state dir) said nothing; it warns, naming the directory.
BOOST_AUTO_TEST_CASE(the_daemon_takes_its_whole_fd_limit_and_warns_of_an_unreachable_socket) {
  struct rlimit mine {};
  BOOST_REQUIRE(::getrlimit(RLIMIT_NOFILE, &mine) == 0);
  BOOST_REQUIRE_MESSAGE(mine.rlim_max > 1024, "the hard limit here: " << mine.rlim_max);
  struct rlimit low = {1024, mine.rlim_max};
  BOOST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  DaemonProcess d(json{{"daemon", {{"allowedUids", json::array({65533})}}}}, {}, false);
  d.start({});  // the default socket: <state dir>/daemon.sock, in a 0700 directory
  BOOST_REQUIRE(::setrlimit(RLIMIT_NOFILE, &mine) == 0);
  BOOST_REQUIRE(d.alive());
  std::ifstream limits("/proc/" + std::to_string(d.pid()) + "/limits");
  std::string line, soft, hard;
  while (std::getline(limits, line)) {
    if (line.starts_with("Max open files")) {
      std::istringstream in(line.substr(std::strlen("Max open files")));
      in >> soft >> hard;
    }
  }
  BOOST_TEST(soft == std::to_string(mine.rlim_max));
  BOOST_TEST(hard == std::to_string(mine.rlim_max));
  std::string log = d.log_text();
  BOOST_TEST(log.find("which other users may not search") != std::string::npos, log);
  BOOST_TEST(log.find("open-file limit raised from 1024") != std::string::npos, log);
}

// The socket is bound under a temporary name and renamed into place once it listens: the path
// never names a socket that refuses connections, a stale socket left by a killed daemon is
// replaced, and no temporary name is left behind.
BOOST_AUTO_TEST_CASE(the_socket_path_appears_only_when_it_accepts_and_replaces_a_stale_one) {
  DaemonProcess d(json::object(), {}, /*start_now=*/false);
  {  // a stale socket: bound, never listening, its owner gone
    int stale = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, d.sock().c_str());
    BOOST_REQUIRE(::bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::close(stale);
    BOOST_REQUIRE(d.connect_fd() < 0);
  }
  struct stat before {};
  BOOST_REQUIRE(::stat(d.sock().c_str(), &before) == 0);
  // From the moment the path names a new inode it accepts: every connect to it succeeds.
  // The poller runs while start() forks and waits for the path to name the daemon's socket.
  std::atomic<int> attempts = 0, refused = 0;
  std::atomic<bool> stop = false;
  std::thread poller([&] {
    while (!stop) {
      struct stat st {};
      if (::stat(d.sock().c_str(), &st) == 0 && st.st_ino != before.st_ino) {
        int fd = d.connect_fd();
        ++attempts;
        if (fd < 0) {
          ++refused;
        } else {
          ::close(fd);
          return;
        }
      }
      ::usleep(50);
    }
  });
  d.start({"--socket", d.sock()});
  BOOST_TEST_REQUIRE(d.pid() > 0);
  // start() returned once the path named the new inode; the poller sees it soon after.
  for (int i = 0; i < 2000 && attempts == 0; ++i) ::usleep(1000);
  stop = true;
  poller.join();
  BOOST_TEST(attempts >= 1);
  BOOST_TEST(refused == 0);
  struct stat now {};
  BOOST_REQUIRE(::stat(d.sock().c_str(), &now) == 0);
  BOOST_TEST((now.st_mode & 07777) == 0600u);
  for (const auto& e : std::filesystem::directory_iterator(d.box().base)) {
    BOOST_TEST(e.path().filename().string().find(".tmp") == std::string::npos, e.path());
  }
}

BOOST_AUTO_TEST_CASE(refuses_a_peer_uid_the_policy_does_not_list) {
  DaemonProcess d(json{{"daemon", {{"allowedUids", json::array({65533})}}}});
  struct stat st {};
  BOOST_REQUIRE(::stat(d.sock().c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 07777) == 0666u);  // SO_PEERCRED decides
  std::string got = as_uid(65534, [&] {
    LineClient c(d.connect_fd());
    if (c.fd() < 0) return std::string("connect failed");
    (void)c.send_raw("{\"cordon\":\"connect\",\"session\":\"x\"}\n");
    return c.line().value_or("");
  });
  BOOST_TEST(got.find("\"ok\":false") != std::string::npos, got);
  BOOST_TEST(got.find("uid 65534 may not use this daemon") != std::string::npos, got);
  BOOST_TEST(got.find("daemon.allowedUids") != std::string::npos, got);
  // The CLI sends MCP initialize with the handshake, in one send (session 23): the daemon
  // refuses and closes with those lines unread, and its reason still reaches the user.
  std::string cli = as_uid(65534, [&] {
    auto r =
        run_process({cordon_bin(), "run", "--socket", d.sock(), "--cwd", "/", "--", "/bin/true"});
    return std::to_string(r.exit_code()) + " " + r.err;
  });
  BOOST_TEST(cli.rfind("125 ", 0) == 0, cli);
  BOOST_TEST(cli.find("the daemon refused: uid 65534 may not use this daemon") != std::string::npos,
             cli);
}

// Failure fixed: a connection of a uid the daemon refuses took one of daemon.maxConnections
// (and a thread waiting 10 s for its first line), so a few of them turned every legitimate
// client away; and a full daemon wrote "retry later" and closed without reading the
// handshake, so clients usually saw EPIPE instead of the reason.
BOOST_AUTO_TEST_CASE(refused_uids_take_no_slot_and_a_full_daemon_says_why) {
  DaemonProcess d(json{{"daemon", {{"allowedUids", json::array({65533})}, {"maxConnections", 2}}}});
  int ready[2], hold[2];
  BOOST_REQUIRE(::pipe2(ready, O_CLOEXEC) == 0 && ::pipe2(hold, O_CLOEXEC) == 0);
  pid_t refused = ::fork();
  if (refused == 0) {
    // Twenty connections of uid 65534 that never send a line, held until the test is done.
    ::close(hold[1]);
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      ::_exit(2);
    }
    for (int i = 0; i < 20; ++i) {
      if (d.connect_fd() < 0) ::_exit(3);
    }
    (void)::write(ready[1], "r", 1);
    char c;
    (void)::read(hold[0], &c, 1);  // EOF when the test closes its end
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  char r = 0;
  BOOST_REQUIRE(::read(ready[0], &r, 1) == 1);
  ::close(ready[0]);
  LineClient a(d.connect_fd()), b(d.connect_fd());
  BOOST_TEST(a.handshake("a"));
  BOOST_TEST(b.handshake("b"));
  // Both slots are taken now: the next clients are told why, and exit with their codes.
  for (int i = 0; i < 3; ++i) {
    auto run = run_process({cordon_bin(), "run", "--socket", d.sock(), "--", "/bin/echo", "hi"});
    BOOST_TEST(run.exit_code() == 125, run.err);
    BOOST_TEST(
        run.err.find("the daemon serves 2 connections already; retry later") != std::string::npos,
        run.err);
  }
  auto list = run_process({cordon_bin(), "list", "--socket", d.sock(), "--session", "c"});
  BOOST_TEST(list.exit_code() == 3, list.err);
  BOOST_TEST(list.err.find("retry later") != std::string::npos, list.err);
  ::close(hold[1]);
  int st = 0;
  ::waitpid(refused, &st, 0);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
}

// Failure fixed (a review, session 13): one allowed uid's idle connections (a ping an hour
// keeps each open) took all of daemon.maxConnections, and root and every other uid got "retry
// later". Now one uid holds at most daemon.maxConnectionsPerUid, and the other uids together
// never the last slot, which is kept for root.
BOOST_AUTO_TEST_CASE(one_uid_cannot_take_every_connection_and_root_keeps_the_last) {
  DaemonProcess d(json{{"daemon",
                        {{"allowedUids", json::array({65533, 65532})},
                         {"maxConnections", 4},
                         {"maxConnectionsPerUid", 2}}}});
  int ready[2], hold[2];
  BOOST_REQUIRE(::pipe2(ready, O_CLOEXEC) == 0 && ::pipe2(hold, O_CLOEXEC) == 0);
  pid_t holder = ::fork();
  if (holder == 0) {
    ::close(hold[1]);
    if (::setresgid(65533, 65533, 65533) != 0 || ::setresuid(65533, 65533, 65533) != 0) {
      ::_exit(2);
    }
    LineClient a(d.connect_fd()), b(d.connect_fd()), c(d.connect_fd());
    std::string said =
        std::string(a.handshake("a") ? "a " : "- ") + (b.handshake("b") ? "b " : "- ");
    c.send({{"cordon", "connect"}, {"session", "c"}});
    said += c.line().value_or("(nothing)");
    (void)::write(ready[1], said.data(), said.size());
    ::close(ready[1]);
    char x;
    (void)::read(hold[0], &x, 1);  // holds a and b until the test closes its end
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  std::string first;
  char buf[4096];
  for (ssize_t n; (n = ::read(ready[0], buf, sizeof buf)) > 0;) {
    first.append(buf, static_cast<size_t>(n));
  }
  ::close(ready[0]);
  BOOST_TEST(first.starts_with("a b {\"error\""), first);
  BOOST_TEST(first.find("uid 65533 holds 2 connections") != std::string::npos, first);
  BOOST_TEST(first.find("daemon.maxConnectionsPerUid") != std::string::npos, first);
  // Two of four slots taken: another uid gets the third, not the fourth.
  std::string second = as_uid(65532, [&] {
    LineClient e(d.connect_fd()), f(d.connect_fd());
    std::string said = e.handshake("e") ? "e " : "- ";
    f.send({{"cordon", "connect"}, {"session", "f"}});
    return said + f.line().value_or("(nothing)");
  });
  BOOST_TEST(second.starts_with("e {\"error\""), second);
  BOOST_TEST(second.find("keeps the last of its 4 for root") != std::string::npos, second);
  // Root gets it.
  LineClient r(d.connect_fd());
  BOOST_TEST(r.handshake("r"));
  ::close(hold[1]);
  int st = 0;
  ::waitpid(holder, &st, 0);
  BOOST_TEST((WIFEXITED(st) && WEXITSTATUS(st) == 0));
}

BOOST_AUTO_TEST_CASE(sessions_are_per_uid_and_a_named_one_survives_a_reconnect) {
  DaemonProcess d(json{{"daemon", {{"allowedUids", json::array({65533})}}}});
  std::string id;
  {
    LineClient root(d.connect_fd());
    BOOST_REQUIRE(root.handshake("shared"));
    BOOST_REQUIRE(root.initialize());
    json r = root.call_content("run_command_bg", {{"argv", {"/bin/sleep", "60"}}});
    id = r.value("taskId", "");
    BOOST_REQUIRE_MESSAGE(!id.empty(), r.dump());
  }
  // Another uid naming the same session is in its own `u65533-shared`: none of root's jobs.
  std::string other = as_uid(65533, [&] {
    LineClient c(d.connect_fd());
    if (!c.handshake("shared") || !c.initialize()) return std::string("no session");
    json listed = c.call_content("command_list", json::object());
    json status = c.call_content("command_status", {{"taskId", id}});
    return listed.dump() + "\n" + status.dump();
  });
  BOOST_TEST(other.find("\"jobs\":[]") != std::string::npos, other);
  BOOST_TEST(other.find("\"error\"") != std::string::npos, other);  // root's id is unknown here
  // Root reconnects to its named session: the job is still there and still running.
  LineClient again(d.connect_fd());
  BOOST_REQUIRE(again.handshake("shared"));
  BOOST_REQUIRE(again.initialize());
  json status = again.call_content("command_status", {{"taskId", id}});
  BOOST_TEST(status.value("state", "") == "running", status.dump());
  json killed = again.call_content("command_kill", {{"taskId", id}});
  BOOST_TEST(killed.value("state", "") == "killed", killed.dump());
}

// docs/security.md: one uid never reaches another's jobs. Another uid, knowing root's task ids
// and artifact id (ids are time-based, so they must not be a capability), tries every tool
// and the MCP tasks and resources methods on them: each is answered as an unknown id, nothing
// of root's output comes back, and root's running job runs on. (Found untested by a review,
// session 13: only command_list and command_status were tried across uids.)
BOOST_AUTO_TEST_CASE(another_uid_can_reach_none_of_a_sessions_jobs) {
  DaemonProcess d(json{{"daemon", {{"allowedUids", json::array({65533})}}}});
  LineClient root(d.connect_fd());
  BOOST_REQUIRE(root.handshake("work"));
  json init = {{"protocolVersion", "2025-11-25"},
               {"capabilities", json::object()},
               {"clientInfo", {{"name", "root"}, {"version", "1"}}}};
  BOOST_REQUIRE(root.request("initialize", init).contains("result"));
  json done = root.call_content("run_command", {{"argv", {"/bin/echo", "root-secret"}}});
  const std::string done_id = done.value("taskId", "");
  BOOST_REQUIRE_MESSAGE(!done_id.empty(), done.dump());
  const std::string artifact = done["stdoutArtifact"].value("artifactId", "");
  BOOST_REQUIRE(!artifact.empty());
  json bg =
      root.call_content("run_command_bg", {{"argv", {"/bin/sleep", "60"}}, {"stdin", "pipe"}});
  const std::string live_id = bg.value("taskId", "");
  BOOST_REQUIRE_MESSAGE(!live_id.empty(), bg.dump());

  std::string other = as_uid(65533, [&] {
    std::string out;
    for (const std::string session : {"work", ""}) {  // the same name, and unnamed
      LineClient c(d.connect_fd());
      if (!(session.empty() ? c.handshake(std::nullopt) : c.handshake(session)) ||
          !c.request("initialize", init).contains("result")) {
        return std::string("no session");
      }
      auto tool = [&](const std::string& name, const json& args) {
        json r = c.call(name, args);
        out += name + " " + r.dump() + "\n";
      };
      tool("command_status", {{"taskId", done_id}});
      tool("command_output", {{"taskId", done_id}});
      tool("retrieve_context", {{"artifactId", artifact}});
      tool("command_wait", {{"taskIds", {live_id}}, {"timeoutMs", 100}});
      tool("command_write", {{"taskId", live_id}, {"data", "x"}});
      tool("command_kill", {{"taskId", live_id}, {"signal", "SIGKILL"}});
      tool("command_remove", {{"taskId", done_id}});
      for (const char* m : {"tasks/get", "tasks/result", "tasks/cancel"}) {
        out += std::string(m) + " " + c.request(m, {{"taskId", live_id}}).dump() + "\n";
      }
      std::string uri = "cordon://jobs/" + done_id;
      out += "resources/read " + c.request("resources/read", {{"uri", uri}}).dump() + "\n";
      out +=
          "resources/subscribe " + c.request("resources/subscribe", {{"uri", uri}}).dump() + "\n";
      out += "tasks/list " + c.request("tasks/list", json::object()).dump() + "\n";
      out += "command_list " + c.call("command_list", json::object()).dump() + "\n";
    }
    return out;
  });
  BOOST_TEST_MESSAGE(other);
  BOOST_TEST(other.find("root-secret") == std::string::npos, other);
  std::istringstream lines(other);
  size_t answered = 0;
  for (std::string line; std::getline(lines, line);) {
    ++answered;
    std::string what = line.substr(0, line.find(' '));
    if (what == "tasks/list") {
      BOOST_TEST(line.find("\"tasks\":[]") != std::string::npos, line);
    } else if (what == "command_list") {
      BOOST_TEST(line.find("\"jobs\":[]") != std::string::npos, line);
    } else if (what.starts_with("tasks/") || what.starts_with("resources/")) {
      BOOST_TEST((line.find("\"code\":-32602") != std::string::npos ||
                  line.find("\"code\":-32002") != std::string::npos),
                 line);
    } else {
      BOOST_TEST(line.find("\"isError\":true") != std::string::npos, line);
      BOOST_TEST((line.find("not-found") != std::string::npos), line);
    }
  }
  BOOST_TEST(answered == 28u);  // 14 attempts from each of the two sessions
  // Root's jobs are as they were: the running one runs, the settled one is whole.
  BOOST_TEST(root.call_content("command_status", {{"taskId", live_id}}).value("state", "") ==
             "running");
  json out = root.call_content("command_output", {{"taskId", done_id}});
  BOOST_TEST(out.value("content", "") == "root-secret\n", out.dump());
  BOOST_TEST(root.call_content("command_kill", {{"taskId", live_id}}).value("state", "") ==
             "killed");
}

// Failure fixed (a review, session 13): one uid's sessions (one per connection) filled
// concurrency.total and another uid's command queued behind all of them. With
// concurrency.perUid the hog's jobs past the bound wait, and another uid's start runs at once.
BOOST_AUTO_TEST_CASE(concurrency_per_uid_keeps_slots_for_other_uids) {
  DaemonProcess d(json{{"daemon", {{"allowedUids", json::array({65533})}}},
                       {"concurrency", {{"total", 3}, {"perSession", 2}, {"perUid", 2}}}});
  const std::string secs = std::to_string(60 + ::getpid() % 1000);
  std::string hog = as_uid(65533, [&] {
    std::string out;
    for (const char* name : {"s1", "s2"}) {
      LineClient c(d.connect_fd());
      if (!c.handshake(name) || !c.initialize()) return std::string("no session");
      for (int i = 0; i < 2; ++i) {
        json r = c.call_content("run_command_bg", {{"argv", {"/bin/sleep", secs}}});
        out += r.value("taskId", "?") + " " + r.value("state", "?") + "\n";
      }
    }
    return out;
  });
  // Four starts, two run (the uid's bound), two wait although `total` has a slot free.
  BOOST_TEST(std::count(hog.begin(), hog.end(), '\n') == 4, hog);
  size_t running = 0, queued = 0;
  for (size_t at = hog.find(" running"); at != std::string::npos; at = hog.find(" running", at + 1))
    ++running;
  for (size_t at = hog.find(" queued"); at != std::string::npos; at = hog.find(" queued", at + 1))
    ++queued;
  BOOST_TEST(running == 2u, hog);
  BOOST_TEST(queued == 2u, hog);
  // Root's command takes the free slot at once.
  LineClient root(d.connect_fd());
  BOOST_REQUIRE(root.handshake("root"));
  BOOST_REQUIRE(root.initialize());
  json r = root.call_content("run_command", {{"argv", {"/bin/echo", "mine"}}, {"yieldMs", 10000}});
  BOOST_TEST(r.value("state", "") == "exited", r.dump());
  // The hog's jobs end (killed by their owner).
  std::string killed = as_uid(65533, [&] {
    std::string out;
    std::istringstream lines(hog);
    for (const char* name : {"s1", "s2"}) {
      LineClient c(d.connect_fd());
      if (!c.handshake(name) || !c.initialize()) return std::string("no session");
      for (int i = 0; i < 2; ++i) {
        std::string id, state;
        lines >> id >> state;
        out += c.call_content("command_kill", {{"taskId", id}, {"signal", "SIGKILL"}})
                   .value("state", "?") +
               " ";
      }
    }
    return out;
  });
  BOOST_TEST(killed == "killed killed killed killed ", killed);
}

// quotas.maxJobsPerUid and maxDiskBytesPerUid: one uid's jobs, over all its sessions, stop at
// its own bounds while another uid still starts. Failure fixed (a known limit until session
// 15): quotas.maxJobs and maxDiskBytes were shared by every uid, so one uid could fill them and
// have every other uid's start refused until it removed its jobs.
BOOST_AUTO_TEST_CASE(quotas_per_uid_keep_room_for_other_uids) {
  DaemonProcess d(
      json{{"allowedExecutables", {"/bin/echo", "/bin/sleep", "/usr/bin/head"}},
           {"daemon", {{"allowedUids", json::array({65533})}}},
           {"quotas", {{"maxJobs", 10}, {"maxJobsPerUid", 2}, {"maxDiskBytesPerUid", 1048576}}}});
  auto text_of = [](const json& r) {
    return r.is_object() && r.contains("result") ? r["result"].dump() : r.dump();
  };
  // The uid: one job in each of two sessions, the second writing 1.1 MB; a third start is
  // refused for the job count, and after one removal still for the bytes.
  std::string hog = as_uid(65533, [&] {
    std::string out;
    LineClient a(d.connect_fd()), b(d.connect_fd());
    if (!a.handshake("a") || !a.initialize() || !b.handshake("b") || !b.initialize())
      return std::string("no session");
    json one = a.call_content("run_command", {{"argv", {"/bin/echo", "one"}}, {"yieldMs", 20000}});
    json big = b.call_content(
        "run_command",
        {{"argv", {"/usr/bin/head", "-c", "1100000", "/dev/zero"}}, {"yieldMs", 20000}});
    out += one.value("state", "?") + " " + big.value("state", "?") + "\n";
    out += text_of(a.call("run_command", {{"argv", {"/bin/echo", "three"}}})) + "\n";
    json rm = a.call_content("command_remove", {{"taskId", one.value("taskId", "")}});
    out += "removed " + rm.dump() + "\n";
    out += text_of(a.call("run_command", {{"argv", {"/bin/echo", "three"}}})) + "\n";
    b.call_content("command_remove", {{"taskId", big.value("taskId", "")}});
    out += a.call_content("run_command", {{"argv", {"/bin/echo", "four"}}, {"yieldMs", 20000}})
               .value("state", "?") +
           "\n";
    return out;
  });
  std::istringstream lines(hog);
  std::string first, by_count, removed, by_bytes, after;
  std::getline(lines, first);
  std::getline(lines, by_count);
  std::getline(lines, removed);
  std::getline(lines, by_bytes);
  std::getline(lines, after);
  BOOST_TEST(first == "exited exited", hog);
  BOOST_TEST(by_count.find("\"isError\":true") != std::string::npos, by_count);
  BOOST_TEST(by_count.find("the job quota of `u65533` (2 jobs over all its sessions, "
                           "quotas.maxJobsPerUid) is reached") != std::string::npos,
             by_count);
  BOOST_TEST(by_bytes.find("\"isError\":true") != std::string::npos, by_bytes);
  BOOST_TEST(by_bytes.find("the disk quota of `u65533` (1048576 bytes of logs over all its "
                           "sessions, quotas.maxDiskBytesPerUid) is reached") != std::string::npos,
             by_bytes);
  BOOST_TEST(after == "exited", hog);
  // Root, a uid like any other here, starts its own two while the uid is at its bound (the
  // engine-wide maxJobs 10 is far from reached); its third is refused as the uid's was.
  LineClient root(d.connect_fd());
  BOOST_REQUIRE(root.handshake("root"));
  BOOST_REQUIRE(root.initialize());
  for (int i = 0; i < 2; ++i) {
    json r =
        root.call_content("run_command", {{"argv", {"/bin/echo", "mine"}}, {"yieldMs", 20000}});
    BOOST_TEST(r.value("state", "") == "exited", r.dump());
  }
  std::string third = text_of(root.call("run_command", {{"argv", {"/bin/echo", "mine"}}}));
  BOOST_TEST(third.find("the job quota of `u0` (2 jobs") != std::string::npos, third);
  root.close();
  // The counts are rebuilt from the state dir by the next daemon.
  BOOST_REQUIRE(::kill(d.pid(), SIGKILL) == 0);
  BOOST_REQUIRE(d.exited_within(std::chrono::seconds(10)));
  d.start({"--socket", d.sock()});
  BOOST_REQUIRE_MESSAGE(d.alive(), d.death());
  LineClient again(d.connect_fd());
  BOOST_REQUIRE(again.handshake("root"));
  BOOST_REQUIRE(again.initialize());
  std::string after_restart = text_of(again.call("run_command", {{"argv", {"/bin/echo", "m"}}}));
  BOOST_TEST(after_restart.find("the job quota of `u0` (2 jobs") != std::string::npos,
             after_restart);
}

// Failure fixed (a review, session 13): the ended session's records stayed, in a session no
// client can name again, counted against the policy's job quota (maxJobs 5: three jobs of a
// uid that left made another uid's starts fail with "remove settled jobs", which it could not).
// The unnamed sessions of a daemon that was SIGKILLed never saw their connections end: the
// next daemon on the state dir ends them at its start (their jobs were abandoned by recovery).
// Failure fixed (a review, session 14): their records stayed, in sessions no client can name,
// counted against quotas.maxJobs: after the restart every start was refused.
BOOST_AUTO_TEST_CASE(unnamed_sessions_of_a_killed_daemon_end_at_the_next_start) {
  DaemonProcess d(json{{"quotas", {{"maxJobs", 2}}}});
  std::vector<std::string> ids;
  {
    LineClient c(d.connect_fd());
    BOOST_REQUIRE(c.initialize());
    for (int i = 0; i < 2; ++i) {
      json r = c.call_content("run_command_bg", {{"argv", {"/bin/sleep", "1000"}}});
      ids.push_back(r.value("taskId", ""));
      BOOST_REQUIRE_MESSAGE(!ids.back().empty(), r.dump());
    }
    BOOST_REQUIRE(::kill(d.pid(), SIGKILL) == 0);
    BOOST_REQUIRE(d.exited_within(std::chrono::seconds(10)));
  }
  // A named session's jobs stay across the restart: the control.
  d.start({"--socket", d.sock()});
  BOOST_REQUIRE_MESSAGE(d.alive(), d.death());
  namespace fs = std::filesystem;
  // The daemon ends them before it serves anyone (a client that connects meanwhile waits in
  // the listen backlog); the test reads the log for when.
  const std::string ended = "of the last run ended: 2 jobs removed";
  for (int i = 0; i < 2000 && d.log_text().find(ended) == std::string::npos; ++i) {
    ::usleep(10000);  // bounded: 20 s
  }
  BOOST_TEST(d.log_text().find(ended) != std::string::npos, d.log_text());
  for (const auto& id : ids) {
    BOOST_TEST(!fs::exists(d.box().state + "/jobs/" + id), id);
  }
  // The control: a named session whose name holds `.conn-` too is no unnamed one.
  LineClient next(d.connect_fd());
  BOOST_REQUIRE(next.handshake("ci.conn-0123456789abcdef"));
  BOOST_REQUIRE(next.initialize());
  std::string kept;
  for (int i = 0; i < 2; ++i) {
    json r = next.call_content("run_command", {{"argv", {"/bin/echo", "again"}}});
    BOOST_TEST(r.value("state", "") == "exited", r.dump());
    kept = r.value("taskId", "");
  }
  next.close();
  d.start({"--socket", d.sock()});  // a named session is no unnamed one: its jobs stay
  BOOST_REQUIRE_MESSAGE(d.alive(), d.death());
  LineClient again(d.connect_fd());  // served only once the start's cleanup is done
  BOOST_REQUIRE(again.handshake("ci.conn-0123456789abcdef"));
  BOOST_REQUIRE(again.initialize());
  json status = again.call_content("command_status", {{"taskId", kept}});
  BOOST_TEST(status.value("state", "") == "exited", status.dump());
  BOOST_TEST(fs::exists(d.box().state + "/jobs/" + kept), kept);
}

BOOST_AUTO_TEST_CASE(an_unnamed_session_ends_with_its_connection) {
  DaemonProcess d(json{{"quotas", {{"maxJobs", 5}}}});
  std::vector<std::string> ids;
  const std::string secs = std::to_string(60 + ::getpid() % 1000);
  {
    // No handshake: the client speaks JSON-RPC at once and gets a session of its own.
    LineClient c(d.connect_fd());
    BOOST_REQUIRE(c.initialize());
    json done = c.call_content("run_command", {{"argv", {"/bin/echo", "settled"}}});
    ids.push_back(done.value("taskId", ""));
    for (int i = 0; i < 3; ++i) {
      json r = c.call_content("run_command_bg", {{"argv", {"/bin/sleep", secs}}});
      ids.push_back(r.value("taskId", ""));
      BOOST_REQUIRE_MESSAGE(!ids.back().empty(), r.dump());
      BOOST_TEST(c.call_content("command_status", {{"taskId", ids.back()}}).value("state", "") ==
                 "running");
    }
  }
  // Its jobs are killed (all at once) when the connection closes, and then every record of
  // the session goes: the job directories and the session's index.
  namespace fs = std::filesystem;
  auto left = [&] {
    size_t n = 0;
    std::error_code ec;
    for (const auto& id : ids) n += fs::exists(d.box().state + "/jobs/" + id, ec) ? 1 : 0;
    for (const auto& e : fs::directory_iterator(d.box().state + "/sessions", ec)) {
      (void)e;
      ++n;
    }
    return n;
  };
  for (int i = 0; i < 2000 && left() != 0; ++i) ::usleep(10000);  // bounded: 20 s
  BOOST_TEST(left() == 0u);
  // Nothing of them runs, and the quota is whole for the next client: five starts go.
  BOOST_TEST(run_process({"/usr/bin/pgrep", "-f", "-x", "/bin/sleep " + secs}).out == "");
  LineClient next(d.connect_fd());
  BOOST_REQUIRE(next.handshake("next"));
  BOOST_REQUIRE(next.initialize());
  for (int i = 0; i < 5; ++i) {
    json r = next.call_content("run_command", {{"argv", {"/bin/echo", "again"}}});
    BOOST_TEST(r.value("state", "") == "exited", r.dump());
  }
}

BOOST_AUTO_TEST_CASE(two_clients_are_served_at_once) {
  DaemonProcess d;
  LineClient a(d.connect_fd()), b(d.connect_fd());
  BOOST_REQUIRE(a.handshake("a"));
  BOOST_REQUIRE(b.handshake("b"));
  BOOST_REQUIRE(a.initialize());
  BOOST_REQUIRE(b.initialize());
  // a waits on a long command; b is answered meanwhile.
  json started = a.call_content("run_command_bg", {{"argv", {"/bin/sleep", "60"}}});
  std::string id = started.value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  a.send({{"jsonrpc", "2.0"},
          {"id", 99},
          {"method", "tools/call"},
          {"params",
           {{"name", "command_status"}, {"arguments", {{"taskId", id}, {"waitMs", 30000}}}}}});
  // b's call has a 20 s deadline; a's wait lasts 30 s: b is not queued behind a.
  json echoed = b.call_content("run_command", {{"argv", {"/bin/echo", "b here"}}});
  BOOST_TEST(echoed.value("state", "") == "exited", echoed.dump());
  BOOST_TEST(b.call_content("command_status", {{"taskId", id}}).contains("error"));  // not b's job
  BOOST_TEST(a.call_content("command_kill", {{"taskId", id}}).value("state", "") == "killed");
}

BOOST_AUTO_TEST_CASE(an_oversized_line_is_answered_and_the_connection_keeps_serving) {
  DaemonProcess d;
  LineClient c(d.connect_fd());
  BOOST_REQUIRE(c.handshake("big"));
  BOOST_REQUIRE(c.initialize());
  std::string big(20u << 20, 'x');  // 20 MiB, over the 16 MiB bound
  BOOST_REQUIRE(c.send_raw(big + "\n"));
  auto l = c.line();
  BOOST_REQUIRE(l.has_value());
  json e = json::parse(*l, nullptr, false);
  BOOST_TEST(e.value("error", json::object()).value("code", 0) == -32600, *l);
  BOOST_TEST(c.call_content("command_list", json::object()).contains("jobs"));
}

BOOST_AUTO_TEST_CASE(a_stalled_line_and_an_idle_client_are_closed_by_the_policy_limits) {
  // The idle limit leaves room for a loaded sanitizer build between busy's own requests (at
  // 600 ms its initialize was once refused as idle); the 3 s call below still outlives it.
  DaemonProcess d(json{{"daemon", {{"stallTimeoutMs", 300}, {"idleTimeoutMs", 1500}}}});
  LineClient stalled(d.connect_fd()), idle(d.connect_fd()), busy(d.connect_fd());
  BOOST_REQUIRE(busy.handshake("b"));
  BOOST_REQUIRE(busy.initialize());
  BOOST_REQUIRE(stalled.handshake("s"));
  BOOST_REQUIRE(idle.handshake("i"));
  stalled.send_raw("{\"jsonrpc\":\"2.0\",");  // half a request, then nothing
  // A call in flight is not idleness: a 3 s wait outlives the idle timeout and is answered.
  json started = busy.call_content("run_command_bg", {{"argv", {"/bin/sleep", "3"}}});
  std::string id = started.value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  json waited = busy.request("tools/call", {{"name", "command_status"},
                                            {"arguments", {{"taskId", id}, {"waitMs", 10000}}}});
  BOOST_TEST(waited["result"]["structuredContent"].value("state", "") == "exited", waited.dump());
  BOOST_TEST(stalled.closed_within(5s));
  BOOST_TEST(idle.closed_within(5s));
  BOOST_TEST(d.log_text().find("stalled for 300 ms") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_a_socket_directory_others_can_write) {
  DaemonProcess d(json::object(), {}, /*start_now=*/false);
  std::string dir = d.box().base + "/open";
  BOOST_REQUIRE(::mkdir(dir.c_str(), 0777) == 0);
  BOOST_REQUIRE(::chmod(dir.c_str(), 01777) == 0);
  d.start({"--socket", dir + "/d.sock"});
  BOOST_TEST(d.pid() == -1);  // it exited
  std::string log = d.log_text();
  BOOST_TEST(log.find("can be written by others") != std::string::npos, log);
  BOOST_TEST(!std::filesystem::exists(dir + "/d.sock"));
}

// Failure fixed: only the socket's final directory was checked, through a path open()
// followed. A symlink another uid owns in a sticky world-writable directory, pointing at a
// root-owned 0755 directory, was accepted; re-pointed later to that uid's own directory (with a
// socket of its own), it took the next client's argv and env. Now every directory from / down
// is walked without following symlinks and must be changeable only by root or cordon's uid.
BOOST_AUTO_TEST_CASE(refuses_a_socket_path_through_a_symlink_another_uid_owns) {
  DaemonProcess d(json::object(), {}, /*start_now=*/false);
  const std::string sticky = d.box().base + "/sticky", target = d.box().base + "/target";
  BOOST_REQUIRE(::mkdir(sticky.c_str(), 0777) == 0 && ::chmod(sticky.c_str(), 01777) == 0);
  BOOST_REQUIRE(::mkdir(target.c_str(), 0755) == 0);
  const std::string link = sticky + "/link";
  BOOST_REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  BOOST_REQUIRE(::lchown(link.c_str(), 4242, 4242) == 0);
  d.start({"--socket", link + "/d.sock"});
  BOOST_TEST(d.pid() == -1);  // it exited
  std::string log = d.log_text();
  BOOST_TEST(log.find("`" + link + "` on the socket's path is a symlink (owner uid 4242)") !=
                 std::string::npos,
             log);
  BOOST_TEST(log.find("/run/cordon") != std::string::npos, log);
  BOOST_TEST(!std::filesystem::exists(target + "/d.sock"));
  // A directory of root's in the same sticky directory is fine: others cannot rename it.
  const std::string mine = sticky + "/mine";
  BOOST_REQUIRE(::mkdir(mine.c_str(), 0755) == 0);
  d.start({"--socket", mine + "/d.sock"});
  BOOST_TEST_REQUIRE(d.pid() > 0, d.log_text());
  LineClient c(connect_unix(mine + "/d.sock"));
  BOOST_TEST(c.handshake("ok"));
}

// Failure fixed: `open/sub/d.sock` with `open` 0777 (not sticky) was accepted, and any uid
// could rename `sub` away and put its own directory (and socket) in its place.
BOOST_AUTO_TEST_CASE(refuses_a_socket_path_through_a_directory_others_can_write) {
  DaemonProcess d(json::object(), {}, /*start_now=*/false);
  const std::string open = d.box().base + "/open", sub = open + "/sub";
  BOOST_REQUIRE(::mkdir(open.c_str(), 0777) == 0 && ::chmod(open.c_str(), 0777) == 0);
  BOOST_REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
  d.start({"--socket", sub + "/d.sock"});
  BOOST_TEST(d.pid() == -1);
  std::string log = d.log_text();
  BOOST_TEST(log.find("the directory `" + open +
                      "` (owner uid 0, mode 777) can be written by "
                      "others") != std::string::npos,
             log);
  BOOST_TEST(!std::filesystem::exists(sub + "/d.sock"));
}

// Failure fixed: a client sent its handshake, then argv and env, to whatever listened on the
// path. Now it checks the peer's uid (SO_PEERCRED) first: a "daemon" run by a uid that is
// neither root nor the client's own gets nothing.
BOOST_AUTO_TEST_CASE(a_client_refuses_a_daemon_run_by_another_uid_and_sends_it_nothing) {
  Sandbox box;
  const std::string dir = box.base + "/fake", path = dir + "/d.sock";
  BOOST_REQUIRE(::mkdir(dir.c_str(), 0755) == 0 && ::chown(dir.c_str(), 4242, 4242) == 0);
  int ready[2], result[2];
  BOOST_REQUIRE(::pipe2(ready, O_CLOEXEC) == 0 && ::pipe2(result, O_CLOEXEC) == 0);
  pid_t fake = ::fork();
  if (fake == 0) {
    // A fake daemon of uid 4242: answers the handshake and every request, records all it got.
    if (::setresgid(4242, 4242, 4242) != 0 || ::setresuid(4242, 4242, 4242) != 0) ::_exit(2);
    int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(l, 4) != 0) {
      ::_exit(3);
    }
    (void)::write(ready[1], "r", 1);
    LineClient c(::accept(l, nullptr, nullptr));
    std::string got;
    while (auto line = c.line(5s)) {
      got += *line + "\n";
      json m = json::parse(*line, nullptr, false);
      if (m.is_object() && m.contains("cordon")) {
        c.send({{"ok", true}, {"session", "u0.conn-fake"}});
      } else if (m.is_object() && m.contains("id")) {
        c.send({{"jsonrpc", "2.0"}, {"id", m["id"]}, {"result", json::object()}});
      }
    }
    (void)::write(result[1], got.data(), got.size());
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(result[1]);
  char r = 0;
  BOOST_REQUIRE(::read(ready[0], &r, 1) == 1);
  ProcessOptions env;
  env.env = std::vector<std::string>{"SECRET=hunter2", "PATH=/usr/bin:/bin"};
  auto run = run_process(
      {cordon_bin(), "run", "--socket", path, "--pass-env", "SECRET", "--", "/bin/echo", "hi"},
      env);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(result[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(ready[0]);
  ::close(result[0]);
  int st = 0;
  ::waitpid(fake, &st, 0);
  BOOST_TEST(run.exit_code() == 125, run.err);
  BOOST_TEST(run.err.find("is served by uid 4242") != std::string::npos, run.err);
  BOOST_TEST(run.err.find("nothing was sent") != std::string::npos, run.err);
  BOOST_TEST(got.empty(), got);
  BOOST_TEST(got.find("hunter2") == std::string::npos);
}

// Failure fixed: a socket in the policy's working root passed the directory check (the
// idmapped sandbox is not "others"), and a job could unlink it and bind its own, so the next
// client talked to the job. Refused at start-up, the socket removed again.
BOOST_AUTO_TEST_CASE(refuses_a_socket_inside_the_working_root) {
  DaemonProcess d(json::object(), {}, /*start_now=*/false);
  const std::string root = d.box().root;
  for (const std::string& sock : {root + "/d.sock", root + "/run/d.sock"}) {
    d.start({"--socket", sock});
    BOOST_TEST(d.exited_within(30s), sock);  // the socket may appear before the refusal
    std::string log = d.log_text();
    BOOST_TEST(log.find("cwdRoot `" + root + "` contains the daemon's socket directory") !=
                   std::string::npos,
               log);
    BOOST_TEST(log.find("Put --socket outside every directory jobs can write") != std::string::npos,
               log);
    BOOST_TEST(!std::filesystem::exists(sock), sock);
  }
}

BOOST_AUTO_TEST_CASE(serves_a_systemd_activated_socket) {
  DaemonProcess d(json::object(), {}, /*start_now=*/false);
  int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, d.sock().c_str());
  BOOST_REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  BOOST_REQUIRE(::listen(l, 8) == 0);
  d.start({}, l);
  ::close(l);
  BOOST_REQUIRE_MESSAGE(d.pid() > 0, d.log_text());
  {
    LineClient c(d.connect_fd());
    BOOST_REQUIRE(c.handshake("act"));
    BOOST_REQUIRE(c.initialize());
    json r = c.call_content("run_command", {{"argv", {"/bin/echo", "activated"}}});
    BOOST_TEST(r.value("state", "") == "exited", r.dump());
  }
  d.stop();
  BOOST_TEST(std::filesystem::exists(d.sock()));  // systemd's socket: not the daemon's to remove
}

BOOST_AUTO_TEST_CASE(a_stalled_half_handshake_does_not_block_other_clients) {
  DaemonProcess d;
  LineClient stalled(d.connect_fd());
  BOOST_REQUIRE(stalled.fd() >= 0);
  (void)stalled.send_raw("{\"cordon\":");  // half a line, then nothing
  LineClient c(d.connect_fd());
  BOOST_REQUIRE(c.fd() >= 0);
  (void)c.send_raw("{\"cordon\":\"connect\",\"session\":\"ok\"}\n");
  std::string r = c.line().value_or("");
  BOOST_TEST(r.find("\"ok\":true") != std::string::npos, r);
  BOOST_TEST(r.find("\"session\":\"u0-ok\"") != std::string::npos, r);
}

BOOST_AUTO_TEST_CASE(a_bad_session_name_is_refused_with_the_handshake_format) {
  DaemonProcess d;
  // The refusal states the whole rule, the leading dot included (it did not, session 35).
  for (const char* name : {"../x", ".x"}) {
    LineClient c(d.connect_fd());
    BOOST_REQUIRE(c.fd() >= 0);
    (void)c.send_raw(std::string("{\"cordon\":\"connect\",\"session\":\"") + name + "\"}\n");
    std::string r = c.line().value_or("");
    BOOST_TEST(r.find("\"ok\":false") != std::string::npos, r);
    BOOST_TEST(r.find("first line must be") != std::string::npos, r);
    BOOST_TEST(r.find("not starting with `.`") != std::string::npos, r);
  }
}

// A handshake naming its session twice is refused, not read as the last name: a proxy in
// front of the daemon may have read the first (it was taken, session 35's review).
BOOST_AUTO_TEST_CASE(a_handshake_with_a_key_twice_is_refused) {
  DaemonProcess d;
  LineClient c(d.connect_fd());
  BOOST_REQUIRE(c.fd() >= 0);
  (void)c.send_raw("{\"cordon\":\"connect\",\"session\":\"a\",\"session\":\"b\"}\n");
  std::string r = c.line().value_or("");
  BOOST_TEST(r.find("\"ok\":false") != std::string::npos, r);
  BOOST_TEST(r.find("the key `session` appears twice") != std::string::npos, r);
  BOOST_TEST(r.find("u0-b") == std::string::npos, r);
  // A correct handshake still works, on a connection of its own.
  LineClient after(d.connect_fd());
  BOOST_REQUIRE(after.handshake("b"));
  BOOST_REQUIRE(after.initialize());
  json ran = after.call_content("run_command", {{"argv", {"/bin/echo", "served"}}});
  BOOST_TEST(ran.value("state", "") == "exited", ran.dump());
}

// `cordon output TASK` prints the whole log there is, page after page, like cat; with
// --limit, the one page and, on stderr, where the next starts. Before (a red-team review,
// session 39): `cordon output T > log` kept the first 50000 characters of a 240000-byte log,
// exit 0 and nothing said.
BOOST_AUTO_TEST_CASE(cordon_output_prints_every_page_unless_given_a_limit) {
  DaemonProcess d(json{{"allowedExecutables", {"/usr/bin/seq"}}});
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "o"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--", "/usr/bin/seq", "1", "40000"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  const std::string id = nlohmann::json::parse(started.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(cli({"wait", id}).exit_code() == 0);
  std::string want;
  for (int i = 1; i <= 40000; ++i) want += std::to_string(i) + "\n";
  BOOST_REQUIRE(want.size() > 200000u);  // four pages and more of the default 50000
  for (const char* unit : {"chars", "bytes", "lines"}) {
    BOOST_TEST_CONTEXT(unit) {
      auto all = cli({"output", id, "--unit", unit});
      BOOST_TEST(all.exit_code() == 0, all.err);
      BOOST_TEST((all.out == want));
      BOOST_TEST(all.err.empty(), all.err);
    }
  }
  auto from = cli({"output", id, "--offset", "228864"});  // the last 5 lines
  BOOST_TEST(from.out == "39996\n39997\n39998\n39999\n40000\n");
  auto one = cli({"output", id, "--limit", "6"});
  BOOST_TEST(one.exit_code() == 0, one.err);
  BOOST_TEST(one.out == "1\n2\n3\n");
  BOOST_TEST(one.err == "cordon: output: more follows: --offset 6\n");
  auto last = cli({"output", id, "--offset", "228888", "--limit", "10"});
  BOOST_TEST(last.out == "40000\n");
  BOOST_TEST(last.err.empty(), last.err);  // the end: nothing follows
}

BOOST_AUTO_TEST_CASE(cli_commands_drive_the_daemon) {
  DaemonProcess d;
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "cli"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--", "/bin/echo", "from the cli"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  auto j = nlohmann::json::parse(started.out, nullptr, false);
  BOOST_REQUIRE(j.is_object());
  std::string id = j.value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  auto followed = cli({"output", "-f", id});
  BOOST_TEST(followed.exit_code() == 0, followed.err);
  BOOST_TEST(followed.out == "from the cli\n");
  // `--unit bytes` pages are written as the bytes the command printed (they were base64).
  auto binary = cli({"start", "--json", "--", "/bin/echo", "-ne", "a\\0000b\\0377"});
  BOOST_REQUIRE_MESSAGE(binary.exit_code() == 0, binary.err);
  std::string bin_id = nlohmann::json::parse(binary.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(cli({"wait", bin_id}).exit_code() == 0);
  const std::string raw("a\0b\xff", 4);
  BOOST_TEST(cli({"output", bin_id, "--unit", "bytes"}).out == raw);
  BOOST_TEST(cli({"output", "-f", bin_id, "--unit", "bytes"}).out == raw);
  auto status = cli({"status", id});
  BOOST_TEST(status.exit_code() == 0);
  BOOST_TEST(status.out.find(id + "  exited (exit 0)") == 0u, status.out);
  auto unknown = cli({"status", "tnope"});
  BOOST_TEST(unknown.exit_code() == 1);
  BOOST_TEST(unknown.err.find(id) != std::string::npos, unknown.err);  // lists known ids
  BOOST_TEST(cli({"rm", id}).exit_code() == 0);
  auto listed = cli({"list", "--json"});
  BOOST_TEST(listed.out.find(id) == std::string::npos);
  auto refused = cli({"start", "--", "/usr/bin/wget"});
  BOOST_TEST(refused.exit_code() == 1);
  BOOST_TEST(refused.err.find("not allowed") != std::string::npos, refused.err);
  // Failure fixed (a review, session 11): a wait that timed out exited 0, as if done.
  auto sleeper = cli({"start", "--json", "--", "/bin/sleep", "30"});
  BOOST_REQUIRE_MESSAGE(sleeper.exit_code() == 0, sleeper.err);
  std::string sleeping = nlohmann::json::parse(sleeper.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!sleeping.empty());
  auto waited = cli({"wait", sleeping, "--timeout-ms", "200"});
  BOOST_TEST(waited.exit_code() == 124, waited.err);
  BOOST_TEST(waited.out.find(sleeping + "  running") == 0u, waited.out);
  BOOST_TEST(cli({"kill", sleeping}).exit_code() == 0);
  BOOST_TEST(cli({"wait", sleeping, "--timeout-ms", "20000"}).exit_code() == 0);
}

// Failure fixed (a review, session 32): one allowed uid had 32 requests in flight on each of
// its 64 connections. 2048 parked command_waits took both cores, and 32 pages of control
// bytes read by a trickle held 2.5 GB. Now such a uid has at most daemon.maxCallsPerUid in
// flight over all its connections: the next is answered at once, busy, naming the bound;
// finished calls give their slots back; root is not held to it.
BOOST_AUTO_TEST_CASE(one_uid_has_at_most_max_calls_per_uid_in_flight_over_its_connections) {
  DaemonProcess d(json{{"allowedExecutables", {"/bin/sleep"}},
                       {"daemon", {{"allowedUids", json::array({65533})}, {"maxCallsPerUid", 3}}}});
  // `n` connections of one session each park a command_wait of 1.5 s on a sleeping job; one
  // more connection makes a call while they wait, and another after they answered.
  auto scenario = [&](int n) {
    std::vector<std::unique_ptr<LineClient>> c;
    for (int i = 0; i <= n; ++i) {
      c.push_back(std::make_unique<LineClient>(d.connect_fd()));
      if (!c.back()->handshake("w") || !c.back()->initialize()) {
        return std::string("no session");
      }
    }
    json job = c[n]->call_content("run_command_bg", {{"argv", {"/bin/sleep", "30"}}});
    std::string id = job.value("taskId", "");
    if (id.empty()) {
      return "no job: " + job.dump();
    }
    std::vector<int> waits;
    for (int i = 0; i < n; ++i) {
      waits.push_back(c[i]->call_async("command_wait", {{"taskIds", {id}}, {"timeoutMs", 1500}}));
    }
    std::this_thread::sleep_for(300ms);  // all of them in flight (see the retries below)
    json more = c[n]->call("command_status", {{"taskId", id}}, 5000ms);
    std::string out = "more " + (more.contains("result") ? std::string("served")
                                                         : more.value("error", json()).dump());
    for (int i = 0; i < n; ++i) {
      json r = c[i]->response(waits[i], 20000ms);
      out += std::string(" wait ") + (r.contains("result") ? "answered" : r.dump());
    }
    json after = c[n]->call("command_kill", {{"taskId", id}, {"signal", "SIGKILL"}}, 5000ms);
    return out + " after " + (after.contains("result") ? "served" : after.dump());
  };
  // Under load the daemon may not have read every wait 300 ms after they were sent; the call
  // then takes a slot itself and a late wait is refused instead. Such a round says nothing of
  // the cap and is run again (at most 5 times): one round's refusal must be the call's (CI at
  // a load of 200, session 36).
  std::string capped;
  for (int round = 0; round < 5 && !capped.starts_with("more {\"code\":-32000"); ++round) {
    capped = as_uid(65533, [&] { return scenario(3); });
  }
  BOOST_TEST(capped.starts_with("more {\"code\":-32000"), capped);
  BOOST_TEST(capped.find("your uid has 3 requests in flight") != std::string::npos, capped);
  BOOST_TEST(capped.find("daemon.maxCallsPerUid") != std::string::npos, capped);
  BOOST_TEST(capped.ends_with("wait answered wait answered wait answered after served"), capped);
  // Root is not held to it.
  std::string root = scenario(4);
  BOOST_TEST(root ==
                 "more served wait answered wait answered wait answered wait answered after "
                 "served",
             root);
}

// A batch's members stay in flight until the batch's array is written: their responses wait
// there for the slowest member. Failure fixed (a red-team review, session 38): each member
// gave its slot back once it answered, so a uid held one batch of 32 pages per connection
// while counting one call each, 1.5 GB on 20 connections. Here a batch of two quick calls and
// a 1.5 s wait holds all 3 of the uid's slots: another connection's call meanwhile is busy;
// once the batch is answered, it is served (the control).
BOOST_AUTO_TEST_CASE(a_batchs_answered_members_hold_their_slots_until_the_batch_is_written) {
  DaemonProcess d(json{{"allowedExecutables", {"/bin/sleep"}},
                       {"daemon", {{"allowedUids", json::array({65533})}, {"maxCallsPerUid", 3}}}});
  auto scenario = [&] {
    LineClient batcher(d.connect_fd()), other(d.connect_fd());
    if (!batcher.handshake("b") || !other.handshake("b") || !other.initialize()) {
      return std::string("no session");
    }
    // Batches exist up to MCP 2025-03-26.
    json init = batcher.request("initialize", {{"protocolVersion", "2025-03-26"},
                                               {"capabilities", json::object()},
                                               {"clientInfo", {{"name", "b"}, {"version", "1"}}}});
    if (!init.contains("result") ||
        !batcher.send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}})) {
      return "no batch session: " + init.dump();
    }
    std::string id =
        other.call_content("run_command_bg", {{"argv", {"/bin/sleep", "30"}}}).value("taskId", "");
    if (id.empty()) {
      return std::string("no job");
    }
    auto member = [&](int n, const std::string& tool, const json& args) {
      return json{{"jsonrpc", "2.0"},
                  {"id", 100 + n},
                  {"method", "tools/call"},
                  {"params", {{"name", tool}, {"arguments", args}}}};
    };
    batcher.send(
        json::array({member(0, "command_status", {{"taskId", id}}),
                     member(1, "command_status", {{"taskId", id}}),
                     member(2, "command_wait", {{"taskIds", {id}}, {"timeoutMs", 1500}})}));
    std::this_thread::sleep_for(400ms);  // the batch read and its two quick members answered
    json during = other.call("command_status", {{"taskId", id}}, 5000ms);
    std::string out =
        "during " +
        (during.contains("result") ? std::string("served") : during.value("error", json()).dump());
    auto array = batcher.line(20000ms);
    json answered = array ? json::parse(*array, nullptr, false) : json();
    out +=
        " batch " + (answered.is_array() ? std::to_string(answered.size()) : std::string("none"));
    // The slots come back just after the array is written, so the client may read it first
    // and be quicker (CI under ASan, session 38): the next call is served within a moment.
    json after;
    for (int i = 0; i < 50 && !after.contains("result"); ++i) {
      if (i > 0) {
        std::this_thread::sleep_for(100ms);
      }
      after = other.call("command_kill", {{"taskId", id}, {"signal", "SIGKILL"}}, 5000ms);
    }
    return out + " after " + (after.contains("result") ? "served" : after.dump());
  };
  // As above: under load the batch may not have been read 400 ms after it was sent; such a
  // round says nothing of the cap and is run again (at most 5 times).
  std::string seen;
  for (int round = 0; round < 5 && !seen.starts_with("during {\"code\":-32000"); ++round) {
    seen = as_uid(65533, scenario);
  }
  BOOST_TEST(seen.starts_with("during {\"code\":-32000"), seen);
  BOOST_TEST(seen.find("your uid has 3 requests in flight") != std::string::npos, seen);
  BOOST_TEST(seen.ends_with("batch 3 after served"), seen);
}

// `cordon start --pty --cols --rows` and `cordon resize`: the terminal's size from a shell.
BOOST_AUTO_TEST_CASE(cli_sizes_and_resizes_a_pty_command) {
  DaemonProcess d(
      json{{"allowedExecutables", {"/bin/sh", "/usr/bin/sh", "/bin/stty", "/usr/bin/stty"}}});
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "tty"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--pty", "--cols", "90", "--rows", "20", "--", "/bin/sh",
                      "-c", "stty size; read x; stty size"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  std::string id = nlohmann::json::parse(started.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  bool sized = false;  // the terminal's first line, polled (output does not wait)
  for (int i = 0; i < 400 && !sized; ++i) {
    sized = cli({"output", id}).out.find("20 90") != std::string::npos;
    if (!sized) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  BOOST_REQUIRE(sized);
  auto resized = cli({"resize", id, "--cols", "120", "--rows", "50"});
  BOOST_TEST(resized.exit_code() == 0, resized.err);
  BOOST_TEST(resized.out == id + "  120x50\n");
  BOOST_REQUIRE(cli({"write", id, "--submit"}).exit_code() == 0);
  BOOST_REQUIRE(cli({"wait", id, "--timeout-ms", "20000"}).exit_code() == 0);
  auto out = cli({"output", id});
  BOOST_TEST(out.out.find("50 120") != std::string::npos, out.out);
  // Usage errors (2) before any call; the tool's refusal (1) after the job settled.
  auto no_size = cli({"resize", id, "--cols", "80"});
  BOOST_TEST(no_size.exit_code() == 2);
  BOOST_TEST(no_size.err.find("--cols N --rows N") != std::string::npos, no_size.err);
  auto not_a_number = cli({"resize", id, "--cols", "wide", "--rows", "5"});
  BOOST_TEST(not_a_number.exit_code() == 2);
  BOOST_TEST(not_a_number.err.find("a whole number of characters") != std::string::npos,
             not_a_number.err);
  auto no_pty = cli({"start", "--cols", "80", "--", "/bin/sh", "-c", "true"});
  BOOST_TEST(no_pty.exit_code() == 2);
  BOOST_TEST(no_pty.err.find("give --pty as well") != std::string::npos, no_pty.err);
  auto settled = cli({"resize", id, "--cols", "80", "--rows", "24"});
  BOOST_TEST(settled.exit_code() == 1);
  BOOST_TEST(settled.err.find("settled") != std::string::npos, settled.err);
}

// `cordon list` shows every job of the session: command_list answers a page at a time (50 by
// default), and the CLI reads on while there is a next page.
BOOST_AUTO_TEST_CASE(cli_list_shows_every_job_past_one_page) {
  DaemonProcess d;
  std::vector<std::string> ids;
  {
    LineClient c(d.connect_fd());
    BOOST_REQUIRE(c.handshake("many"));
    BOOST_REQUIRE(c.initialize());
    for (int i = 0; i < 55; ++i) {
      json r = c.call_content("run_command", {{"argv", {"/bin/echo", std::to_string(i)}}});
      BOOST_REQUIRE_MESSAGE(r.value("state", "") == "exited", r.dump());
      ids.push_back(r.value("taskId", ""));
    }
  }
  auto listed = run_process({cordon_bin(), "list", "--socket", d.sock(), "--session", "many"});
  BOOST_REQUIRE_MESSAGE(listed.exit_code() == 0, listed.err);
  BOOST_TEST(std::count(listed.out.begin(), listed.out.end(), '\n') == 55, listed.out);
  BOOST_TEST(listed.out.find(ids.front()) == 0u, listed.out);
  BOOST_TEST(listed.out.find(ids.back()) != std::string::npos, listed.out);
  auto as_json =
      run_process({cordon_bin(), "list", "--socket", d.sock(), "--session", "many", "--json"});
  BOOST_REQUIRE_MESSAGE(as_json.exit_code() == 0, as_json.err);
  auto j = nlohmann::json::parse(as_json.out, nullptr, false);
  BOOST_TEST(j.value("count", 0) == 55, as_json.out);
  BOOST_TEST(j.value("total", 0) == 55, as_json.out);
  BOOST_TEST(j["jobs"].size() == 55u);
  BOOST_TEST(!j.contains("nextOffset"));
}

// Failure fixed (session 13, found by a review): `cordon status` read `tailPreview`, a field
// command_status does not have, so the tail docs/cli.md promises never printed. The tail is the
// command's raw output going to the operator's terminal: its ESC, BEL and C1 controls are shown
// escaped, so the OSC 52 here (which would set the clipboard) is not relayed.
BOOST_AUTO_TEST_CASE(cli_status_prints_the_tail_with_its_control_characters_escaped) {
  DaemonProcess d;
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "cli"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--", "/bin/echo", "-e",
                      "hello\\0033]52;c;Zm9v\\0007 \\0302\\0233 end\\0011tab"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  std::string id = nlohmann::json::parse(started.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  BOOST_REQUIRE(cli({"wait", id, "--timeout-ms", "20000"}).exit_code() == 0);
  auto status = cli({"status", id});
  BOOST_TEST(status.exit_code() == 0, status.err);
  BOOST_TEST(status.out.find(id + "  exited (exit 0)") == 0u, status.out);
  BOOST_TEST(status.out.find("\nhello\\x1b]52;c;Zm9v\\x07 \\u009b end\ttab\n") != std::string::npos,
             status.out);
  BOOST_TEST(status.out.find_first_of("\x1b\x07") == std::string::npos, status.out);
  BOOST_TEST(status.out.find("\xc2\x9b") == std::string::npos, status.out);
  // A CR before LF is a line end (a pty's), shown as one; a lone CR is shown escaped.
  auto crlf = cli({"start", "--json", "--", "/bin/echo", "-e", "one\\r\\ntwo\\rthree"});
  BOOST_REQUIRE_MESSAGE(crlf.exit_code() == 0, crlf.err);
  std::string crlf_id = nlohmann::json::parse(crlf.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(cli({"wait", crlf_id, "--timeout-ms", "20000"}).exit_code() == 0);
  auto st2 = cli({"status", crlf_id});
  BOOST_TEST(st2.out.find("\none\ntwo\\x0dthree\n") != std::string::npos, st2.out);
}

BOOST_AUTO_TEST_CASE(cli_says_when_no_daemon_listens) {
  Sandbox s;
  auto r = run_process({cordon_bin(), "list", "--socket", s.base + "/none.sock"});
  BOOST_TEST(r.exit_code() == 3);
  BOOST_TEST(r.err.find("is `cordon serve` running?") != std::string::npos, r.err);
  // A session name the daemon would refuse is a usage error, found before connecting (it was
  // exit 3, "could not be reached", after the daemon refused the handshake).
  for (std::vector<std::string> args :
       {std::vector<std::string>{"list", "--session", "../x"},
        std::vector<std::string>{"mcp", "--connect", s.base + "/none.sock", "--session", "a b"}}) {
    args.insert(args.begin(), cordon_bin());
    if (args[1] == "list") {
      args.insert(args.end(), {"--socket", s.base + "/none.sock"});
    }
    auto bad = run_process(args);
    BOOST_TEST(bad.exit_code() == 2, args[1] << ": " << bad.err);
    BOOST_TEST(bad.err.find("is no session name: 1-100 letters") != std::string::npos, bad.err);
  }
  // A standalone `cordon mcp` may not take the unnamed form a daemon gives a connection's
  // session: a daemon later started on the state dir would end it, jobs and all. A named
  // session holding `.conn-` is no such form (the control: refused only for its policy).
  auto unnamed = run_process(
      {cordon_bin(), "mcp", "--session", "u1000.conn-0123456789abcdef", "--state-dir", s.base});
  BOOST_TEST(unnamed.exit_code() == 2, unnamed.err);
  BOOST_TEST(unnamed.err.find("has the form `u<uid>.conn-<16 hex digits>`") != std::string::npos,
             unnamed.err);
  auto named = run_process(
      {cordon_bin(), "mcp", "--session", "ci.conn-0123456789abcdef", "--state-dir", s.base});
  BOOST_TEST(named.err.find("is no session name") == std::string::npos, named.err);
  BOOST_TEST(named.err.find("--policy") != std::string::npos, named.err);
  // A number that does not parse is named as such (it was "needs a value"), before connecting.
  auto bad_number = run_process(
      {cordon_bin(), "output", "T1", "--offset", "abc", "--socket", s.base + "/none.sock"});
  BOOST_TEST(bad_number.exit_code() == 2, bad_number.err);
  BOOST_TEST(bad_number.err.find("--offset: `abc` is not a valid value (a whole number") !=
                 std::string::npos,
             bad_number.err);
  auto no_number = run_process({cordon_bin(), "wait", "T1", "--timeout-ms"});
  BOOST_TEST(no_number.exit_code() == 2, no_number.err);
  BOOST_TEST(no_number.err.find("--timeout-ms needs a value") != std::string::npos, no_number.err);
}

// `cordon run --socket`: the command runs in the daemon (its warm pool), and the CLI behaves as
// the standalone run does: stdout and stderr byte for byte, the exit code, 128+N for a signal,
// 124 for a timeout; what would shape the sandbox is refused and names the daemon's policy.
BOOST_AUTO_TEST_CASE(run_through_the_daemon_behaves_like_the_standalone_run) {
  DaemonProcess d(json{{"allowedExecutables", {"/bin/sh", "/bin/sleep", "/bin/true"}}});
  const std::string root = d.box().root;
  auto run = [&](std::vector<std::string> opts, std::vector<std::string> argv,
                 const ProcessOptions& po = {}) {
    std::vector<std::string> a = {cordon_bin(), "run", "--socket", d.sock(), "--cwd", root};
    a.insert(a.end(), opts.begin(), opts.end());
    a.emplace_back("--");
    a.insert(a.end(), argv.begin(), argv.end());
    return run_process(a, po);
  };
  auto r = run({}, {"/bin/sh", "-c", "printf 'out\\000bin\\377'; printf err >&2; pwd >&2; exit 7"});
  BOOST_TEST(r.exit_code() == 7, r.err);
  BOOST_TEST(r.out == std::string("out\0bin\xff", 8));
  BOOST_TEST(r.err == "err" + root + "\n");
  // More than one page (200000 bytes) of each stream, in order.
  std::string expected;
  for (int i = 0; i < 30000; ++i) {
    expected += "line-" + std::to_string(i) + "\n";
  }
  auto big = run({}, {"/bin/sh", "-c",
                      "i=0; while [ $i -lt 30000 ]; do echo line-$i; i=$((i+1)); done; "
                      "i=0; while [ $i -lt 30000 ]; do echo line-$i >&2; i=$((i+1)); done"});
  BOOST_TEST(big.exit_code() == 0, big.err.substr(0, 300));
  BOOST_TEST(big.out.size() == expected.size());
  BOOST_TEST((big.out == expected));
  BOOST_TEST((big.err == expected));
  auto signalled = run({}, {"/bin/sh", "-c", "kill -TERM $$"});
  BOOST_TEST(signalled.exit_code() == 128 + SIGTERM, signalled.err);
  auto timed_out = run({"--timeout", "1"}, {"/bin/sleep", "30"});
  BOOST_TEST(timed_out.exit_code() == 124, timed_out.err);
  BOOST_TEST(timed_out.err.find("timed out") != std::string::npos, timed_out.err);
  // Failure fixed (a review, session 11): --timeout 0 ran with 1 ms; the standalone refuses it.
  auto zero = run({"--timeout", "0"}, {"/bin/true"});
  BOOST_TEST(zero.exit_code() == 125);
  BOOST_TEST(zero.err.find("--timeout must be positive") != std::string::npos, zero.err);
  auto shaped = run({"--memory", "1G"}, {"/bin/true"});
  BOOST_TEST(shaped.exit_code() == 125);
  BOOST_TEST(shaped.err.find("`--memory` cannot be used with --socket: the daemon's policy") !=
                 std::string::npos,
             shaped.err);
  auto not_allowed = run({}, {"/usr/bin/id"});
  BOOST_TEST(not_allowed.exit_code() == 125);
  BOOST_TEST(not_allowed.err.find("not allowed") != std::string::npos, not_allowed.err);
  // Input waiting on stdin cannot be passed on: refused rather than dropped.
  const std::string input = d.box().base + "/input.txt";
  std::ofstream(input) << "some input\n";
  int in = ::open(input.c_str(), O_RDONLY | O_CLOEXEC);
  BOOST_REQUIRE(in >= 0);
  ProcessOptions po;
  po.stdin_fd = in;
  auto with_input = run({}, {"/bin/true"}, po);
  ::close(in);
  BOOST_TEST(with_input.exit_code() == 125);
  BOOST_TEST(with_input.err.find("stdin has input") != std::string::npos, with_input.err);
  auto no_daemon = run_process(
      {cordon_bin(), "run", "--socket", d.box().base + "/none.sock", "--", "/bin/true"});
  BOOST_TEST(no_daemon.exit_code() == 125);
  BOOST_TEST(no_daemon.err.find("is `cordon serve` running?") != std::string::npos, no_daemon.err);
  // Each run's job goes with its connection, once its output was copied and its outcome
  // told: the connections' unnamed sessions, which no client can name again, keep no record
  // and no index (they filled the daemon's job quota). The daemon ends the session after the
  // run has closed the connection, so this waits for it (bounded).
  namespace fs = std::filesystem;
  auto left = [&](bool tell) {
    std::error_code ec;
    size_t n = 0;
    for (const std::string dir : {"/jobs", "/sessions"}) {
      for (const auto& e : fs::directory_iterator(d.box().state + dir, ec)) {
        n += 1;
        if (tell) BOOST_TEST_MESSAGE("left: " << e.path());
      }
    }
    return n;
  };
  for (int i = 0; i < 500 && left(false) != 0; ++i) ::usleep(10000);  // bounded: 5 s
  BOOST_TEST(left(true) == 0u);
}

// Failure fixed: JSON carries only text, and an argument that was not UTF-8 went to the daemon
// as U+FFFD, so `cordon run --socket` and `cordon start` ran another argv than the one given
// (the standalone run passes the bytes: run/arguments_that_are_not_utf8_run_as_given). Now the
// CLI refuses before anything runs, naming the field and the byte.
BOOST_AUTO_TEST_CASE(arguments_that_are_not_utf8_are_refused_before_the_daemon_runs_anything) {
  DaemonProcess d(json{{"allowedExecutables", {"/bin/sh"}}});
  const std::string root = d.box().root;
  const std::string latin1 = "caf\xe9";
  auto run = run_process({cordon_bin(), "run", "--socket", d.sock(), "--cwd", root, "--", "/bin/sh",
                          "-c", "touch ran-by-run", "sh", latin1});
  BOOST_TEST(run.exit_code() == 125, run.err);
  BOOST_TEST(run.err.find("`argv[4]` (byte 0xe9 at offset 3) is not UTF-8") != std::string::npos,
             run.err);
  BOOST_TEST(run.err.find("without --socket") != std::string::npos, run.err);
  auto env = run_process({cordon_bin(), "run", "--socket", d.sock(), "--cwd", root, "--env",
                          "CORDON_X=\xff", "--", "/bin/sh", "-c", "touch ran-by-env"});
  BOOST_TEST(env.exit_code() == 125, env.err);
  BOOST_TEST(env.err.find("`env.CORDON_X` (byte 0xff at offset 0)") != std::string::npos, env.err);
  auto start = run_process({cordon_bin(), "start", "--socket", d.sock(), "--session", "u8", "--cwd",
                            root, "--", "/bin/sh", "-c", "touch ran-by-start", latin1});
  BOOST_TEST(start.exit_code() == 1, start.err);
  BOOST_TEST(start.err.find("`argv[3]` (byte 0xe9 at offset 3)") != std::string::npos, start.err);
  // Checked before connecting: with no daemon the answer is the same refusal.
  auto no_daemon = run_process({cordon_bin(), "run", "--socket", d.box().base + "/none.sock",
                                "--cwd", root, "--", "/bin/sh", "-c", "true", latin1});
  BOOST_TEST(no_daemon.exit_code() == 125, no_daemon.err);
  BOOST_TEST(no_daemon.err.find("is not UTF-8") != std::string::npos, no_daemon.err);
  // Nothing ran, and no job was recorded; text that is UTF-8 still runs.
  for (const char* marker : {"ran-by-run", "ran-by-env", "ran-by-start"}) {
    BOOST_TEST(::access((root + "/" + marker).c_str(), F_OK) != 0, marker);
  }
  auto listed =
      run_process({cordon_bin(), "list", "--socket", d.sock(), "--session", "u8", "--json"});
  BOOST_TEST(listed.exit_code() == 0, listed.err);
  BOOST_TEST(listed.out.find("\"taskId\"") == std::string::npos, listed.out);
  auto text = run_process({cordon_bin(), "run", "--socket", d.sock(), "--cwd", root, "--",
                           "/bin/sh", "-c", "printf %s \"$1\"", "sh", "caf\xc3\xa9"});
  BOOST_TEST(text.exit_code() == 0, text.err);
  BOOST_TEST(text.out == "caf\xc3\xa9");
}

// The handshake reader takes exactly its line: a client that sends the handshake and its first
// JSON-RPC request in one write gets both answered (nothing of the request is read away).
namespace {

// An MCP `initialize` request of id 1 from a client of this name.
json initialize_request(const std::string& client_name) {
  return {{"jsonrpc", "2.0"},
          {"id", 1},
          {"method", "initialize"},
          {"params",
           {{"protocolVersion", "2025-06-18"},
            {"capabilities", json::object()},
            {"clientInfo", {{"name", client_name}, {"version", "1"}}}}}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_handshake_and_a_request_in_one_write_are_both_answered) {
  DaemonProcess d;
  LineClient c(d);
  BOOST_REQUIRE(c.connected());
  const json init = initialize_request("t");
  BOOST_REQUIRE(c.send_raw(R"({"cordon":"connect","session":"one-write"})"
                           "\n" +
                           init.dump() + "\n"));
  auto hello = c.line();
  BOOST_REQUIRE(hello.has_value());
  BOOST_TEST(json::parse(*hello, nullptr, false).value("ok", false), *hello);
  auto reply = c.line();
  BOOST_REQUIRE_MESSAGE(reply.has_value(), "the request after the handshake was not answered");
  json r = json::parse(*reply, nullptr, false);
  BOOST_TEST(r.value("id", 0) == 1, *reply);
  BOOST_TEST(r.contains("result"), *reply);
}

// A connection may start with a JSON-RPC message instead of the handshake, as long as any
// other message. Failure fixed (a red-team review, session 38): an `initialize` of 5 KB was
// answered `no first line within the handshake time` and the connection closed, since the
// first line was read with the handshake's bound of 4096 bytes. A handshake line over that
// bound is still refused, saying so (the control).
BOOST_AUTO_TEST_CASE(a_first_json_rpc_message_over_4_kib_is_served_without_a_handshake) {
  DaemonProcess d;
  LineClient c(d);
  BOOST_REQUIRE(c.connected());
  BOOST_REQUIRE(c.send(initialize_request(std::string(6000, 'n'))));
  auto reply = c.line();
  BOOST_REQUIRE_MESSAGE(reply.has_value(), "the long first message was not answered");
  json r = json::parse(*reply, nullptr, false);
  BOOST_TEST(r.value("id", 0) == 1, *reply);
  BOOST_TEST(r.contains("result"), *reply);

  LineClient h(d);
  BOOST_REQUIRE(h.send({{"cordon", "connect"}, {"session", "s"}, {"pad", std::string(5000, 'p')}}));
  auto refused = h.line();
  BOOST_REQUIRE(refused.has_value());
  json e = json::parse(*refused, nullptr, false);
  BOOST_TEST(e.value("ok", true) == false, *refused);
  BOOST_TEST(e.value("error", "") == "the handshake line is longer than 4096 bytes", *refused);

  // A first line is parsed only within the bounds of every other line: 15 MB of `[` took the
  // daemon to 1.2 GB when the first version of this parsed it whole (a review, session 38).
  // It is refused as any line nested too deep, and the daemon's peak stays far below.
  LineClient deep(d);
  BOOST_REQUIRE(deep.send_raw(std::string(15u << 20, '[') + "\n"));
  auto answer = deep.line();
  BOOST_REQUIRE(answer.has_value());
  BOOST_TEST(answer->find("nests arrays and objects deeper") != std::string::npos, *answer);
  std::ifstream status("/proc/" + std::to_string(d.pid()) + "/status");
  long peak_kib = -1;
  for (std::string l; std::getline(status, l);) {
    if (l.rfind("VmHWM:", 0) == 0) {
      peak_kib = std::stol(l.substr(6));
    }
  }
  BOOST_TEST(peak_kib > 0);
  BOOST_TEST(peak_kib < 200 * 1024, peak_kib << " KiB");
}

// The rest of `cordon run --socket`: the environment options as the standalone run takes them
// (each --pass-env must be set; --env wins over it), --json-status gets the daemon's final
// status (or the refusal), and a signal without a name still maps to 128+N.
BOOST_AUTO_TEST_CASE(run_through_the_daemon_passes_env_and_writes_its_status) {
  DaemonProcess d(json{{"allowedExecutables", {"/bin/sh", "/bin/cordon-test-missing"}}});
  const std::string root = d.box().root;
  const std::string status_file = d.box().base + "/status.json";
  auto run = [&](std::vector<std::string> opts, const std::string& script,
                 std::vector<std::string> env = {}) {
    std::vector<std::string> a = {cordon_bin(), "run", "--socket", d.sock(), "--cwd", root};
    a.insert(a.end(), opts.begin(), opts.end());
    a.insert(a.end(), {"--", "/bin/sh", "-c", script});
    ProcessOptions po;
    if (!env.empty()) {
      po.env = env;
    }
    return run_process(a, po);
  };
  auto unset = run({"--pass-env", "CORDON_TEST_UNSET_VAR"}, "true", {"PATH=/usr/bin:/bin"});
  BOOST_TEST(unset.exit_code() == 125);
  BOOST_TEST(unset.err.find("--pass-env CORDON_TEST_UNSET_VAR: not set") != std::string::npos,
             unset.err);
  auto env = run({"--pass-env", "CORDON_A", "--pass-env", "CORDON_B", "--env", "CORDON_B=set",
                  "--json-status", status_file},
                 "echo \"$CORDON_A $CORDON_B\"; exit 3",
                 {"PATH=/usr/bin:/bin", "CORDON_A=passed", "CORDON_B=from-env"});
  BOOST_TEST(env.exit_code() == 3, env.err);
  BOOST_TEST(env.out == "passed set\n");
  json st = json::parse(read_text_file(status_file), nullptr, false);
  BOOST_TEST(st.value("state", "") == "exited", st.dump());
  BOOST_TEST(st.value("exitCode", -1) == 3, st.dump());
  BOOST_TEST(!st.value("taskId", "").empty(), st.dump());
  // command_status's words, whether the job settled inside run_command's quarter second or
  // after it. Failure fixed (a review, session 23): a quick job's status carried run_command's
  // inline tails and hint.
  BOOST_TEST(!st.contains("output"), st.dump());
  BOOST_TEST(!st.contains("hint"), st.dump());
  BOOST_TEST(st.value("settled", false), st.dump());
  auto slow = run({"--json-status", status_file}, "sleep 0.6; echo late");
  BOOST_TEST(slow.exit_code() == 0, slow.err);
  BOOST_TEST(slow.out == "late\n");
  json ss = json::parse(read_text_file(status_file), nullptr, false);
  BOOST_TEST(ss.value("state", "") == "exited", ss.dump());
  BOOST_TEST(!ss.contains("output"), ss.dump());
  BOOST_TEST(!ss.contains("hint"), ss.dump());
  auto rt = run({}, "kill -37 $$");
  BOOST_TEST(rt.exit_code() == 128 + 37, rt.err);
  // A program the policy allows but this host lacks: 127 and the daemon's words, as standalone.
  auto missing = run_process({cordon_bin(), "run", "--socket", d.sock(), "--cwd", root,
                              "--json-status", status_file, "--", "/bin/cordon-test-missing"});
  BOOST_TEST(missing.exit_code() == 127, missing.err);
  BOOST_TEST(missing.err.find("`/bin/cordon-test-missing` does not exist on this host") !=
                 std::string::npos,
             missing.err);
  BOOST_TEST(missing.err.find("{\"") == std::string::npos, missing.err);  // no JSON dump
  json ms = json::parse(read_text_file(status_file), nullptr, false);
  BOOST_TEST(ms.value("state", "") == "failed", ms.dump());
  auto refused = run_process({cordon_bin(), "run", "--socket", d.box().base + "/none.sock",
                              "--json-status", status_file, "--", "/bin/sh", "-c", "true"});
  BOOST_TEST(refused.exit_code() == 125);
  json rs = json::parse(read_text_file(status_file), nullptr, false);
  BOOST_TEST(rs.value("state", "") == "refused", rs.dump());
}

// The daemon reads its policy's `daemon` section itself, before the engine loads the file: a
// FIFO at the policy's path hung that read, and the daemon never started nor said why (found by
// a review, session 29). It is refused at once, as the engine refuses it.
BOOST_AUTO_TEST_CASE(a_policy_that_is_no_regular_file_is_refused_at_once) {
  Sandbox s;
  const std::string fifo = s.base + "/policy.fifo";
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  ProcessOptions bounded;
  bounded.deadline = std::chrono::seconds(10);
  auto r = run_process({cordon_bin(), "daemon", "--policy", fifo, "--state-dir", s.state,
                        "--socket", s.base + "/d.sock"},
                       bounded);
  BOOST_TEST(!r.timed_out);
  BOOST_TEST(r.exit_code() != 0, r.err);
  BOOST_TEST(r.err.find("not a regular file") != std::string::npos, r.err);
}

// An agent's argv reaches the operator's terminal through `cordon list` and `cordon status`:
// escaped, newlines and tabs too, so it cannot set the title, clear the screen or forge a line
// of the listing, nor (a bidi override) make an argument read backwards. Failure fixed (a review,
// session 34): argv was printed raw; session 35: U+202E passed.
BOOST_AUTO_TEST_CASE(cli_list_and_status_print_argv_with_its_controls_escaped) {
  DaemonProcess d;
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "esc"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--", "/bin/echo", "\x1b]0;PWNED\x07\x1b[2J",
                      "x\ntforged  exited (exit 0) /bin/true\tz",
                      "report\xe2\x80\xae"
                      "fdp.exe"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  std::string id = nlohmann::json::parse(started.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  BOOST_REQUIRE(cli({"wait", id, "--timeout-ms", "20000"}).exit_code() == 0);
  auto list = cli({"list"});
  // (status then prints the tail, the command's output, whose newlines are its lines.)
  BOOST_TEST(list.out.find("\ntforged") == std::string::npos, list.out);
  for (const auto& r : {list, cli({"status", id})}) {
    BOOST_TEST(r.exit_code() == 0, r.err);
    std::string first = r.out.substr(0, r.out.find('\n'));
    BOOST_TEST(first == id + "  exited (exit 0) /bin/echo \\x1b]0;PWNED\\x07\\x1b[2J "
                             "x\\x0atforged  exited (exit 0) /bin/true\\x09z report\\u202efdp.exe",
               r.out);
    BOOST_TEST(r.out.find("\x1b") == std::string::npos, r.out);
    BOOST_TEST(r.out.find("\xe2\x80\xae") == std::string::npos, r.out);  // RLO (session 35)
  }
}

// `cordon run --socket … | head`: the reader went away, and cordon ends as a pipeline's
// writer does, with SIGPIPE's code (141) and nothing said; --json-status tells why. Before
// (session 35): exit 125 and "write the command's stdout to cordon's own: EPIPE".
BOOST_AUTO_TEST_CASE(run_through_the_daemon_ends_as_a_pipeline_when_its_reader_goes) {
  DaemonProcess d(nlohmann::json{{"allowedExecutables", {"/bin/echo", "/usr/bin/yes"}}});
  std::string status = d.box().base + "/status.json";
  auto r = run_process({"/bin/bash", "-c",
                        shell_words({cordon_bin(), "run", "--socket", d.sock(), "--json-status",
                                     status, "--cwd", d.box().root, "--", "/usr/bin/yes"}) +
                            " | head -c 10 >/dev/null; echo \"rc=${PIPESTATUS[0]}\""});
  BOOST_TEST(r.out == "rc=141\n", r.out << r.err);
  BOOST_TEST(r.err.empty(), r.err);
  std::ifstream in(status);
  auto j = nlohmann::json::parse(in, nullptr, false);
  BOOST_REQUIRE(!j.is_discarded());
  BOOST_TEST(j.value("message", "").find("went away") != std::string::npos, j.dump());
}

// A daemon started under a file-size limit (`ulimit -f`) survives a job whose log passes it:
// the write fails (EFBIG) and that job says so; the daemon serves on. Failure fixed (a review,
// session 35): SIGXFSZ killed the daemon, and every running job was abandoned with it.
BOOST_AUTO_TEST_CASE(a_daemon_under_a_file_size_limit_survives_a_job_past_it) {
  DaemonProcess d({{"allowedExecutables", {"/bin/echo", "/bin/sleep", "/usr/bin/head"}}}, {},
                  /*start_now=*/false);
  struct rlimit before {};
  BOOST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
  struct rlimit limited = before;
  limited.rlim_cur = 2 * 1024 * 1024;  // room for the state dir's 1 MiB reserve
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
  d.start({"--socket", d.sock()});
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &before) == 0);  // the daemon keeps the limit
  BOOST_REQUIRE(d.pid() > 0);
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "fs"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--", "/usr/bin/head", "-c", "3000000", "/dev/zero"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  std::string id = nlohmann::json::parse(started.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  auto waited = cli({"wait", id, "--timeout-ms", "20000"});
  BOOST_TEST(waited.exit_code() == 0, waited.out << waited.err);
  // The job's own failure, said as the engine says a failed log write.
  auto st = cli({"status", "--json", id});
  BOOST_TEST((st.out + st.err).find("write `") != std::string::npos, st.out << st.err);
  BOOST_TEST((st.out + st.err).find("EFBIG") != std::string::npos, st.out << st.err);
  auto again = cli({"start", "--json", "--", "/bin/echo", "still-serving"});
  BOOST_TEST(again.exit_code() == 0, again.err);
  BOOST_TEST(d.alive());
  // The operator was told at start.
  std::ifstream in(d.log());
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOOST_TEST(log.find("file-size limit of 2097152 bytes") != std::string::npos, log);
}

// `cordon output` to a terminal shows what the command printed escaped, as the status tail:
// an OSC 52 would write the operator's clipboard, a CSI move the cursor and forge lines. To a
// pipe, and with --raw, the bytes go as printed (the control). Failure fixed (a review, session
// 35): the terminal got them raw.
BOOST_AUTO_TEST_CASE(cli_output_to_a_terminal_shows_the_commands_controls_escaped) {
  DaemonProcess d;
  auto cli = [&](std::vector<std::string> args, int stdout_fd = -1) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock(), "--session", "out"};
    a.insert(a.end(), args.begin() + 1, args.end());
    ProcessOptions o;
    o.stdout_fd = stdout_fd;
    return run_process(a, o);
  };
  const std::string printed = "ok \x1b]52;c;cm0gLXJmIH4K\x07\x1b[1A\x1b[2Kall tests passed";
  auto started = cli({"start", "--json", "--", "/bin/echo", printed});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  std::string id = nlohmann::json::parse(started.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  BOOST_REQUIRE(cli({"wait", id, "--timeout-ms", "20000"}).exit_code() == 0);
  // What a terminal shows: cordon's stdout a pty slave, read back from the master.
  auto on_terminal = [&](std::vector<std::string> args) {
    int master = -1, slave = -1;
    BOOST_REQUIRE(::openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
    auto r = cli(args, slave);
    ::close(slave);
    BOOST_TEST(r.exit_code() == 0, r.err);
    std::string shown;
    char buf[4096];
    for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) {  // EIO once drained
      shown.append(buf, static_cast<size_t>(n));
    }
    ::close(master);
    return shown;
  };
  for (const auto& shown : {on_terminal({"output", id}), on_terminal({"output", id, "-f"})}) {
    BOOST_TEST(shown.find('\x1b') == std::string::npos, shown);
    BOOST_TEST(shown.find("ok \\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[1A\\x1b[2Kall tests passed") !=
                   std::string::npos,
               shown);
  }
  BOOST_TEST(on_terminal({"output", id, "--raw"}).find("\x1b]52;c;") != std::string::npos);
  // Paged 3 bytes at a time, the pages are shown as one text: a UTF-8 character or a CRLF
  // that a page boundary cuts is shown whole, not as `\xc3` or `\x0d` (a review, session 35).
  auto text = cli({"start", "--json", "--", "/bin/echo", "caf\xc3\xa9 \xe2\x82\xac 12\r"});
  BOOST_REQUIRE_MESSAGE(text.exit_code() == 0, text.err);
  std::string tid = nlohmann::json::parse(text.out, nullptr, false).value("taskId", "");
  BOOST_REQUIRE(!tid.empty());
  BOOST_REQUIRE(cli({"wait", tid, "--timeout-ms", "20000"}).exit_code() == 0);
  for (const char* limit : {"2", "3", "4"}) {
    auto paged = on_terminal({"output", tid, "-f", "--unit", "bytes", "--limit", limit});
    BOOST_TEST(paged.find("caf\xc3\xa9 \xe2\x82\xac 12\r\n") != std::string::npos,
               limit << ": " << paged);
    BOOST_TEST(paged.find("\\x") == std::string::npos, limit << ": " << paged);
  }
  auto piped = cli({"output", id});
  BOOST_TEST(piped.exit_code() == 0, piped.err);
  BOOST_TEST(piped.out == printed + "\n");
}
