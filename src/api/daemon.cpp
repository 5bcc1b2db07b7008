#include "api/daemon.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <iterator>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "api/jsonrpc.hpp"
#include "api/mcp.hpp"
#include "base/json_fields.hpp"
#include "base/json_unique.hpp"
#include "base/log.hpp"
#include "base/strings.hpp"
#include "policy/policy.hpp"
#include "base/unique_fd.hpp"
#include "sys/fs.hpp"

namespace cordon::api {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxHandshake = 4096;
constexpr int kHandshakeTimeoutMs = 10000;
// Connections being refused (their first line read, the reason sent) at once, for each kind
// of refusal; beyond this a connection to refuse is closed at once. Each waits this long at most
// for the first line.
constexpr size_t kMaxRefusing = 8;
constexpr int kRefusalReadMs = 2000;

// One line, bounded in size and time: a client that stalls mid-handshake is dropped. The time
// bounds the whole line. Failure fixed: it bounded each wait for more bytes, so a client
// trickling one byte every few seconds held a connection (and its thread) for ever.
// With `overlong`, a line that reaches `max` bytes without its newline is returned as far as it
// was read, and *overlong set; the rest stays in the socket.
std::optional<std::string> read_line(int fd, size_t max, int timeout_ms, bool* overlong = nullptr) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // Peeks, then takes exactly through the newline: what follows the line stays in the socket
  // for whoever reads next (the MCP server after a handshake, a relay), and a line costs a few
  // syscalls rather than two per byte.
  std::string line;
  char buf[64 * 1024];
  while (line.size() < max) {
    struct pollfd p {
      fd, POLLIN, 0
    };
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return std::nullopt;
    }
    // A line of `max` chars or more (before its newline) is refused, as it always was.
    const size_t want = std::min(sizeof buf, max - line.size());
    ssize_t n = ::recv(fd, buf, want, MSG_PEEK);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return std::nullopt;
    }
    const auto* nl = static_cast<const char*>(std::memchr(buf, '\n', static_cast<size_t>(n)));
    const size_t take = nl != nullptr ? static_cast<size_t>(nl - buf) + 1 : static_cast<size_t>(n);
    ssize_t got;
    do {
      got = ::recv(fd, buf, take, 0);
    } while (got < 0 && errno == EINTR);
    if (got != static_cast<ssize_t>(take)) {
      return std::nullopt;  // only this thread reads the socket: the peeked bytes are there
    }
    if (nl != nullptr) {
      line.append(buf, take - 1);
      return line;
    }
    line.append(buf, take);
  }
  if (overlong != nullptr) {
    *overlong = true;
    return line;
  }
  return std::nullopt;
}

