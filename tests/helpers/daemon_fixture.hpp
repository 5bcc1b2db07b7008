#pragma once

// Shared by the daemon tests: the real `cordon daemon` as a child process on a fresh sandbox,
// and a line-based JSON-RPC client for one connection to its socket. Every wait is bounded and
// wakes on an event (a pidfd, an inotify watch, the socket), never on a sleep.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "helpers/cordon_fixture.hpp"

extern char** environ;

namespace cordon::test {

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();  // a missing file reads as ""
  return text.str();
}

// A connected AF_UNIX stream socket to `path`, or -1 (errno says why).
inline int connect_unix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return -1;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

// `cordon daemon` (`serve` is the same command) on a fresh Sandbox: policy at base/policy.json,
// stderr appended to base/daemon.log, socket at base/d.sock unless the start args say otherwise.
class DaemonProcess {
 public:
  using json = nlohmann::json;

  // `policy` is laid over the base policy (echo and sleep allowed, cwdRoot the sandbox root):
  // each of its top-level keys replaces the base's. With `start_now`, the daemon starts at once
  // on base/d.sock with `extra_args` after the socket.
  explicit DaemonProcess(const json& policy = json::object(),
                         const std::vector<std::string>& extra_args = {}, bool start_now = true)
      : sock_(box_.base + "/d.sock"),
        policy_(box_.base + "/policy.json"),
        log_(box_.base + "/daemon.log") {
    json p = {{"allowedExecutables", {"/bin/echo", "/bin/sleep"}}, {"cwdRoot", box_.root}};
    p.update(policy);
    std::ofstream(policy_) << p.dump();
    if (start_now) {
      std::vector<std::string> args = {"--socket", sock_};
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      start(args);
    }
  }
  ~DaemonProcess() {
    stop();
    if (pidfd_ >= 0) {
      ::close(pidfd_);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts `cordon daemon --policy P --state-dir S ARGS`; `listen_fd` >= 0 is passed as a
  // systemd-activated socket (fd 3, LISTEN_FDS=1). Returns once the daemon accepts: its socket
  // path (--socket, else the state dir's daemon.sock) names a socket other than the one there
  // before, which since the daemon renames a listening socket into place means it listens; for
  // an activated socket, which has no path of the daemon's, once it logs "listening on". A
  // daemon that exits while this waits is reaped and pid() is -1; after 30 s it returns
  // regardless (the test's own checks then fail).
  void start(const std::vector<std::string>& args, int listen_fd = -1) {
    stop();  // one daemon per fixture
    std::string bin = cordon_bin();
    std::vector<std::string> all = {bin, "daemon", "--policy", policy_, "--state-dir", box_.state};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    // Everything the child needs is built here: after fork in a process with threads (a test's
    // poller may be running) only async-signal-safe calls are allowed, so no malloc, no setenv.
    std::string listen_fds = "LISTEN_FDS=1";
    std::string listen_pid = "LISTEN_PID=" + std::string(20, '\0');
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) {
      // The test's own LISTEN_* (if any) are not the daemon's to take.
      std::string_view v(*e);
      if (!v.starts_with("LISTEN_FDS=") && !v.starts_with("LISTEN_PID=") &&
          !v.starts_with("LISTEN_FDNAMES=")) {
        envp.push_back(*e);
      }
    }
    if (listen_fd >= 0) {
      envp.push_back(listen_fds.data());
      envp.push_back(listen_pid.data());
    }
    envp.push_back(nullptr);
    char* pid_digits = listen_pid.data() + std::strlen("LISTEN_PID=");

    std::string ready_path = listen_fd >= 0 ? log_ : socket_arg(args);
    struct stat before {};
    bool existed = ::stat(ready_path.c_str(), &before) == 0;
    // The watch is set before the fork, so no rename or log line can slip past it.
    int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    std::string dir = ready_path.substr(0, ready_path.rfind('/'));
    if (watch >= 0 &&
        ::inotify_add_watch(watch, dir.c_str(), IN_CREATE | IN_MOVED_TO | IN_MODIFY) < 0) {
      ::close(watch);
      watch = -1;
    }
    int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    int logfd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // A test that crashes must leave no daemon: it dies with the thread that forked it, and
      // if the parent is already gone the signal would never come.
      if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) {
        ::_exit(98);
      }
      if (devnull < 0 || logfd < 0 || ::dup2(devnull, 0) < 0 || ::dup2(devnull, 1) < 0 ||
          ::dup2(logfd, 2) < 0) {
        ::_exit(97);
      }
      if (listen_fd >= 0) {
        // dup2 onto itself would keep O_CLOEXEC; another fd is dup'ed to 3 without it.
        int rc = listen_fd == 3 ? ::fcntl(3, F_SETFD, 0) : ::dup2(listen_fd, 3);
        if (rc < 0) {
          ::_exit(96);
        }
        char digits[20];
        int n = 0;
        for (pid_t p = ::getpid(); p > 0; p /= 10) {
          digits[n++] = static_cast<char>('0' + p % 10);
        }
        for (int i = 0; i < n; ++i) {
          pid_digits[i] = digits[n - 1 - i];
        }
      }
      ::execve(bin.c_str(), argv.data(), envp.data());
      ::_exit(99);
    }
    if (devnull >= 0) {
      ::close(devnull);
    }
    if (logfd >= 0) {
      ::close(logfd);
    }
    if (pid_ < 0) {
      if (watch >= 0) {
        ::close(watch);
      }
      return;
    }
    if (pidfd_ >= 0) {
      ::close(pidfd_);
    }
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    auto ready = [&] {
      if (listen_fd >= 0) {
        return read_text_file(log_).find("listening on") != std::string::npos;
      }
      struct stat now {};
      return ::stat(ready_path.c_str(), &now) == 0 && S_ISSOCK(now.st_mode) &&
             (!existed || now.st_dev != before.st_dev || now.st_ino != before.st_ino);
    };
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!ready()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        break;
      }
      // Without a watch (inotify refused), a bounded re-check every 10 ms stands in for it.
      struct pollfd p[2] = {{pidfd_, POLLIN, 0}, {watch, POLLIN, 0}};
      int n = ::poll(p, watch >= 0 ? 2 : 1,
                     watch >= 0 ? static_cast<int>(left.count()) : std::min<int>(10, left.count()));
      if (n > 0 && (p[0].revents & POLLIN)) {  // it exited: reaped, and pid() says so
        int st = 0;
        ::waitpid(pid_, &st, 0);
        pid_ = -1;
        break;
      }
      if (n > 0 && (p[1].revents & POLLIN)) {
        char events[4096];
        while (::read(watch, events, sizeof events) > 0) {
        }
      }
    }
    if (watch >= 0) {
      ::close(watch);
    }
  }

  // SIGTERM and reap; returns the wait status, or -1 when no daemon runs.
  int stop() {
    if (pid_ <= 0) {
      return -1;
    }
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }

  // The pidfd turns readable when the daemon exits, so a recycled pid is never taken for it.
  bool alive() const {
    if (pidfd_ < 0) {
      return false;
    }
    struct pollfd p = {pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }

  // True once the daemon has exited (reaped here, pid() is then -1), waiting at most `deadline`
  // on its pidfd: for a daemon that fails after its socket appeared (start() returned).
  bool exited_within(std::chrono::milliseconds deadline) {
    if (pid_ <= 0) {
      return true;
    }
    struct pollfd p = {pidfd_, POLLIN, 0};
    if (pidfd_ < 0 || ::poll(&p, 1, static_cast<int>(deadline.count())) != 1) {
      return false;
    }
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return true;
  }

  // For a failed alive() check: how the daemon ended (reaped here) and the end of its log
  // (stderr), where a sanitizer report or a fatal error would be.
  std::string death() {
    std::string out = "the daemon is gone";
    if (pid_ > 0) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        out += WIFSIGNALED(st) ? ", killed by signal " + std::to_string(WTERMSIG(st))
                               : ", exit status " + std::to_string(WEXITSTATUS(st));
      }
    }
    std::string log = log_text();
    return out + "; its log ends:\n" + log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
  }

  // A new connection to the daemon's socket (the caller owns it), or -1 with errno.
  int connect_fd() const { return connect_unix(sock_); }

  const Sandbox& box() const { return box_; }
  const std::string& sock() const { return sock_; }
  const std::string& log() const { return log_; }
  std::string log_text() const { return read_text_file(log_); }
  pid_t pid() const { return pid_; }

 private:
  // The path the daemon will listen on for these args.
  std::string socket_arg(const std::vector<std::string>& args) const {
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--socket") {
        return args[i + 1];
      }
    }
    return box_.state + "/daemon.sock";
  }

  Sandbox box_;
  std::string sock_, policy_, log_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
};

