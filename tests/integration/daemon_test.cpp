#define BOOST_TEST_MODULE daemon
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <fstream>

#include "helpers/cordon_fixture.hpp"

using namespace cordon::test;

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

struct Daemon {
  Sandbox box;
  std::string sock, policy, log;
  pid_t pid = -1;
  // `extra` is spliced into the policy object (e.g. `, "daemon": {...}`).
  explicit Daemon(const std::string& extra = "", bool start_now = true) {
    sock = box.base + "/d.sock";
    policy = box.base + "/policy.json";
    log = box.base + "/daemon.log";
    std::ofstream(policy) << "{\"allowedExecutables\": [\"/bin/echo\", \"/bin/sleep\"], "
                          << "\"cwdRoot\": \"" << box.root << "\"" << extra << "}";
    if (start_now) {
      start({"--socket", sock});
    }
  }
  // Starts `cordon daemon`; `listen_fd` >= 0 is passed as a systemd-activated socket (fd 3).
  void start(std::vector<std::string> args, int listen_fd = -1) {
    pid = ::fork();
    if (pid == 0) {
      int devnull = ::open("/dev/null", O_RDWR);
      int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(logfd, 2);
      if (listen_fd >= 0) {
        if (listen_fd == 3) {
          ::fcntl(3, F_SETFD, 0);  // dup2 onto itself would keep O_CLOEXEC
        } else {
          ::dup2(listen_fd, 3);
        }
        ::setenv("LISTEN_FDS", "1", 1);
        ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
      }
      std::string bin = cordon_bin();
      std::vector<std::string> all = {bin, "daemon", "--policy", policy, "--state-dir", box.state};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(99);
    }
    // The daemon logs "listening" once it accepts; a bounded poll of its log file.
    for (int i = 0; i < 1000 && read_file(log).find("listening on") == std::string::npos; ++i) {
      int st;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return;
      }
      ::usleep(10000);
    }
  }
  ~Daemon() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int st;
      ::waitpid(pid, &st, 0);
    }
  }
  int connect_fd() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, sock.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  static std::string read_file(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

std::string read_reply(int fd) {
  std::string out;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') out.push_back(c);
  return out;
}

// A JSON-RPC client on one daemon connection; every read has a deadline.
struct Client {
  int fd = -1;
  int next_id = 1;
  std::string buf;
  explicit Client(int f) : fd(f) {}
  ~Client() {
    if (fd >= 0) ::close(fd);
  }
  bool send_raw(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // The next line, "" at EOF, nullopt after the deadline.
  std::optional<std::string> line(std::chrono::milliseconds deadline = 20s) {
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      auto nl = buf.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      struct pollfd p = {fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return std::nullopt;
      }
      char b[65536];
      ssize_t n = ::read(fd, b, sizeof b);
      if (n <= 0) return std::string();
      buf.append(b, static_cast<size_t>(n));
    }
  }
  json request(const std::string& method, json params, std::chrono::milliseconds deadline = 20s) {
    int id = next_id++;
    send_raw(json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}}.dump() +
             "\n");
    for (;;) {
      auto l = line(deadline);
      if (!l || l->empty()) return json();
      json m = json::parse(*l, nullptr, false);
      if (m.is_object() && m.contains("id") && m["id"] == id) return m;
    }
  }
  bool handshake(const std::optional<std::string>& session) {
    json h = {{"cordon", "connect"}};
    if (session) h["session"] = *session;
    send_raw(h.dump() + "\n");
    auto l = line();
    return l && l->find("\"ok\":true") != std::string::npos;
  }
  bool initialize() {
    json r = request("initialize", {{"protocolVersion", "2025-06-18"},
                                    {"capabilities", json::object()},
                                    {"clientInfo", {{"name", "t"}, {"version", "1"}}}});
    send_raw(json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}.dump() + "\n");
    return r.contains("result");
  }
  json call(const std::string& tool, json args) {
    json r = request("tools/call", {{"name", tool}, {"arguments", args}});
    return r.value("result", json::object()).value("structuredContent", json::object());
  }
  // True when the daemon closed this connection within the deadline.
  bool closed_within(std::chrono::milliseconds deadline) {
    for (;;) {
      auto l = line(deadline);
      if (!l) return false;
      if (l->empty()) return true;
    }
  }
};

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
  Daemon d;
  struct stat st {};
  BOOST_REQUIRE(::stat(d.sock.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 07777) == 0600u);
  std::string got = as_uid(65534, [&] {
    int fd = d.connect_fd();
    return fd < 0 ? std::string("connect: ") + std::strerror(errno) : std::string("connected");
  });
  BOOST_TEST(got == "connect: Permission denied");
}

