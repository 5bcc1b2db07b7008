#pragma once

// Test helper: runs a program with pipes for stdin/stdout/stderr, feeds stdin, collects the
// output and the raw wait status. Waiting is on a pidfd with a deadline (no sleeps); a run
// that outlives the deadline is killed and reported as timed out.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace cordon::test {

struct ProcessResult {
  int wait_status = 0;
  bool timed_out = false;
  std::string out, err;
  int exit_code() const { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1; }
  int term_signal() const { return WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : 0; }
};

struct ProcessOptions {
  std::string input;
  bool close_stdin = true;
  std::chrono::milliseconds deadline{60000};
  std::optional<std::vector<std::string>> env;  // default: inherit
  int stdin_fd = -1;   // use this fd as stdin instead of a pipe (e.g. a pty slave)
  int stdout_fd = -1;  // use this fd as stdout/stderr instead of pipes
};

// Runs `body` (returning a report) in a forked child and returns that report, passed back
// through a pipe, for a test whose setup must not touch the test process (a namespace of the
// child's own, its mounts). A line starting "setup: " is added when the child did not exit 0.
template <typename Body>
inline std::string report_from_child(Body body) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return "setup: pipe2 failed";
  }
  pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return "setup: fork failed";
  }
  if (child == 0) {
    ::close(fds[0]);
    std::string out = body();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) {
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int ws = 0;
  if (::waitpid(child, &ws, 0) != child || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    got += "\nsetup: the child did not exit 0\n";
  }
  return got;
}

// `words` as one shell word each, for pipelines a test runs with bash on the host.
inline std::string shell_words(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) {
    std::string q = "'";
    for (char c : w) {
      q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    s += q + "' ";
  }
  return s;
}

inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const ProcessOptions& opt = {}) {
  ProcessResult r;
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    r.wait_status = -1;
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, opt.stdin_fd >= 0 ? opt.stdin_fd : in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, opt.stdout_fd >= 0 ? opt.stdout_fd : out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, opt.stdout_fd >= 0 ? opt.stdout_fd : err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (opt.stdin_fd >= 0) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  }
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  std::vector<char*> ev;
  if (opt.env) {
    for (const auto& e : *opt.env) ev.push_back(const_cast<char*>(e.c_str()));
    ev.push_back(nullptr);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, av[0], &fa, &attr, av.data(), opt.env ? ev.data() : environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    r.wait_status = -1;
    r.err = std::string("posix_spawn: ") + std::strerror(rc);
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    return r;
  }
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  size_t written = 0;
  int in_fd = in[1];
  if (opt.input.empty() && opt.close_stdin) {
    ::close(in_fd);
    in_fd = -1;
  } else {
    ::fcntl(in_fd, F_SETFL, O_NONBLOCK);
  }
  auto deadline = std::chrono::steady_clock::now() + opt.deadline;
  int fds_open = 2;
  bool exited = false;
  while (fds_open > 0 || !exited) {
    struct pollfd p[4] = {
        {out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {pidfd, POLLIN, 0}, {in_fd, POLLOUT, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    int n = ::poll(p, in_fd >= 0 ? 4 : 3, static_cast<int>(left.count()));
    if (n < 0) {
      continue;
    }
    char buf[65536];
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd >= 0 && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t k = ::read(p[i].fd, buf, sizeof buf);
        if (k > 0) {
          (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(k));
        } else if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
          ::close(i == 0 ? out[0] : err[0]);
          (i == 0 ? out[0] : err[0]) = -1;
          --fds_open;
        }
      }
    }
    if (p[2].revents & POLLIN) {
      exited = true;
    }
    if (in_fd >= 0 && (p[3].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t k = ::write(in_fd, opt.input.data() + written, opt.input.size() - written);
      if (k > 0) written += static_cast<size_t>(k);
      if (k < 0 && errno != EAGAIN) written = opt.input.size();
      if (written == opt.input.size() && opt.close_stdin) {
        ::close(in_fd);
        in_fd = -1;
      }
    }
  }
  if (in_fd >= 0) ::close(in_fd);
  if (out[0] >= 0) ::close(out[0]);
  if (err[0] >= 0) ::close(err[0]);
  ::waitpid(pid, &r.wait_status, 0);
  ::close(pidfd);
  return r;
}

}  // namespace cordon::test