// Sends `s` whole (MSG_NOSIGNAL: a closed peer is EPIPE, not a signal).
bool send_all(int fd, const std::string& s) {
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

bool send_line(int fd, const json& j) { return send_all(fd, json_fields::dump(j) + "\n"); }

Result<sockaddr_un> socket_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return invalid("socket path `{}` is longer than {} bytes", path, sizeof addr.sun_path - 1);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// Whether a directory with this owner and mode can be changed only by root or cordon's uid.
bool owned_by_us(const struct stat& st) { return st.st_uid == 0 || st.st_uid == ::geteuid(); }

// The socket's directory must be writable by cordon alone, and so must every directory above
// it: then nobody can swap the path between our checks and bind, or replace the socket (or
// a directory on its way) later. Attack blocked: a symlink another uid owns in /tmp, pointing
// at a root-owned directory, passed a check of the final directory alone; re-pointed later,
// it sent clients (their argv and env) to a daemon of that uid. So the path is walked from /
// one component at a time with O_NOFOLLOW (a symlink anywhere is refused, not resolved: the
// path the daemon checks is the path clients use), and each directory must be owned by root
// or cordon's uid and not writable by group or others — except that a sticky directory (/tmp)
// may be, when the next component is ours (others cannot rename or remove it). The final
// directory is created 0755 when missing.
Result<UniqueFd> open_socket_dir(const std::string& dir) {
  constexpr const char* kWhat =
      "put --socket in a directory only cordon's uid (or root) can write, on a path whose every "
      "directory only they can change, e.g. /run/cordon";
  if (dir.empty() || dir[0] != '/') {
    return invalid("the socket's directory `{}` must be an absolute path", dir);
  }
  std::vector<std::string> parts;
  for (const auto& p : split(dir, '/')) {
    if (p == "..") {
      return invalid("the socket's directory `{}` must not contain `..`; {}", dir, kWhat);
    }
    if (!p.empty() && p != ".") {
      parts.push_back(p);
    }
  }
  UniqueFd cur(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cur) {
    return sys_error("open `/`");
  }
  std::string at = "/";
  struct stat st {};
  if (::fstat(cur.get(), &st) != 0) {
    return sys_error("fstat `/`");
  }
  for (size_t i = 0; i <= parts.size(); ++i) {
    const bool last = i == parts.size();
    // `cur` (at `at`) is a directory; whoever may write it can replace what comes next.
    if (!owned_by_us(st)) {
      return refusal(
          "`{}` on the socket's path is owned by uid {}, who could replace the socket (or a "
          "directory on its way); {}",
          at, st.st_uid, kWhat);
    }
    if ((st.st_mode & 022) != 0) {
      struct stat next {};
      const bool sticky_ok = !last && (st.st_mode & S_ISVTX) != 0 &&
                             ::fstatat(cur.get(), parts[i].c_str(), &next,
                                       AT_SYMLINK_NOFOLLOW) == 0 &&
                             (S_ISLNK(next.st_mode) || owned_by_us(next));  // a link: below
      if (!sticky_ok) {
        return refusal(
            "{} `{}` (owner uid {}, mode {:o}) can be written by others, who could replace the "
            "socket{}; {}",
            last ? "the socket's directory" : "the directory", at, st.st_uid, st.st_mode & 07777,
            last ? "" : " or a directory on its way (sticky, but the next component is not ours)",
            kWhat);
      }
    }
    if (last) {
      break;
    }
    const std::string& name = parts[i];
    const std::string next_at = at == "/" ? "/" + name : at + "/" + name;
    if (i + 1 == parts.size()) {
      // The socket's own directory may be missing: created with its final mode.
      if (::mkdirat(cur.get(), name.c_str(), 0755) != 0 && errno != EEXIST) {
        return sys_error("mkdir `{}` for the socket", next_at);
      }
    }
    UniqueFd next(::openat(cur.get(), name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      struct stat lst {};
      if (::fstatat(cur.get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(lst.st_mode)) {
        return refusal(
            "`{}` on the socket's path is a symlink (owner uid {}), which could be re-pointed "
            "after the daemon starts; give the real path instead; {}",
            next_at, lst.st_uid, kWhat);
      }
      return sys_error("open `{}` on the socket's path", next_at);
    }
    if (::fstat(next.get(), &st) != 0) {
      return sys_error("fstat `{}`", next_at);
    }
    cur = std::move(next);
    at = next_at;
  }
  return cur;
}

// Created with its final mode (umask around bind), in a directory checked above and reached
// through its fd: no window in which the path or its mode is wrong. 0600 when only root and
// cordon's uid are served; 0666 when other uids are (SO_PEERCRED decides). Bound under a
// temporary name and renamed into place once it listens, so the path never names a socket
// that refuses connections (a client polling for it sees ENOENT, then a daemon), and a stale
// socket from a killed daemon is replaced in one step.
struct Listening {
  UniqueFd fd;
  UniqueFd dir;      // the checked directory: the socket is removed through it, not the path
  std::string name;  // the socket's name in `dir`
  std::string dir_path;
  dev_t dev = 0;  // the socket file bound, so a stop never removes another daemon's socket
  ino_t ino = 0;

  // At a stop: removes the socket, if the name still is the one this daemon bound.
  void remove() const {
    struct stat st {};
    if (dir && ::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == dev && st.st_ino == ino) {
      (void)::unlinkat(dir.get(), name.c_str(), 0);
    }
  }
};

Result<Listening> listen_on(const std::string& path, bool others) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos || slash + 1 == path.size()) {
    return invalid("--socket `{}` must be an absolute path to a file", path);
  }
  std::string dir = slash == 0 ? "/" : path.substr(0, slash), name = path.substr(slash + 1);
  CORDON_TRY(dfd, open_socket_dir(dir));
  std::string via = fmt::format("/proc/self/fd/{}/{}", dfd.get(), name);
  CORDON_TRY(addr, socket_address(via));
  std::string tmp = fmt::format(".{}.{}.tmp", name, ::getpid());
  CORDON_TRY(tmp_addr, socket_address(fmt::format("/proc/self/fd/{}/{}", dfd.get(), tmp)));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    return sys_error("socket");
  }
  struct stat st {};
  if (::fstatat(dfd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return refusal("`{}` exists and is not a socket; choose another --socket", path);
    }
    // A live daemon answers; a stale socket file from a killed one is replaced below.
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return refusal("a daemon already listens on `{}`", path);
    }
  }
  // Left by a daemon of this pid that was killed between bind and rename (pids recycle).
  if (::unlinkat(dfd.get(), tmp.c_str(), 0) != 0 && errno != ENOENT) {
    return sys_error("unlink the stale `{}/{}`", dir, tmp);
  }
  mode_t old = ::umask(others ? 0111 : 0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&tmp_addr), sizeof tmp_addr);
  int err = errno;
  ::umask(old);
  if (rc != 0) {
    return errno_error(err, "bind `{}/{}`", dir, tmp);
  }
  if (::listen(fd.get(), 128) != 0 ||
      ::renameat(dfd.get(), tmp.c_str(), dfd.get(), name.c_str()) != 0) {
    err = errno;
    (void)::unlinkat(dfd.get(), tmp.c_str(), 0);
    return errno_error(err, "listen on `{}/{}` and rename it to `{}`", dir, tmp, path);
  }
  Listening l;
  struct stat bound {};
  if (::fstatat(dfd.get(), name.c_str(), &bound, AT_SYMLINK_NOFOLLOW) != 0) {
    return sys_error("fstat the socket `{}`", path);
  }
  l.fd = std::move(fd);
  l.dir = std::move(dfd);
  l.name = name;
  l.dir_path = dir;
  l.dev = bound.st_dev;
  l.ino = bound.st_ino;
  return l;
}