// The socket is bound under a temporary name and renamed into place once it listens: the path
// never names a socket that refuses connections, a stale socket left by a killed daemon is
// replaced, and no temporary name is left behind.
BOOST_AUTO_TEST_CASE(the_socket_path_appears_only_when_it_accepts_and_replaces_a_stale_one) {
  Daemon d("", false);
  {  // a stale socket: bound, never listening, its owner gone
    int stale = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, d.sock.c_str());
    BOOST_REQUIRE(::bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::close(stale);
    BOOST_REQUIRE(d.connect_fd() < 0);
  }
  struct stat before {};
  BOOST_REQUIRE(::stat(d.sock.c_str(), &before) == 0);
  // From the moment the path names a new inode it accepts: every connect to it succeeds.
  // The poller runs while start() forks and waits for the daemon's "listening" line.
  std::atomic<int> attempts = 0, refused = 0;
  std::atomic<bool> stop = false;
  std::thread poller([&] {
    while (!stop) {
      struct stat st {};
      if (::stat(d.sock.c_str(), &st) == 0 && st.st_ino != before.st_ino) {
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
  d.start({"--socket", d.sock});
  BOOST_TEST_REQUIRE(d.pid > 0);
  // The daemon logged "listening" after renaming; the poller sees the new inode soon after.
  for (int i = 0; i < 2000 && attempts == 0; ++i) ::usleep(1000);
  stop = true;
  poller.join();
  BOOST_TEST(attempts >= 1);
  BOOST_TEST(refused == 0);
  struct stat now {};
  BOOST_REQUIRE(::stat(d.sock.c_str(), &now) == 0);
  BOOST_TEST((now.st_mode & 07777) == 0600u);
  for (const auto& e : std::filesystem::directory_iterator(d.box.base)) {
    BOOST_TEST(e.path().filename().string().find(".tmp") == std::string::npos, e.path());
  }
}

BOOST_AUTO_TEST_CASE(refuses_a_peer_uid_the_policy_does_not_list) {
  Daemon d(", \"daemon\": {\"allowedUids\": [65533]}");
  struct stat st {};
  BOOST_REQUIRE(::stat(d.sock.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 07777) == 0666u);  // SO_PEERCRED decides
  std::string got = as_uid(65534, [&] {
    int fd = d.connect_fd();
    if (fd < 0) return std::string("connect failed");
    std::string hello = "{\"cordon\":\"connect\",\"session\":\"x\"}\n";
    (void)::write(fd, hello.data(), hello.size());
    return read_reply(fd);
  });
  BOOST_TEST(got.find("\"ok\":false") != std::string::npos, got);
  BOOST_TEST(got.find("uid 65534 may not use this daemon") != std::string::npos, got);
  BOOST_TEST(got.find("daemon.allowedUids") != std::string::npos, got);
}

BOOST_AUTO_TEST_CASE(sessions_are_per_uid_and_a_named_one_survives_a_reconnect) {
  Daemon d(", \"daemon\": {\"allowedUids\": [65533]}");
  std::string id;
  {
    Client root(d.connect_fd());
    BOOST_REQUIRE(root.handshake("shared"));
    BOOST_REQUIRE(root.initialize());
    json r = root.call("run_command_bg", {{"argv", {"/bin/sleep", "60"}}});
    id = r.value("taskId", "");
    BOOST_REQUIRE_MESSAGE(!id.empty(), r.dump());
  }
  // Another uid naming the same session is in its own `u65533-shared`: none of root's jobs.
  std::string other = as_uid(65533, [&] {
    Client c(d.connect_fd());
    if (!c.handshake("shared") || !c.initialize()) return std::string("no session");
    json listed = c.call("command_list", json::object());
    json status = c.call("command_status", {{"taskId", id}});
    return listed.dump() + "\n" + status.dump();
  });
  BOOST_TEST(other.find("\"jobs\":[]") != std::string::npos, other);
  BOOST_TEST(other.find("\"error\"") != std::string::npos, other);  // root's id is unknown here
  // Root reconnects to its named session: the job is still there and still running.
  Client again(d.connect_fd());
  BOOST_REQUIRE(again.handshake("shared"));
  BOOST_REQUIRE(again.initialize());
  json status = again.call("command_status", {{"taskId", id}});
  BOOST_TEST(status.value("state", "") == "running", status.dump());
  json killed = again.call("command_kill", {{"taskId", id}});
  BOOST_TEST(killed.value("state", "") == "killed", killed.dump());
}

BOOST_AUTO_TEST_CASE(an_unnamed_session_ends_with_its_connection) {
  Daemon d;
  std::string id;
  {
    // No handshake: the client speaks JSON-RPC at once and gets a session of its own.
    Client c(d.connect_fd());
    BOOST_REQUIRE(c.initialize());
    json r = c.call("run_command_bg", {{"argv", {"/bin/sleep", "60"}}});
    id = r.value("taskId", "");
    BOOST_REQUIRE_MESSAGE(!id.empty(), r.dump());
    BOOST_TEST(c.call("command_status", {{"taskId", id}}).value("state", "") == "running");
  }
  // Its job is killed when the connection closes; the record stays on disk.
  std::string meta = d.box.state + "/jobs/" + id + "/meta.json";
  std::string state;
  for (int i = 0; i < 1000; ++i) {  // a bounded poll of the record the engine writes
    json m = json::parse(Daemon::read_file(meta), nullptr, false);
    state = m.is_object() ? m.value("state", "") : "";
    if (state == "killed") break;
    ::usleep(10000);
  }
  BOOST_TEST(state == "killed");
}

BOOST_AUTO_TEST_CASE(two_clients_are_served_at_once) {
  Daemon d;
  Client a(d.connect_fd()), b(d.connect_fd());
  BOOST_REQUIRE(a.handshake("a"));
  BOOST_REQUIRE(b.handshake("b"));
  BOOST_REQUIRE(a.initialize());
  BOOST_REQUIRE(b.initialize());
  // a waits on a long command; b is answered meanwhile.
  json started = a.call("run_command_bg", {{"argv", {"/bin/sleep", "60"}}});
  std::string id = started.value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  a.send_raw(
      json{{"jsonrpc", "2.0"},
           {"id", 99},
           {"method", "tools/call"},
           {"params",
            {{"name", "command_status"}, {"arguments", {{"taskId", id}, {"waitMs", 30000}}}}}}
          .dump() +
      "\n");
  // b's call has a 20 s deadline; a's wait lasts 30 s: b is not queued behind a.
  json echoed = b.call("run_command", {{"argv", {"/bin/echo", "b here"}}});
  BOOST_TEST(echoed.value("state", "") == "exited", echoed.dump());
  BOOST_TEST(b.call("command_status", {{"taskId", id}}).contains("error"));  // not b's job
  BOOST_TEST(a.call("command_kill", {{"taskId", id}}).value("state", "") == "killed");
}

BOOST_AUTO_TEST_CASE(an_oversized_line_is_answered_and_the_connection_keeps_serving) {
  Daemon d;
  Client c(d.connect_fd());
  BOOST_REQUIRE(c.handshake("big"));
  BOOST_REQUIRE(c.initialize());
  std::string big(20u << 20, 'x');  // 20 MiB, over the 16 MiB bound
  BOOST_REQUIRE(c.send_raw(big + "\n"));
  auto l = c.line();
  BOOST_REQUIRE(l.has_value());
  json e = json::parse(*l, nullptr, false);
  BOOST_TEST(e.value("error", json::object()).value("code", 0) == -32600, *l);
  BOOST_TEST(c.call("command_list", json::object()).contains("jobs"));
}

BOOST_AUTO_TEST_CASE(a_stalled_line_and_an_idle_client_are_closed_by_the_policy_limits) {
  Daemon d(", \"daemon\": {\"stallTimeoutMs\": 300, \"idleTimeoutMs\": 600}");
  Client stalled(d.connect_fd()), idle(d.connect_fd()), busy(d.connect_fd());
  BOOST_REQUIRE(stalled.handshake("s"));
  BOOST_REQUIRE(idle.handshake("i"));
  BOOST_REQUIRE(busy.handshake("b"));
  BOOST_REQUIRE(busy.initialize());
  stalled.send_raw("{\"jsonrpc\":\"2.0\",");  // half a request, then nothing
  // A call in flight is not idleness: a 3 s wait outlives the idle timeout and is answered.
  json started = busy.call("run_command_bg", {{"argv", {"/bin/sleep", "3"}}});
  std::string id = started.value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  json waited = busy.request("tools/call", {{"name", "command_status"},
                                            {"arguments", {{"taskId", id}, {"waitMs", 10000}}}});
  BOOST_TEST(waited["result"]["structuredContent"].value("state", "") == "exited", waited.dump());
  BOOST_TEST(stalled.closed_within(5s));
  BOOST_TEST(idle.closed_within(5s));
  BOOST_TEST(Daemon::read_file(d.log).find("stalled for 300 ms") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_a_socket_directory_others_can_write) {
  Daemon d("", /*start_now=*/false);
  std::string dir = d.box.base + "/open";
  BOOST_REQUIRE(::mkdir(dir.c_str(), 0777) == 0);
  BOOST_REQUIRE(::chmod(dir.c_str(), 01777) == 0);
  d.start({"--socket", dir + "/d.sock"});
  BOOST_TEST(d.pid == -1);  // it exited
  std::string log = Daemon::read_file(d.log);
  BOOST_TEST(log.find("can be written by others") != std::string::npos, log);
  BOOST_TEST(!std::filesystem::exists(dir + "/d.sock"));
}

BOOST_AUTO_TEST_CASE(serves_a_systemd_activated_socket) {
  Daemon d("", /*start_now=*/false);
  int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, d.sock.c_str());
  BOOST_REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  BOOST_REQUIRE(::listen(l, 8) == 0);
  d.start({}, l);
  ::close(l);
  BOOST_REQUIRE_MESSAGE(d.pid > 0, Daemon::read_file(d.log));
  {
    Client c(d.connect_fd());
    BOOST_REQUIRE(c.handshake("act"));
    BOOST_REQUIRE(c.initialize());
    json r = c.call("run_command", {{"argv", {"/bin/echo", "activated"}}});
    BOOST_TEST(r.value("state", "") == "exited", r.dump());
  }
  ::kill(d.pid, SIGTERM);
  int st;
  ::waitpid(d.pid, &st, 0);
  d.pid = -1;
  BOOST_TEST(std::filesystem::exists(d.sock));  // systemd's socket: not the daemon's to remove
}

BOOST_AUTO_TEST_CASE(a_stalled_half_handshake_does_not_block_other_clients) {
  Daemon d;
  int stalled = d.connect_fd();
  BOOST_REQUIRE(stalled >= 0);
  (void)::write(stalled, "{\"cordon\":", 10);  // half a line, then nothing
  int fd = d.connect_fd();
  BOOST_REQUIRE(fd >= 0);
  std::string hello = "{\"cordon\":\"connect\",\"session\":\"ok\"}\n";
  (void)::write(fd, hello.data(), hello.size());
  std::string r = read_reply(fd);
  BOOST_TEST(r.find("\"ok\":true") != std::string::npos, r);
  BOOST_TEST(r.find("\"session\":\"u0-ok\"") != std::string::npos, r);
  ::close(fd);
  ::close(stalled);
}

BOOST_AUTO_TEST_CASE(a_bad_session_name_is_refused_with_the_handshake_format) {
  Daemon d;
  int fd = d.connect_fd();
  BOOST_REQUIRE(fd >= 0);
  std::string hello = "{\"cordon\":\"connect\",\"session\":\"../x\"}\n";
  (void)::write(fd, hello.data(), hello.size());
  std::string r = read_reply(fd);
  BOOST_TEST(r.find("\"ok\":false") != std::string::npos, r);
  BOOST_TEST(r.find("first line must be") != std::string::npos, r);
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(cli_commands_drive_the_daemon) {
  Daemon d;
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock, "--session", "cli"};
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
}

BOOST_AUTO_TEST_CASE(cli_says_when_no_daemon_listens) {
  Sandbox s;
  auto r = run_process({cordon_bin(), "list", "--socket", s.base + "/none.sock"});
  BOOST_TEST(r.exit_code() == 3);
  BOOST_TEST(r.err.find("is `cordon serve` running?") != std::string::npos, r.err);
}