// One connection to the daemon, spoken to in lines (the handshake, then JSON-RPC); every read
// has a deadline.
class LineClient {
 public:
  using json = nlohmann::json;
  static constexpr std::chrono::milliseconds kDeadline{20000};

  // Takes ownership of `fd` (-1 gives a client that is not connected).
  explicit LineClient(int fd) : fd_(fd) {}
  explicit LineClient(const DaemonProcess& d) : fd_(d.connect_fd()) {}
  ~LineClient() { close(); }
  LineClient(const LineClient&) = delete;
  LineClient& operator=(const LineClient&) = delete;

  int fd() const { return fd_; }
  bool connected() const { return fd_ >= 0; }
  // True once a read saw the peer close the connection (EOF or a reset).
  bool closed() const { return closed_; }
  void close() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = -1;
  }

  bool send_raw(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool send(const json& message) { return send_raw(message.dump() + "\n"); }

  // The next line, or nullopt at EOF (closed() is then true) or after the deadline.
  std::optional<std::string> line(std::chrono::milliseconds deadline = kDeadline) {
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
        std::string l = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return l;
      }
      if (closed_ || fd_ < 0) {
        return std::nullopt;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return std::nullopt;
      }
      struct pollfd p = {fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        continue;
      }
      char buf[65536];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        continue;
      }
      if (n <= 0) {
        closed_ = true;
        return std::nullopt;
      }
      buffered_.append(buf, static_cast<size_t>(n));
    }
  }

  // True when the daemon closes the connection within `deadline`; what it sends is skipped.
  bool closed_within(std::chrono::milliseconds deadline) {
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (!line(std::max(left, std::chrono::milliseconds(0)))) {
        return closed_;
      }
    }
  }

  // The response with this id (other lines skipped), or a null json.
  json response(int id, std::chrono::milliseconds deadline = kDeadline) {
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      auto l = line(std::max(left, std::chrono::milliseconds(0)));
      if (!l) {
        return json();
      }
      json m = json::parse(*l, nullptr, false);
      if (m.is_object() && m.contains("id") && m["id"] == id) {
        return m;
      }
    }
  }

  // Sends a request; returns its id, for response().
  int request_async(const std::string& method, const json& params) {
    int id = next_id_++;
    send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    return id;
  }
  // The whole response to a request, or a null json.
  json request(const std::string& method, const json& params,
               std::chrono::milliseconds deadline = kDeadline) {
    return response(request_async(method, params), deadline);
  }

  // The daemon's first line: `{"cordon":"connect"}`, naming the session when given; true when
  // the daemon answers ok.
  bool handshake(const std::optional<std::string>& session) {
    json h = {{"cordon", "connect"}};
    if (session) {
      h["session"] = *session;
    }
    if (!send(h)) {
      return false;
    }
    auto l = line();
    return l && l->find("\"ok\":true") != std::string::npos;
  }
  // MCP initialize and the initialized notification; true when both went through.
  bool initialize(const std::string& client_name = "cordon-test") {
    json r = request("initialize", {{"protocolVersion", "2025-06-18"},
                                    {"capabilities", json::object()},
                                    {"clientInfo", {{"name", client_name}, {"version", "1"}}}});
    return r.contains("result") &&
           send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  }

  int call_async(const std::string& tool, const json& args) {
    return request_async("tools/call", {{"name", tool}, {"arguments", args}});
  }
  // The whole tools/call response, or a null json.
  json call(const std::string& tool, const json& args,
            std::chrono::milliseconds deadline = kDeadline) {
    return response(call_async(tool, args), deadline);
  }
  // The tool's structuredContent, or an empty object when there is none.
  json call_content(const std::string& tool, const json& args,
                    std::chrono::milliseconds deadline = kDeadline) {
    json r = call(tool, args, deadline);
    if (!r.is_object() || !r.contains("result") || !r["result"].is_object()) {
      return json::object();
    }
    return r["result"].value("structuredContent", json::object());
  }

 private:
  int fd_ = -1;
  bool closed_ = false;
  std::string buffered_;
  int next_id_ = 1;
};

}  // namespace cordon::test
