#include "engine/oneshot.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>

#include "engine/supervise.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/spawn.hpp"
#include "sandbox/status.hpp"
#include "sandbox/userns.hpp"
#include "sys/syscalls.hpp"

namespace cordon::engine {
namespace {

std::string job_name() {
  return fmt::format("run-{}-{}", ::getpid(),
                     std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

Result<OneshotReport> run_oneshot(const OneshotRequest& req) {
  OneshotReport report;

  // Seccomp: the profile is data, compiled once here; the init gets its own fixed filter.
  CORDON_TRY(profile, policy::load_seccomp_profile(req.seccomp_profile_path));
  sandbox::SeccompOptions sopts;
  sopts.allow_ptrace = req.spec.allow_ptrace;
  CORDON_TRY_CTX(filters, sandbox::compile_filters(profile, sopts), "compile seccomp profile `{}`",
                 req.seccomp_profile_path);
  CORDON_TRY_CTX(init_filter, sandbox::compile_init_filter(), "compile the init's filter");

  // Leftovers of a cordon that was SIGKILLed: swept before we add our own.
  CORDON_TRY(records, sandbox::CgroupRecords::open(req.state_dir + "/cgroups"));
  (void)records.sweep();

  CORDON_TRY_CTX(layout, sandbox::detect_cgroup_layout(), "find the cgroup hierarchies");
  report.cgroup_mode = layout.mode == sandbox::CgroupMode::kUnified ? "v2" : "hybrid";
  CORDON_CHECK_CTX(sandbox::prepare_parents(layout), "prepare cordon's cgroups");
  sandbox::CgroupLimits limits;
  limits.memory_bytes = req.memory_bytes;
  limits.pids = req.pids;
  limits.cpus = req.cpus;
  std::string name = job_name();
  // Recorded before it exists: a cordon killed at any later point leaves a record to sweep.
  CORDON_TRY(paths, sandbox::JobCgroup::paths_for(layout, name));
  CORDON_TRY_CTX(record, records.add(name, paths), "record job cgroup");
  CORDON_TRY_CTX(cgroup, sandbox::JobCgroup::create(layout, name, limits), "create job cgroup");

  CORDON_TRY(lease, sandbox::HostIdLease::acquire(req.state_dir + "/uids", req.host_id_base,
                                                  req.host_id_count));
  report.host_uid = lease.id();

  sandbox::SeccompPrograms programs{filters.profile.insns, filters.fixed.insns, init_filter.insns};
  CORDON_TRY(prepared,
             sandbox::PreparedSandbox::prepare(req.spec, programs, lease.id(), req.init_path));
  report.applied = prepared->applied();
  for (const auto& w : filters.warnings) {
    report.applied.warnings.push_back("seccomp: " + w);
  }
  report.argv = prepared->final_argv();

  sandbox::SpawnOptions sp;
  sp.host_id = lease.id();
  sp.cgroup_fd = cgroup.v2_dirfd();
  sp.cgroupns_at_clone = layout.mode == sandbox::CgroupMode::kUnified;
  sp.network_namespace = req.spec.network == sandbox::NetworkMode::kNone;
  if (layout.mode == sandbox::CgroupMode::kHybrid) {
    sp.before_go = [&cgroup](pid_t pid) -> Result<void> { return cgroup.place_v1(pid); };
  }
  auto start = std::chrono::steady_clock::now();
  CORDON_TRY(spawned, sandbox::spawn_sandbox(*prepared, sp));

  SandboxHandles handles;
  handles.pidfd = std::move(spawned.pidfd);
  handles.status = std::move(prepared->status_parent);
  handles.stdout_read = std::move(prepared->stdout_read);
  handles.stderr_read = std::move(prepared->stderr_read);
  handles.stdin_write = std::move(prepared->stdin_write);
  SuperviseOptions so;
  so.timeout = req.timeout;
  so.kill_grace = req.kill_grace;
  so.max_output_bytes = req.max_output_bytes;
  so.stdin_fd = req.stdin_fd;
  so.tty = req.spec.tty;
  so.terminal_fd = req.terminal_fd;
  int init_pidfd = handles.pidfd.get();
  KillHooks hooks;
  hooks.signal_init = [init_pidfd](int sig) {
    (void)sys::pidfd_send_signal(init_pidfd, sig, nullptr, 0);
  };
  hooks.kill_all = [init_pidfd, &cgroup] {
    // Both: the cgroup reaches every process; SIGKILL of PID 1 ends the pid namespace.
    (void)cgroup.kill();
    (void)sys::pidfd_send_signal(init_pidfd, SIGKILL, nullptr, 0);
  };
  auto outcome = supervise(handles, so, hooks);
  // Whatever happened, nothing of the sandbox outlives this function.
  hooks.kill_all();
  siginfo_t info{};
  (void)::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(init_pidfd), &info, WEXITED);
  report.duration = std::chrono::steady_clock::now() - start;
  if (!outcome) {
    return std::unexpected(std::move(outcome.error()).wrap("supervise the sandbox"));
  }
  auto usage = cgroup.usage();
  if (usage) {
    report.usage_known = true;
    report.peak_memory_bytes = usage->peak_memory_bytes;
    report.cpu_usec = usage->cpu_usec;
    report.oom_kills = usage->oom_kills;
    report.pids_max_hits = usage->pids_max_hits;
  }
  CORDON_CHECK_CTX(cgroup.destroy(), "remove job cgroup");
  CORDON_CHECK_CTX(record.remove(), "remove the job's cgroup record");

  const Outcome& o = *outcome;
  report.state = run_state_name(o.state);
  report.have_wait_status = o.have_wait_status;
  report.wait_status = o.wait_status;
  report.exit_code = o.exit_code;
  report.term_signal = o.term_signal;
  report.stdout_bytes = o.stdout_bytes;
  report.stderr_bytes = o.stderr_bytes;
  report.output_limit_stream = o.output_limit_stream;
  report.signalled_by_caller = o.signalled_by_caller;
  // The command itself was OOM-killed: SIGKILL and the cgroup counted an OOM kill. A
  // grandchild's OOM kill while the command exits normally stays `exited`, with oomKills.
  if (o.state == RunState::kKilled && o.term_signal == SIGKILL && report.oom_kills > 0) {
    report.state = "oom";
    report.message = fmt::format("the command was killed by the OOM killer (memory limit {} bytes)",
                                 req.memory_bytes);
  }
  if (o.state == RunState::kSetupFailed) {
    report.setup_step = sandbox::step_name(o.failed_step);
    report.setup_errno = o.setup_errno;
    report.message =
        fmt::format("sandbox setup failed: {}: {}", report.setup_step, errno_name(o.setup_errno));
    if (o.failed_step == sandbox::SetupStep::kCwd && o.setup_errno == ESTALE) {
      report.message += " (the working directory changed after it was checked; retry)";
    }
    if (o.failed_step == sandbox::SetupStep::kCommandExec) {
      report.message =
          fmt::format("could not exec `{}`: {}", report.argv.empty() ? "" : report.argv[0],
                      errno_name(o.setup_errno));
    }
  } else if (o.state == RunState::kInitDied) {
    report.message = "the sandbox init died without reporting the command's status";
  } else if (o.state == RunState::kTimeout) {
    report.message = fmt::format("timed out after {} ms", req.timeout.count());
  } else if (o.state == RunState::kOutputLimit) {
    report.message = fmt::format("{} reached the output limit of {} bytes", o.output_limit_stream,
                                 req.max_output_bytes);
  }
  return report;
}

}  // namespace cordon::engine
