#pragma once

// The client side of tests/helpers/engine_host.cpp (an Engine in its own process, so a test
// can SIGKILL the engine process itself), and the leftover checks the fault tests share: the
// job cgroups a task id would have, and pidfds that say whether a process is gone.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "helpers/engine_fixture.hpp"
#include "sandbox/cgroup.hpp"
#include "sys/syscalls.hpp"

extern char** environ;

namespace cordon::test {

// engine_host in its own process, driven line by line.
struct EngineHost {
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;

  explicit EngineHost(const EngineEnv& env) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe2");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    EngineOptions o = env.options();
    std::string host = env_or("CORDON_ENGINE_HOST", "build/tests/engine_host");
    std::vector<std::string> args = {host,
                                     o.state_dir,
                                     o.policy_path,
                                     o.spawner_path,
                                     o.init_path,
                                     o.default_seccomp_profile,
                                     std::to_string(o.host_id_base),
                                     std::to_string(o.host_id_count)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = ::posix_spawn(&pid, host.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
      throw std::runtime_error("posix_spawn engine_host: " + std::string(strerror(rc)));
    }
    to = ::fdopen(in[1], "w");
    from = ::fdopen(out[0], "r");
  }
  ~EngineHost() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (to) ::fclose(to);
    if (from) ::fclose(from);
  }
  EngineHost(const EngineHost&) = delete;
  EngineHost& operator=(const EngineHost&) = delete;

  std::string line() {
    char buf[4096];
    if (::fgets(buf, sizeof buf, from) == nullptr) return "EOF";
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string ask(const std::string& cmd) {
    std::fputs((cmd + "\n").c_str(), to);
    std::fflush(to);
    return line();
  }
  void sigkill() {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
  }
};

// The cgroup directories a job (or a `cordon run`) of this name would have, in every
// hierarchy this process's layout uses; only those that exist now.
inline std::vector<std::string> existing_job_cgroups(const std::string& name) {
  auto layout = sandbox::detect_cgroup_layout();
  if (!layout) throw std::runtime_error("detect_cgroup_layout: " + layout.error().message());
  auto paths = sandbox::JobCgroup::paths_for(*layout, name);
  if (!paths) throw std::runtime_error("paths_for: " + paths.error().message());
  std::vector<std::string> out;
  for (const auto& p : *paths) {
    if (std::filesystem::exists(p)) out.push_back(p);
  }
  return out;
}

// pidfds taken while the processes live; alive() polls them (a pidfd turns readable when its
// process exits), so a recycled pid can never be mistaken for a survivor.
struct PidWatch {
  std::vector<std::pair<pid_t, int>> fds;
  explicit PidWatch(const std::vector<pid_t>& pids) {
    for (pid_t p : pids) {
      int fd = sys::pidfd_open(p, 0);
      if (fd >= 0) fds.emplace_back(p, fd);
    }
  }
  ~PidWatch() {
    for (auto& [p, fd] : fds) ::close(fd);
  }
  PidWatch(const PidWatch&) = delete;
  PidWatch& operator=(const PidWatch&) = delete;
  std::vector<pid_t> alive() const {
    std::vector<pid_t> out;
    for (auto& [p, fd] : fds) {
      struct pollfd pfd {
        fd, POLLIN, 0
      };
      if (::poll(&pfd, 1, 0) == 0) out.push_back(p);
    }
    return out;
  }
};

}  // namespace cordon::test
