#pragma once

// One command, start to settle, in the calling process: what `cordon run` does. The caller
// (a small single-threaded process) is the spawner; the supervisor loop runs here too.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "sandbox/prepare.hpp"
#include "sandbox/spec.hpp"

namespace cordon::engine {

struct OneshotRequest {
  sandbox::SandboxSpec spec;
  std::string seccomp_profile_path;
  std::string init_path;
  std::string state_dir;
  uid_t host_id_base = 0x70000000;  // the reserved range of host uids/gids, one per sandbox
  uid_t host_id_count = 65536;
  uint64_t memory_bytes = 0;
  uint64_t pids = 0;
  double cpus = 0;
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds kill_grace{5000};
  uint64_t max_output_bytes = 0;
  int stdin_fd = -1;     // forwarded into the sandbox (not a terminal), or -1 for EOF
  int terminal_fd = -1;  // with spec.tty: the caller's terminal
};

struct OneshotReport {
  // exited, killed, timeout, output-limit, oom, setup-failed, init-died
  std::string state;
  int exit_code = -1;
  int term_signal = 0;
  bool have_wait_status = false;
  int wait_status = 0;
  std::string setup_step;
  int setup_errno = 0;
  std::string message;  // a sentence for humans when not a plain exit
  std::chrono::nanoseconds duration{};
  uint64_t stdout_bytes = 0, stderr_bytes = 0;
  std::string output_limit_stream;
  uint64_t peak_memory_bytes = 0, cpu_usec = 0, oom_kills = 0, pids_max_hits = 0;
  bool usage_known = false;
  std::string cgroup_mode;
  uid_t host_uid = 0;
  sandbox::AppliedFeatures applied;
  std::vector<std::string> argv;  // as exec'd (after `#!` handling)
  bool signalled_by_caller = false;
};

/// Runs the request once. Err only when cordon itself could not set the run up (the
/// message says why and what to do); a command that fails is a normal report.
[[nodiscard]] Result<OneshotReport> run_oneshot(const OneshotRequest& request);

}  // namespace cordon::engine