// systemd socket activation (sd_listen_fds(3)): fd 3 when LISTEN_PID is this process.
Result<std::optional<UniqueFd>> activated_socket() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (pid == nullptr || fds == nullptr || std::to_string(::getpid()) != pid) {
    return std::optional<UniqueFd>();
  }
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (std::string(fds) != "1") {
    return invalid("LISTEN_FDS={}: the socket unit must pass exactly one socket", fds);
  }
  int domain = 0, type = 0, listening = 0;
  socklen_t len = sizeof(int);
  if (::getsockopt(3, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) {
    return sys_error("getsockopt SO_DOMAIN on the activated fd 3");
  }
  len = sizeof(int);
  ::getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len);
  len = sizeof(int);
  ::getsockopt(3, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
  if (domain != AF_UNIX || type != SOCK_STREAM || !listening) {
    return invalid(
        "the activated fd 3 is not a listening unix stream socket (ListenStream=PATH in the "
        "socket unit)");
  }
  if (::fcntl(3, F_SETFD, FD_CLOEXEC) != 0) {
    return sys_error("fcntl FD_CLOEXEC on the activated fd 3");
  }
  return std::optional<UniqueFd>(UniqueFd(3));
}

// The real directory of an activated socket's path, if it has one (not an abstract socket).
std::optional<std::string> activated_socket_dir(int fd) {
  sockaddr_un addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      len <= offsetof(sockaddr_un, sun_path) || addr.sun_path[0] == '\0') {
    return std::nullopt;
  }
  std::string path(addr.sun_path, strnlen(addr.sun_path, sizeof addr.sun_path));
  auto slash = path.rfind('/');
  if (slash == std::string::npos) {
    return std::nullopt;
  }
  char real[PATH_MAX];
  std::string dir = slash == 0 ? "/" : path.substr(0, slash);
  if (::realpath(dir.c_str(), real) == nullptr) {
    return dir;
  }
  return std::string(real);
}

// What the first line of a connection asked for.
struct Hello {
  std::optional<std::string> name;  // a named session; unset: one for this connection only
  std::string first_message;        // a JSON-RPC message sent without a handshake
  std::string error;
  bool reply = true;  // the handshake is answered; a bare JSON-RPC start is not
};

Hello parse_hello(const std::optional<std::string>& line) {
  Hello h;
  const std::string kFormat = fmt::format(
      "the first line must be {{\"cordon\": \"connect\", \"session\": \"NAME\"}} (NAME: {}; "
      "without \"session\" the session ends with the connection) or a JSON-RPC message",
      kSessionNameRule);
  if (!line) {
    h.error = "no first line within the handshake time";
    return h;
  }
  // A key twice (`"session": "a", "session": "b"`) is refused, not read as its last value: a
  // proxy in front of the daemon may have read the first (base/json_unique.hpp). A JSON-RPC
  // first message goes to the MCP server whole, which refuses it there with its id.
  UniqueKeysParse parsed = parse_unique_keys(*line);
  json& j = parsed.value;
  if (!j.is_object()) {
    h.error = kFormat;
    return h;
  }
  if (!parsed.duplicate.empty() && !j.contains("jsonrpc")) {
    h.error = fmt::format("the key `{}` appears twice in the first line; write each key once ({})",
                          escape_controls(parsed.duplicate.substr(0, 64), ""), kFormat);
    return h;
  }
  if (j.contains("jsonrpc")) {
    h.first_message = *line;
    h.reply = false;
    return h;
  }
  if (j.value("cordon", json()) != "connect") {
    h.error = kFormat;
    return h;
  }
  if (j.contains("session")) {
    if (!j["session"].is_string() || !valid_session(j["session"].get<std::string>())) {
      h.error = kFormat;
      return h;
    }
    h.name = j["session"].get<std::string>();
  }
  return h;
}

