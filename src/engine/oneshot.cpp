#include "engine/oneshot.hpp"

#include <fcntl.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <tuple>

#include "base/sha256.hpp"
#include "base/strings.hpp"
#include "engine/supervise.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/spawn.hpp"
#include "sandbox/status.hpp"
#include "sandbox/userns.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::engine {
namespace {

std::string job_name() {
  return fmt::format("run-{}-{}", ::getpid(),
                     std::chrono::steady_clock::now().time_since_epoch().count());
}

struct Programs {
  std::vector<struct sock_filter> profile, fixed, init;
  std::vector<std::string> warnings;
};

// The compiled programs, cached in the state dir (root-only, like the rest of it) under the
// sha256 of everything that shapes them: compiling with libseccomp costs 4-8 ms per run here.
constexpr uint32_t kCacheMagic = 0x42434331;  // "1CCB", bump when the layout changes

std::string encode_programs(const Programs& p) {
  std::string out;
  auto u32 = [&out](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  u32(kCacheMagic);
  u32(static_cast<uint32_t>(p.warnings.size()));
  for (const auto& w : p.warnings) {
    u32(static_cast<uint32_t>(w.size()));
    out += w;
  }
  for (const auto* prog : {&p.profile, &p.fixed, &p.init}) {
    u32(static_cast<uint32_t>(prog->size()));
    out.append(reinterpret_cast<const char*>(prog->data()), prog->size() * sizeof(sock_filter));
  }
  return out;
}

std::optional<Programs> decode_programs(std::string_view in) {
  Programs p;
  size_t at = 0;
  auto u32 = [&](uint32_t& v) {
    if (in.size() - at < sizeof v) {
      return false;
    }
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return true;
  };
  uint32_t magic = 0, nwarn = 0;
  if (!u32(magic) || magic != kCacheMagic || !u32(nwarn) || nwarn > 4096) {
    return std::nullopt;
  }
  for (uint32_t i = 0; i < nwarn; ++i) {
    uint32_t len = 0;
    if (!u32(len) || in.size() - at < len) {
      return std::nullopt;
    }
    p.warnings.emplace_back(in.substr(at, len));
    at += len;
  }
  for (auto* prog : {&p.profile, &p.fixed, &p.init}) {
    uint32_t count = 0;
    if (!u32(count) || count > 4096 || (in.size() - at) / sizeof(sock_filter) < count) {
      return std::nullopt;
    }
    prog->resize(count);
    std::memcpy(prog->data(), in.data() + at, count * sizeof(sock_filter));
    at += count * sizeof(sock_filter);
  }
  if (at != in.size()) {
    return std::nullopt;
  }
  return p;
}

Result<Programs> compiled_programs(const OneshotRequest& req) {
  auto text = read_small_file(req.seccomp_profile_path);
  if (!text) {
    if (errno == EINVAL) {
      return refusal(
          "--seccomp `{}` is not a regular file (a pipe or a device); write the profile to a "
          "file and give its path",
          req.seccomp_profile_path);
    }
    return sys_error("read seccomp profile `{}`", req.seccomp_profile_path);
  }
  const auto* v = seccomp_version();
  // The key names this very binary (device, inode, size, mtime), not only the version: the
  // fixed filter is cordon's code, and a rebuilt or reinstalled cordon of the same version
  // must not load the filters an older one compiled. Failure fixed (session 12): a new
  // fixed-filter rule (inet protocols) did not apply to `cordon run` with the default state
  // dir, which held the previous build's programs under the same key.
  struct stat exe {};
  const bool exe_known = ::stat("/proc/self/exe", &exe) == 0;
  std::string key = sha256_hex(fmt::format(
      "{}\n{} {}\n{}.{}.{}\n{}\n{}:{}:{}:{}.{}\n{}", kCacheMagic, req.spec.allow_ptrace,
      req.spec.allow_netlink_route, v->major, v->minor, v->micro, CORDON_VERSION, exe.st_dev,
      exe.st_ino, exe.st_size, exe.st_mtim.tv_sec, exe.st_mtim.tv_nsec, *text));
  std::string dir = req.state_dir + "/seccomp-cache";
  std::string path = dir + "/" + key;
  if (!exe_known) {
    path.clear();  // no identity, no cache: compiled every time
  }
  if (auto cached = path.empty() ? std::nullopt : read_small_file(path)) {
    if (auto p = decode_programs(*cached)) {
      return std::move(*p);
    }
  }
  CORDON_TRY(profile, policy::parse_seccomp_profile(*text));
  sandbox::SeccompOptions sopts = sandbox::seccomp_options(req.spec);
  CORDON_TRY_CTX(filters, sandbox::compile_filters(profile, sopts), "compile seccomp profile `{}`",
                 req.seccomp_profile_path);
  CORDON_TRY_CTX(init_filter, sandbox::compile_init_filter(), "compile the init's filter");
  Programs p{std::move(filters.profile.insns), std::move(filters.fixed.insns),
             std::move(init_filter.insns), std::move(filters.warnings)};
  // Best effort: a cache that cannot be written only costs the next run a compile.
  if (!path.empty() && (::mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST)) {
    std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
    std::string blob = encode_programs(p);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      bool ok = sys::write_all(fd, blob.data(), blob.size()).has_value();
      ::close(fd);
      if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        ::unlink(tmp.c_str());
      }
    }
  }
  return p;
}

}  // namespace

