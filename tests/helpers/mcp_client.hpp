#pragma once

// Test helper: the real `cordon mcp` as a subprocess with pipes, spoken to line by line.
// Reads wait on poll with a deadline (no sleeps); stderr goes to a file the test can read.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

extern char** environ;

namespace cordon::test {

class McpProcess {
 public:
  using json = nlohmann::json;

  McpProcess(const std::vector<std::string>& argv, const std::string& stderr_path)
      : stderr_path_(stderr_path) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      return;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    std::vector<char*> av;
    for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    int rc = posix_spawn(&pid_, av[0], &fa, nullptr, av.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
      pid_ = -1;
      ::close(in[1]);
      ::close(out[0]);
      return;
    }
    in_ = in[1];
    out_ = out[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  ~McpProcess() {
    close_stdin();
    if (pid_ > 0 && !exited_) {
      if (!wait_exit(std::chrono::seconds(20))) {
        ::kill(pid_, SIGKILL);
        int st;
        ::waitpid(pid_, &st, 0);
      }
    }
    if (out_ >= 0) ::close(out_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  McpProcess(const McpProcess&) = delete;
  McpProcess& operator=(const McpProcess&) = delete;

  bool started() const { return pid_ > 0; }

  bool send_raw(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::write(in_, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool send(const json& msg) { return send_raw(msg.dump() + "\n"); }

  void close_stdin() {
    if (in_ >= 0) {
      ::close(in_);
      in_ = -1;
    }
  }

  /// The next message, or nullopt at EOF or after the deadline.
  std::optional<json> next(std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded()) {
          return json{{"unparseable", line}};
        }
        return j;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || out_ < 0) return std::nullopt;
      struct pollfd p = {out_, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n <= 0) continue;
      char b[65536];
      ssize_t k = ::read(out_, b, sizeof b);
      if (k <= 0) {
        if (k < 0 && errno == EINTR) continue;
        return std::nullopt;
      }
      buf_.append(b, static_cast<size_t>(k));
    }
  }

  /// Sends a request and returns its response; notifications seen meanwhile are kept.
  std::optional<json> request(const std::string& method, const json& params = nullptr,
                              std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    json id = next_id_++;
    json msg = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    if (!params.is_null()) msg["params"] = params;
    if (!send(msg)) return std::nullopt;
    return response_to(id, deadline);
  }

  std::optional<json> response_to(const json& id,
                                  std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    auto is_it = [&](const json& m) {
      return m.contains("id") && !m.contains("method") && m["id"] == id;
    };
    // One that came while another answer was awaited.
    for (auto it = seen_.begin(); it != seen_.end(); ++it) {
      if (is_it(*it)) {
        json j = *it;
        seen_.erase(it);
        return j;
      }
    }
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto m = next(left);
      if (!m) return std::nullopt;
      if (is_it(*m)) return m;
      seen_.push_back(*m);
    }
  }

  /// A notification already seen or arriving before the deadline that matches `pred`.
  template <class Pred>
  std::optional<json> notification(Pred pred,
                                   std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    for (auto it = seen_.begin(); it != seen_.end(); ++it) {
      if (pred(*it)) {
        json j = *it;
        seen_.erase(it);
        return j;
      }
    }
    auto until = std::chrono::steady_clock::now() + deadline;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto m = next(left);
      if (!m) return std::nullopt;
      if (pred(*m)) return m;
      seen_.push_back(*m);
    }
  }

  const std::deque<json>& seen() const { return seen_; }
  int allocate_id() { return next_id_++; }

  bool wait_exit(std::chrono::milliseconds deadline) {
    if (exited_) return true;
    struct pollfd p = {pidfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(deadline.count())) != 1) return false;
    ::waitpid(pid_, &status_, 0);
    exited_ = true;
    return true;
  }
  int exit_status() const { return status_; }

  std::string stderr_text() const {
    std::ifstream f(stderr_path_);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

 private:
  std::string stderr_path_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, pidfd_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string buf_;
  std::deque<json> seen_;
  int next_id_ = 1;
};

}  // namespace cordon::test