std::string random_hex() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != sizeof v) {
    v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return fmt::format("{:016x}", v);
}

struct Connection {
  UniqueFd fd;
  std::thread thread;
  std::atomic<bool> done{false};
  uid_t uid = 0;
};

}  // namespace

// Whether `session` is an unnamed session as serve_connection names one: exactly
// `u<uid>.conn-<16 hex digits>`. A named session may hold `.conn-` too (`u1000-ci.conn-1`):
// the whole form is matched, never a part of it. Failure fixed (a review of session 14's
// change): a substring match would have ended such a named session at the next start.
bool is_connection_session(const std::string& session) {
  size_t dot = session.find('.');
  if (session.size() < 2 || session[0] != 'u' || dot == std::string::npos || dot < 2) {
    return false;
  }
  for (size_t i = 1; i < dot; ++i) {
    if (session[i] < '0' || session[i] > '9') {
      return false;
    }
  }
  const std::string_view rest = std::string_view(session).substr(dot);
  constexpr std::string_view kConn = ".conn-";
  if (!rest.starts_with(kConn) || rest.size() != kConn.size() + 16) {
    return false;
  }
  return std::all_of(rest.begin() + kConn.size(), rest.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

namespace {

// The policy's `daemon` section. The engine loads the same file for everything else.
Result<policy::DaemonPolicy> daemon_policy(const std::string& policy_path) {
  if (policy_path.empty()) {
    return policy::DaemonPolicy{};
  }
  // A regular file only, opened without waiting: a FIFO there hung the daemon's start (found
  // by a review, session 29). The engine loads the same file with the same check.
  auto text = read_small_file(policy_path, 16 << 20);
  if (!text) {
    if (errno == EINVAL) {
      return invalid("read the policy `{}`: not a regular file", policy_path);
    }
    return sys_error("read the policy `{}`", policy_path);
  }
  CORDON_TRY_CTX(p, policy::parse_policy(*text), "policy `{}`", policy_path);
  return p.daemon;
}

// An unnamed session ends with its connection (Engine::end_session): its running jobs are
// killed, all signalled under one engine lock before any of them settles, and once they
// settled every record of the session is removed, its index rewritten once. Failure fixed (a
// review, session 13): the records stayed, in a session no client can name again, counted
// against the policy's job quota: a uid that started jobs unnamed and left (or a `cordon run
// --socket` interrupted) filled the quota, and every uid's start was refused with advice
// ("remove settled jobs") nobody could follow. A job that does not settle within the bound
// (its kill grace is longer) keeps its record, for retention.
constexpr std::chrono::milliseconds kEndSessionSettle{15000};

// The connection's first line: a handshake (at most kMaxHandshake bytes) or a JSON-RPC message,
// which may be as long as any other (jsonrpc::kMaxLineBytes), all within the handshake time.
// Failure fixed (a red-team review, session 38): an `initialize` of 5 KB sent without a
// handshake was answered "no first line within the handshake time" and the connection closed.
Hello read_hello(int fd) {
  const auto start = std::chrono::steady_clock::now();
  bool overlong = false;
  auto line = read_line(fd, kMaxHandshake, kHandshakeTimeoutMs, &overlong);
  if (!line || !overlong) {
    return parse_hello(line);
  }
  const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  bool still_overlong = false;
  auto rest = read_line(fd, jsonrpc::kMaxLineBytes - line->size(),
                        static_cast<int>(std::max<int64_t>(kHandshakeTimeoutMs - spent.count(), 1)),
                        &still_overlong);
  Hello h;
  if (!rest) {
    h.error = "no whole first line within the handshake time";
    return h;
  }
  if (still_overlong) {
    h.error = fmt::format("the first line is longer than {} bytes; send smaller messages",
                          jsonrpc::kMaxLineBytes);
    return h;
  }
  std::string whole = std::move(*line) + *rest;
  // Parsed here only within the bounds every line of the MCP server has (it took a daemon to
  // 1.1 GB for 15 MB of `[`: a review, session 38); beyond them it goes to the server as its
  // first message, which refuses it there without parsing it.
  if (jsonrpc::over_parse_bounds(whole)) {
    h.first_message = std::move(whole);
    h.reply = false;
    return h;
  }
  h = parse_hello(whole);
  if (h.error.empty() && h.reply) {
    h = Hello{};
    h.error = fmt::format("the handshake line is longer than {} bytes", kMaxHandshake);
  }
  return h;
}

void serve_connection(int fd, uid_t uid, const std::shared_ptr<Engine>& engine,
                      const ConnectionLimits& limits, const std::shared_ptr<log::Logger>& log) {
  Hello hello = read_hello(fd);
  if (!hello.error.empty()) {
    send_line(fd, {{"ok", false}, {"error", hello.error}});
    return;
  }
  // Sessions are scoped by the peer's uid: one user never sees another's jobs. A named one
  // is `u<uid>-NAME`; an unnamed one `u<uid>.conn-<random>`, which no name can spell.
  std::string session = hello.name ? fmt::format("u{}-{}", uid, *hello.name)
                                   : fmt::format("u{}.conn-{}", uid, random_hex());
  if (hello.reply && !send_line(fd, {{"ok", true}, {"session", session}})) {
    return;
  }
  log->info("connection: session `{}`{}", session, hello.name ? "" : " (ends with it)");
  int code = serve_mcp_connection(engine, session, fd, fd, limits, hello.first_message);
  if (!hello.name) {
    if (auto ended = engine->end_session(session, kEndSessionSettle); !ended) {
      log->warn("session `{}` ended; its records could not all be removed: {}", session,
                ended.error().message());
    }
  }
  log->info("connection closed{}: session `{}`", code != 0 ? " by a limit" : "", session);
}

}  // namespace

int run_daemon(const DaemonOptions& options) {
  auto log = log::stderr_logger("daemon");
  // Failure fixed (a review, session 13): under systemd's default soft limit of 1024 fds, 992
  // queued jobs (each holds its executable's fd) made every other start and listing fail with
  // EMFILE. The soft limit goes up to the hard one, as far as the kernel lets an unprivileged
  // process go; the sandboxes get their own limit (spec.hpp) whatever this one is.
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) {
    log->warn("getrlimit RLIMIT_NOFILE: {}", errno_name(errno));
  } else if (nofile.rlim_cur < nofile.rlim_max) {
    rlim_t was = nofile.rlim_cur;
    nofile.rlim_cur = nofile.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      log->warn("setrlimit RLIMIT_NOFILE to {}: {}", nofile.rlim_max, errno_name(errno));
    } else {
      log->info("open-file limit raised from {} to {}", was, nofile.rlim_max);
    }
  }
  auto settings = daemon_policy(options.engine.policy_path);
  if (!settings) {
    log->error("cannot start: {}", settings.error().message());
    return 1;
  }
  std::set<uid_t> allowed(options.allowed_uids.begin(), options.allowed_uids.end());
  allowed.insert(settings->allowed_uids.begin(), settings->allowed_uids.end());
  bool others = !allowed.empty();
  allowed.insert(0);
  allowed.insert(::geteuid());
  std::string path =
      options.socket_path.empty() ? options.engine.state_dir + "/daemon.sock" : options.socket_path;
  // Signals arrive on a signalfd so the accept loop can stop cleanly.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  UniqueFd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC));
  if (!sigfd) {
    log->error("signalfd: {}", errno_name(errno));
    return 1;
  }
  // The listener comes first, while this process has one thread (bind changes the umask).
  auto activated = activated_socket();
  if (!activated) {
    log->error("cannot use the activated socket: {}", activated.error().message());
    return 1;
  }
  bool own_socket = !activated->has_value();
  UniqueFd listener;
  Listening own;
  if (own_socket) {
    if (!options.engine.state_dir.empty()) {
      ::mkdir(options.engine.state_dir.c_str(), 0700);  // the default socket lives in it
    }
    if (others) {
      // Failure fixed (the same review): the default socket lives in the 0700 state dir, so
      // the uids the policy serves got EACCES from connect and the daemon said nothing. Said
      // before the socket appears, so whoever waits for it finds the warning already logged.
      for (std::string dir = path.substr(0, path.rfind('/')); !dir.empty();
           dir = dir.substr(0, dir.rfind('/'))) {
        struct stat st {};
        if (::stat(dir.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
          log->warn(
              "the socket `{}` is in `{}` (mode {:04o}), which other users may not search: the "
              "other uids this daemon serves cannot connect unless a group lets them; give "
              "--socket a path they can reach, e.g. /run/cordon.sock",
              path, dir, st.st_mode & 07777);
          break;
        }
      }
    }
    auto l = listen_on(path, others);
    if (!l) {
      log->error("cannot listen: {}", l.error().message());
      return 1;
    }
    own = std::move(*l);
    listener = std::move(own.fd);
  } else {
    listener = std::move(**activated);
    path = "(socket activation)";
  }
  // A socket in a directory jobs can write is one a job can replace (unlink, bind its own):
  // the engine refuses a policy whose cwdRoot contains the socket's directory.
  EngineOptions engine_options = options.engine;
  // Sessions are `u<uid>-NAME` and `u<uid>.conn-…` (serve_connection): the uid owns them all,
  // for the policy's concurrency.perUid.
  engine_options.session_owner = [](const std::string& session) {
    return session.substr(0, session.find_first_of("-."));
  };
  if (own_socket) {
    auto real = sys::fd_path(own.dir.get());
    engine_options.job_unwritable_paths.push_back(real ? *real : own.dir_path);
  } else if (auto dir = activated_socket_dir(listener.get())) {
    engine_options.job_unwritable_paths.push_back(*dir);
  }
  auto engine = Engine::open(engine_options);
  if (!engine) {
    log->error("cannot start: {}", engine.error().message());
    own.remove();
    return 1;
  }
  for (const auto& w : (*engine)->warnings()) {
    log->warn("{}", w);
  }
  std::shared_ptr<Engine> shared(std::move(*engine));
  // Unnamed sessions (`u<uid>.conn-…`) end with their connection; those of a daemon that died
  // (SIGKILL, a crash) never saw it end, and no client can name them: their jobs, abandoned by
  // the open above, would count against quotas.maxJobs for good. Failure fixed (a review,
  // session 14): after a daemon restart they filled the quota, and every start was refused
  // with advice nobody could follow.
  if (auto sessions = shared->sessions(); !sessions) {
    log->warn("the sessions of the last run could not be listed: {}", sessions.error().message());
  } else {
    for (const auto& session : *sessions) {
      if (!is_connection_session(session)) {
        continue;
      }
      auto ended = shared->end_session(session, std::chrono::milliseconds(0));
      if (!ended) {
        log->warn("the unnamed session `{}` of the last run: {}", session, ended.error().message());
      } else {
        log->info("the unnamed session `{}` of the last run ended: {} jobs removed", session,
                  *ended);
      }
    }
  }
  ConnectionLimits limits;
  limits.idle_timeout = std::chrono::milliseconds(settings->idle_timeout_ms);
  limits.stall_timeout = std::chrono::milliseconds(settings->stall_timeout_ms);
  size_t max_connections = std::min<size_t>(options.max_connections, settings->max_connections);
  size_t per_uid = settings->max_connections_per_uid;
  // The calls in flight of each uid other than root and the daemon's own, over all its
  // connections (ConnectionLimits::uid_calls). Kept for the daemon's life: a few bytes a uid.
  std::map<uid_t, std::shared_ptr<CallBudget>> uid_calls;
  // The uids those per-uid bounds hold: all but root and the daemon's own.
  auto bounded_uid = [](uid_t uid) { return uid != 0 && uid != ::geteuid(); };
  log->info("listening on `{}`; state dir `{}`", path, options.engine.state_dir);

  // Served connections count against maxConnections; refusals (a uid not served, a daemon
  // full) have a small bound of their own. Failure fixed: a refused uid's connection took a
  // served slot (and a thread waiting 10 s for its first line), so eight of them filled a
  // daemon of maxConnections 8 and every legitimate client was turned away.
  // The two kinds of refusal are bounded apart, so refused uids cannot keep a full daemon from
  // telling an allowed client why it is turned away.
  std::list<std::unique_ptr<Connection>> conns, refused_uids, refused_full;
  auto reap = [](std::list<std::unique_ptr<Connection>>& list, bool all) {
    if (all) {
      // Every socket first, then the joins: an ended unnamed session waits for its killed jobs
      // to settle (end_session), and those waits run side by side, not one after another (a
      // review, session 13: N connections took N kill graces, past systemd's stop timeout).
      for (auto& c : list) {
        ::shutdown(c->fd.get(), SHUT_RDWR);  // its reader sees EOF and ends
      }
    }
    for (auto it = list.begin(); it != list.end();) {
      if (all || (*it)->done) {
        (*it)->thread.join();
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  for (;;) {
    struct pollfd p[2] = {{listener.get(), POLLIN, 0}, {sigfd.get(), POLLIN, 0}};
    if (::poll(p, 2, 1000) < 0 && errno != EINTR) {
      log->error("poll: {}", errno_name(errno));
      break;
    }
    reap(conns, false);
    reap(refused_uids, false);
    reap(refused_full, false);
    if (p[1].revents & POLLIN) {
      log->info("signal received: closing every connection and stopping");
      break;
    }
    if (!(p[0].revents & POLLIN)) {
      continue;
    }
    int c = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      continue;
    }
    UniqueFd cfd(c);
    // A client that stops reading must not hold a writer forever: a send blocked this long
    // fails and the connection closes.
    struct timeval tv {
      static_cast<time_t>(limits.stall_timeout.count() / 1000),
          static_cast<suseconds_t>((limits.stall_timeout.count() % 1000) * 1000)
    };
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct ucred cred {};
    socklen_t len = sizeof cred;
    std::string refused;
    auto* refusals = &refused_uids;
    if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        allowed.count(cred.uid) == 0) {
      refused = fmt::format(
          "uid {} may not use this daemon; ask its operator to add {} to the policy's "
          "daemon.allowedUids",
          cred.uid, cred.uid);
    } else if (conns.size() >= max_connections) {
      refused =
          fmt::format("the daemon serves {} connections already; retry later", max_connections);
      refusals = &refused_full;
    } else if (bounded_uid(cred.uid)) {
      // Failure fixed (a review, session 13): one allowed uid's idle connections (a ping an
      // hour keeps each) took every slot, and root and every other uid were turned away.
      size_t mine = 0;
      for (const auto& other : conns) {
        mine += other->uid == cred.uid && !other->done ? 1 : 0;
      }
      if (mine >= per_uid) {
        refused = fmt::format(
            "uid {} holds {} connections to this daemon already, the most one uid may "
            "(daemon.maxConnectionsPerUid); close one, or share one connection between calls",
            cred.uid, mine);
        refusals = &refused_full;
      } else if (max_connections > 1 && conns.size() + 1 >= max_connections) {
        refused = fmt::format(
            "the daemon serves {} connections already and keeps the last of its {} for root; "
            "retry later",
            conns.size(), max_connections);
        refusals = &refused_full;
      }
    }
    if (!refused.empty()) {
      if (refusals->size() >= kMaxRefusing) {
        continue;  // closed at once: refusals in flight are bounded, the served slots untouched
      }
      auto conn = std::make_unique<Connection>();
      conn->fd = std::move(cfd);
      Connection* raw = conn.get();
      try {
        conn->thread = std::thread([raw, log, refused] {
          // Read the client's first line before answering: closing a socket with unread input
          // resets it, and the client would never see why (it saw EPIPE at its handshake).
          (void)read_line(raw->fd.get(), kMaxHandshake, kRefusalReadMs);
          send_line(raw->fd.get(), {{"ok", false}, {"error", refused}});
          log->warn("refused a connection: {}", refused);
          raw->done = true;
        });
      } catch (const std::system_error&) {
        continue;  // no thread: closed at once
      }
      refusals->push_back(std::move(conn));
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->fd = std::move(cfd);
    conn->uid = cred.uid;
    Connection* raw = conn.get();
    uid_t uid = cred.uid;
    ConnectionLimits conn_limits = limits;
    if (bounded_uid(uid)) {
      auto& budget = uid_calls[uid];
      if (!budget) {
        budget = std::make_shared<CallBudget>(settings->max_calls_per_uid);
      }
      conn_limits.uid_calls = budget;
    }
    // The connection's thread. One the system refuses (EAGAIN: RLIMIT_NPROC, the pids limit
    // of the daemon's cgroup) turns the client away; std::thread's exception would end the
    // daemon and every session with it.
    try {
      conn->thread = std::thread([raw, uid, shared, conn_limits, log] {
        serve_connection(raw->fd.get(), uid, shared, conn_limits, log);
        raw->done = true;
      });
    } catch (const std::system_error& e) {
      log->warn("turned a connection away: no thread for it ({})", e.code().message());
      send_line(conn->fd.get(),
                {{"ok", false},
                 {"error", fmt::format("the daemon cannot start a thread for this connection "
                                       "({}); retry once others closed",
                                       e.code().message())}});
      continue;
    }
    conns.push_back(std::move(conn));
  }
  reap(conns, true);
  reap(refused_uids, true);
  reap(refused_full, true);
  listener.reset();
  own.remove();
  return 0;
}

namespace {

// Connects to the daemon and performs the handshake; the error says what to do.
// `then`: lines sent with the handshake, in the same send, before its reply is read (the
// daemon reads the handshake line exactly and leaves what follows to the MCP server).
Result<UniqueFd> connect_session(const std::string& socket_path, const std::string& session,
                                 const std::string& then = "") {
  CORDON_TRY(addr, socket_address(socket_path));
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return sys_error("connect `{}` (is `cordon serve` running?)", socket_path);
  }
  // Whoever could change the socket's path may have put a socket of their own there (a
  // symlink in /tmp re-pointed, a directory renamed away): the handshake, then argv and env,
  // go only to a daemon run by root or by this uid. The kernel's word, not the peer's.
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return sys_error("getsockopt SO_PEERCRED on `{}`", socket_path);
  }
  if (cred.uid != 0 && cred.uid != ::geteuid()) {
    return refusal(
        "`{}` is served by uid {} (pid {}), neither root nor you (uid {}): not a daemon to "
        "trust, so nothing was sent. Someone who can write a directory on that path may have "
        "replaced the socket; use a daemon whose socket lies where only root or you can write "
        "(e.g. /run/cordon/daemon.sock)",
        socket_path, cred.uid, cred.pid, ::geteuid());
  }
  json hello = {{"cordon", "connect"}};
  if (!session.empty()) {
    hello["session"] = session;  // named: outlives the connection
  }
  // A daemon that refuses (full, or not serving this uid) may have answered and closed before
  // the handshake went out: its reason is still read, rather than reporting only EPIPE.
  const bool sent = send_all(sock.get(), json_fields::dump(hello) + "\n" + then);
  const int send_errno = errno;
  auto reply = read_line(sock.get(), kMaxHandshake, kHandshakeTimeoutMs);
  json r = reply ? json::parse(*reply, nullptr, false) : json();
  if (!json_fields::boolean(r, "ok")) {
    if (!r.is_object() && !sent) {
      return errno_error(send_errno, "send the handshake to `{}`", socket_path);
    }
    return refusal("the daemon refused: {}",
                   r.is_object() ? json_fields::str(r, "error", "no reason") : "no answer");
  }
  return sock;
}

}  // namespace

int run_mcp_connect(const std::string& socket_path, const std::string& session) {
  auto connected = connect_session(socket_path, session);
  if (!connected) {
    std::fprintf(stderr, "cordon: %s\n", escape_controls(connected.error().message()).c_str());
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

Result<DaemonClient> DaemonClient::connect(const std::string& socket_path,
                                           const std::string& session) {
  // The MCP initialize goes out with the handshake, in one send: a run through the daemon
  // waits for one round trip before its tool calls, not two. notifications/initialized
  // follows its answer, as MCP orders them (it waits for nothing).
  const json initialize = {
      {"jsonrpc", "2.0"},
      {"id", 1},
      {"method", "initialize"},
      {"params",
       {{"protocolVersion", "2025-06-18"},
        {"capabilities", json::object()},
        {"clientInfo", {{"name", "cordon-cli"}, {"version", CORDON_VERSION}}}}}};
  CORDON_TRY(sock, connect_session(socket_path, session, json_fields::dump(initialize) + "\n"));
  DaemonClient c(std::move(sock));
  c.next_id_ = 2;
  CORDON_CHECK(c.reply(1, "initialize"));
  if (!send_line(c.sock_.get(), {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}})) {
    return sys_error("send notifications/initialized");
  }
  return c;
}

Result<json> DaemonClient::request(const std::string& method, const json& params) {
  const int64_t id = next_id_++;
  if (!send_line(sock_.get(),
                 {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}})) {
    return sys_error("send {}", method);
  }
  return reply(id, method);
}

Result<json> DaemonClient::reply(int64_t id, const std::string& method) {
  // The reply to `id`; notifications in between are skipped.
  for (;;) {
    auto line = read_line(sock_.get(), 64u << 20, 600000);
    if (!line) {
      return invalid("the daemon closed the connection without answering {}", method);
    }
    json m = json::parse(*line, nullptr, false);
    if (m.is_object() && m.contains("id") && m["id"] == id) {
      // The daemon's reply is peer data: read with its types checked (json_fields).
      if (m.contains("error")) {
        return invalid(
            "{}", json_fields::str(json_fields::object(m, "error"), "message", "JSON-RPC error"));
      }
      return json_fields::object(m, "result");
    }
  }
}

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

Result<void> check_text_arguments(const json& arguments) {
  if (auto bad = json_fields::first_non_utf8(arguments)) {
    return refusal(
        "{} is not UTF-8, and the daemon's JSON carries only text: it would arrive changed "
        "(U+FFFD). Give it as UTF-8; a command whose arguments must be such bytes runs with "
        "`cordon run` without --socket, which passes them as given",
        *bad);
  }
  return {};
}

Result<json> DaemonClient::call(const std::string& tool, const json& arguments) {
  // Failure fixed: bytes that are not UTF-8 (a Latin-1 file name, say) went out as U+FFFD,
  // so the daemon ran another argv than the one asked for. Refused here, before anything runs.
  CORDON_CHECK(check_text_arguments(arguments));
  return request("tools/call", {{"name", tool}, {"arguments", arguments}});
}

Result<json> call_daemon_tool(const std::string& socket_path, const std::string& session,
                              const std::string& tool, const json& arguments) {
  CORDON_TRY(client, DaemonClient::connect(socket_path, session));
  return client.call(tool, arguments);
}

}  // namespace cordon::api