Result<OneshotReport> run_oneshot(const OneshotRequest& req) {
  OneshotReport report;

  // Seccomp: the profile is data, compiled once (and cached); the init has its own filter.
  CORDON_TRY(filters, compiled_programs(req));

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
  // Leased before the cgroup exists, so it is released only after the cgroup (declared later)
  // was killed, emptied and removed, or given up on after the destroy's retries, on every way
  // out; a process that has exited holds no uid.
  CORDON_TRY(lease, sandbox::HostIdLease::acquire(sandbox::kHostIdLeaseDir, req.host_id_base,
                                                  req.host_id_count));
  report.host_uid = lease.id();
  std::string name = job_name();
  // Recorded before it exists: a cordon killed at any later point leaves a record to sweep.
  CORDON_TRY(paths, sandbox::JobCgroup::paths_for(layout, name));
  CORDON_TRY_CTX(record, records.add(name, paths), "record job cgroup");
  CORDON_TRY_CTX(cgroup, sandbox::JobCgroup::create(layout, name, limits), "create job cgroup");

  sandbox::SeccompPrograms programs{filters.profile, filters.fixed, filters.init};
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
    sp.v1_cgroup_dirs = cgroup.v1_dirfds();
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
  if (req.spec.network == sandbox::NetworkMode::kNone) {
    so.socket_memory_limit = req.memory_bytes;
  }
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
  auto supervised = std::chrono::steady_clock::now();
  auto outcome = supervise(handles, so, hooks);
  // Whatever happened, nothing of the sandbox outlives this function.
  hooks.kill_all();
  siginfo_t info{};
  (void)::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(init_pidfd), &info, WEXITED);
  report.duration = std::chrono::steady_clock::now() - start;
  if (!outcome) {
    return std::unexpected(std::move(outcome.error()).wrap("supervise the sandbox"));
  }
  if (outcome->duration.count() > 0) {
    // Until the sandbox ended, not until a slow reader of cordon's stdout took the last byte.
    report.duration = (supervised - start) + outcome->duration;
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
  for (auto [stream, err, bytes] : {std::tuple{"stdout", o.stdout_write_errno, o.stdout_bytes},
                                    std::tuple{"stderr", o.stderr_write_errno, o.stderr_bytes}}) {
    // EPIPE (ECONNRESET on a socket) is a reader that went away (`cordon run … | head`), as
    // a pipeline means it to.
    if (err != 0 && err != EPIPE && err != ECONNRESET) {
      report.applied.warnings.push_back(fmt::format(
          "writing the command's {} to cordon's own {} failed ({}): of the {} bytes it printed, "
          "what came after the failure was not delivered",
          stream, stream, errno_name(err), bytes));
    }
  }
  for (const std::string& stream : o.undelivered) {
    report.applied.warnings.push_back(fmt::format(
        "cordon was signalled, and the reader of its {} had not taken all of the command's "
        "output when the run ended: the rest was not delivered",
        stream));
  }
  for (const std::string& stream : o.held_open) {
    report.applied.warnings.push_back(fmt::format(
        "{} was still open {} ms after the command ended (a process outside the sandbox holds "
        "it): what was written to it later was not relayed",
        stream, so.drain_timeout.count()));
  }
  // The command itself was OOM-killed: SIGKILL and the cgroup counted an OOM kill. A
  // grandchild's OOM kill while the command exits normally stays `exited`, with oomKills.
  if (o.state == RunState::kKilled && o.term_signal == SIGKILL && report.oom_kills > 0) {
    report.state = "oom";
    // The kernel does not say whose SIGKILL it was: worded as what is known (a red-team
    // review, session 38).
    report.message = fmt::format(
        "the command died of SIGKILL after the OOM killer acted in its sandbox ({} OOM kill{} at "
        "the memory limit of {} bytes): most likely it was the one chosen",
        report.oom_kills, report.oom_kills == 1 ? "" : "s", req.memory_bytes);
  }
  if (o.state == RunState::kSetupFailed) {
    report.setup_step = sandbox::step_name(o.failed_step);
    report.setup_errno = o.setup_errno;
    report.message =
        fmt::format("sandbox setup failed: {}: {}", report.setup_step, errno_name(o.setup_errno));
    if (o.failed_step == sandbox::SetupStep::kCwd && o.setup_errno == ESTALE) {
      report.message += " (the working directory changed after it was checked; retry)";
    }
    if (o.failed_step == sandbox::SetupStep::kCwd && o.setup_errno == EACCES) {
      report.message += sandbox::kCwdDeniedHint;
    }
    if (o.failed_step == sandbox::SetupStep::kCommandExec) {
      report.message =
          fmt::format("could not exec `{}`: {}", report.argv.empty() ? "" : report.argv[0],
                      errno_name(o.setup_errno));
    }
  } else if (o.state == RunState::kInitDied && report.oom_kills > 0 && o.have_init_wait_status &&
             WIFSIGNALED(o.init_wait_status) && WTERMSIG(o.init_wait_status) == SIGKILL) {
    // Failure fixed (session 16, found on a pure cgroup v2 kernel): memory no process maps
    // (socket buffers, pipes, files in /tmp) counts against the limit, so the OOM killer can
    // choose the sandbox's init; the sandbox then died without the command's status.
    report.state = "oom";
    report.term_signal = SIGKILL;
    report.message =
        fmt::format("the sandbox was killed by the OOM killer at its memory limit of {} bytes ({})",
                    req.memory_bytes, sandbox::kInitOomCause);
  } else if (o.state == RunState::kInitDied) {
    report.message = init_died_message(
        o.failed_step, o.setup_errno,
        o.have_init_wait_status ? std::optional(o.init_wait_status) : std::nullopt);
  } else if (o.state == RunState::kTimeout) {
    report.message = fmt::format("timed out after {} ms", req.timeout.count());
  } else if (o.state == RunState::kSocketLimit) {
    report.term_signal = SIGKILL;
    report.message = socket_limit_message(o.tcp_sockets, req.memory_bytes);
  } else if (o.state == RunState::kOutputLimit) {
    report.message = fmt::format("{} reached the output limit of {} bytes", o.output_limit_stream,
                                 req.max_output_bytes);
  }
  return report;
}

}  // namespace cordon::engine
