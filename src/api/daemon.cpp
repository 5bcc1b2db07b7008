#include "api/daemon.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "api/mcp.hpp"
#include "base/unique_fd.hpp"

namespace cordon::api {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxHandshake = 4096;
constexpr int kHandshakeTimeoutMs = 10000;

bool valid_session(const std::string& s) {
  if (s.empty() || s.size() > 100 || s[0] == '.') {
    return false;
  }
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

// One line, bounded in size and time: a client that stalls mid-handshake is dropped.
std::optional<std::string> read_line(int fd, size_t max, int timeout_ms) {
  std::string line;
  char c;
  while (line.size() < max) {
    struct pollfd p {
      fd, POLLIN, 0
    };
    if (::poll(&p, 1, timeout_ms) <= 0) {
      return std::nullopt;
    }
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return std::nullopt;
    }
    if (c == '\n') {
      return line;
    }
    line.push_back(c);
  }
  return std::nullopt;
}

bool send_line(int fd, const json& j) {
  std::string s = j.dump() + "\n";
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
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

Result<sockaddr_un> socket_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return invalid("socket path `{}` is longer than {} bytes", path, sizeof addr.sun_path - 1);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

Result<UniqueFd> listen_on(const std::string& path) {
  CORDON_TRY(addr, socket_address(path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    return sys_error("socket");
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return refusal("`{}` exists and is not a socket; choose another --socket", path);
    }
    // A live daemon answers; a stale socket file from a killed one is replaced.
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return refusal("a daemon already listens on `{}`", path);
    }
    ::unlink(path.c_str());
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return sys_error("bind `{}`", path);
  }
  // Reachable by anyone who can reach the directory; SO_PEERCRED decides who is served.
  if (::chmod(path.c_str(), 0666) != 0) {
    return sys_error("chmod `{}`", path);
  }
  if (::listen(fd.get(), 128) != 0) {
    return sys_error("listen `{}`", path);
  }
  return fd;
}

struct Connection {
  UniqueFd fd;
  std::thread thread;
  std::atomic<bool> done{false};
};

}  // namespace

int run_daemon(const DaemonOptions& options) {
  auto log = spdlog::get("daemon");
  if (!log) {
    log = spdlog::stderr_logger_mt("daemon");
  }
  spdlog::set_default_logger(log);
  std::string path =
      options.socket_path.empty() ? options.engine.state_dir + "/daemon.sock" : options.socket_path;
  // Signals arrive on a signalfd so the accept loop can stop cleanly.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  UniqueFd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC));
  if (!sigfd) {
    log->error("signalfd: {}", errno_name(errno));
    return 1;
  }
  auto engine = Engine::open(options.engine);
  if (!engine) {
    log->error("cannot start: {}", engine.error().message());
    return 1;
  }
  std::shared_ptr<Engine> shared(std::move(*engine));
  auto listener = listen_on(path);
  if (!listener) {
    log->error("cannot listen: {}", listener.error().message());
    return 1;
  }
  std::set<uid_t> allowed(options.allowed_uids.begin(), options.allowed_uids.end());
  allowed.insert(0);
  allowed.insert(::geteuid());
  log->info("listening on `{}`; state dir `{}`", path, options.engine.state_dir);

  std::list<std::unique_ptr<Connection>> conns;
  auto reap = [&conns](bool all) {
    for (auto it = conns.begin(); it != conns.end();) {
      if (all || (*it)->done) {
        if (all) {
          ::shutdown((*it)->fd.get(), SHUT_RDWR);  // its reader sees EOF and ends
        }
        (*it)->thread.join();
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  };
  for (;;) {
    struct pollfd p[2] = {{listener->get(), POLLIN, 0}, {sigfd.get(), POLLIN, 0}};
    if (::poll(p, 2, 1000) < 0 && errno != EINTR) {
      log->error("poll: {}", errno_name(errno));
      break;
    }
    reap(false);
    if (p[1].revents & POLLIN) {
      log->info("signal received: closing every connection and stopping");
      break;
    }
    if (!(p[0].revents & POLLIN)) {
      continue;
    }
    int c = ::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      continue;
    }
    UniqueFd cfd(c);
    struct ucred cred {};
    socklen_t len = sizeof cred;
    if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        allowed.count(cred.uid) == 0) {
      send_line(c, {{"ok", false},
                    {"error", fmt::format("uid {} may not use this daemon; ask its operator to "
                                          "start it with --allow-uid {}",
                                          cred.uid, cred.uid)}});
      continue;
    }
    if (conns.size() >= options.max_connections) {
      send_line(c, {{"ok", false},
                    {"error", fmt::format("the daemon serves {} connections already; retry later",
                                          options.max_connections)}});
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->fd = std::move(cfd);
    Connection* raw = conn.get();
    uid_t uid = cred.uid;
    conn->thread = std::thread([raw, uid, shared, log] {
      int fd = raw->fd.get();
      auto line = read_line(fd, kMaxHandshake, kHandshakeTimeoutMs);
      json hello = line ? json::parse(*line, nullptr, false) : json();
      // `== "connect"` on the json, not json::value(): that throws when "cordon" is not a
      // string, and an exception here would end the whole daemon.
      std::string name = hello.is_object() && hello.contains("cordon") &&
                                 hello["cordon"] == "connect" && hello.contains("session") &&
                                 hello["session"].is_string()
                             ? hello["session"].get<std::string>()
                             : "";
      if (!valid_session(name)) {
        send_line(fd, {{"ok", false},
                       {"error",
                        "the first line must be {\"cordon\": \"connect\", \"session\": "
                        "\"NAME\"} with NAME of letters, digits, - _ . (at most 100)"}});
      } else {
        // Sessions are scoped by the peer's uid: one user never sees another's jobs.
        std::string session = fmt::format("u{}-{}", uid, name);
        if (send_line(fd, {{"ok", true}, {"session", session}})) {
          log->info("connection: session `{}`", session);
          serve_mcp_connection(shared, session, fd, fd);
        }
      }
      raw->done = true;
    });
    conns.push_back(std::move(conn));
  }
  reap(true);
  listener->reset();
  ::unlink(path.c_str());
  return 0;
}

namespace {

// Connects to the daemon and performs the handshake; the error says what to do.
Result<UniqueFd> connect_session(const std::string& socket_path, const std::string& session) {
  CORDON_TRY(addr, socket_address(socket_path));
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return sys_error("connect `{}` (is `cordon serve` running?)", socket_path);
  }
  if (!send_line(sock.get(), {{"cordon", "connect"}, {"session", session}})) {
    return sys_error("send the handshake");
  }
  auto reply = read_line(sock.get(), kMaxHandshake, kHandshakeTimeoutMs);
  json r = reply ? json::parse(*reply, nullptr, false) : json();
  if (!r.is_object() || !r.value("ok", false)) {
    return refusal("the daemon refused: {}",
                   r.is_object() ? r.value("error", "no reason") : "no answer");
  }
  return sock;
}

}  // namespace

int run_mcp_connect(const std::string& socket_path, const std::string& session) {
  auto connected = connect_session(socket_path, session);
  if (!connected) {
    std::fprintf(stderr, "cordon: %s\n", connected.error().message().c_str());
    return 1;
  }
  UniqueFd sock = std::move(*connected);
  // Relay: stdin → socket, socket → stdout, until the daemon closes.
  bool stdin_open = true;
  char buf[65536];
  for (;;) {
    struct pollfd p[2] = {{sock.get(), POLLIN, 0}, {stdin_open ? 0 : -1, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) {
        continue;
      }
      return 1;
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::read(sock.get(), buf, sizeof buf);
      if (n <= 0) {
        return 0;
      }
      for (ssize_t off = 0; off < n;) {
        ssize_t w = ::write(1, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) {
          return 1;
        }
        off += w;
      }
    }
    if (stdin_open && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n <= 0) {
        stdin_open = false;
        ::shutdown(sock.get(), SHUT_WR);  // the session ends; its jobs keep running
        continue;
      }
      for (ssize_t off = 0; off < n;) {
        ssize_t w = ::send(sock.get(), buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
        if (w <= 0) {
          return 1;
        }
        off += w;
      }
    }
  }
}

}  // namespace cordon::api

namespace cordon::api {

Result<json> call_daemon_tool(const std::string& socket_path, const std::string& session,
                              const std::string& tool, const json& arguments) {
  CORDON_TRY(sock, connect_session(socket_path, session));
  auto request = [&](int id, const std::string& method, json params) {
    return send_line(sock.get(),
                     {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
  };
  // The replies to id 1 and 2; notifications in between are skipped.
  auto response = [&](int id) -> Result<json> {
    for (;;) {
      auto line = read_line(sock.get(), 64u << 20, 600000);
      if (!line) {
        return invalid("the daemon closed the connection without answering");
      }
      json m = json::parse(*line, nullptr, false);
      if (m.is_object() && m.contains("id") && m["id"] == id) {
        if (m.contains("error")) {
          return invalid("{}", m["error"].value("message", "JSON-RPC error"));
        }
        return m.value("result", json::object());
      }
    }
  };
  if (!request(1, "initialize",
               {{"protocolVersion", "2025-06-18"},
                {"capabilities", json::object()},
                {"clientInfo", {{"name", "cordon-cli"}, {"version", CORDON_VERSION}}}})) {
    return sys_error("send initialize");
  }
  CORDON_CHECK(response(1));
  send_line(sock.get(), {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  if (!request(2, "tools/call", {{"name", tool}, {"arguments", arguments}})) {
    return sys_error("send tools/call");
  }
  return response(2);
}

}  // namespace cordon::api
