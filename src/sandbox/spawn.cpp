#include "sandbox/spawn.hpp"

#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "base/scope_exit.hpp"
#include "base/unique_fd.hpp"
#include "sandbox/child.hpp"
#include "sandbox/userns.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {

Result<SpawnedSandbox> spawn_sandbox(PreparedSandbox& prepared, const SpawnOptions& options) {
  ChildPlan& plan = prepared.plan();
  uint64_t flags =
      CLONE_PIDFD | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
  if (options.network_namespace) {
    flags |= CLONE_NEWNET;
  }
#ifdef CORDON_TEST_WALLS
  if (plan.disabled_walls & static_cast<uint32_t>(Wall::kPidNamespace)) {
    flags &= ~static_cast<uint64_t>(CLONE_NEWPID);
  }
  if (plan.disabled_walls & static_cast<uint32_t>(Wall::kNetNamespace)) {
    flags &= ~static_cast<uint64_t>(CLONE_NEWNET);
    plan.loopback_up = false;
  }
  if (plan.disabled_walls & static_cast<uint32_t>(Wall::kIpcNamespace)) {
    flags &= ~static_cast<uint64_t>(CLONE_NEWIPC);
  }
  if (plan.disabled_walls & static_cast<uint32_t>(Wall::kUtsNamespace)) {
    flags &= ~static_cast<uint64_t>(CLONE_NEWUTS);
  }
  // Test control only: the sandbox is left in cordon's own cgroups (neither CLONE_INTO_CGROUP
  // nor the v1 `tasks` writes), so a test can show its host-side placement check fails.
  const bool place = (plan.disabled_walls & static_cast<uint32_t>(Wall::kCgroupPlacement)) == 0;
#else
  const bool place = true;
#endif
  if (options.cgroup_fd >= 0 && place) {
    flags |= CLONE_INTO_CGROUP;
  }
  if (options.cgroupns_at_clone) {
    flags |= CLONE_NEWCGROUP;
  }
  plan.unshare_cgroupns = !options.cgroupns_at_clone;
  // Hybrid hosts: the child moves itself into the v1 job cgroups (ChildPlan::v1_tasks_fds).
  std::vector<UniqueFd> tasks;
  std::vector<int> tasks_raw;
  const std::vector<int> unplaced;
  for (int dir : place ? options.v1_cgroup_dirs : unplaced) {
    UniqueFd fd(::openat(dir, "tasks", O_WRONLY | O_CLOEXEC));
    if (!fd) {
      prepared.close_child_ends();
      return sys_error("open the `tasks` file of a v1 job cgroup");
    }
    tasks_raw.push_back(fd.get());
    tasks.push_back(std::move(fd));
  }
  plan.v1_tasks_fds = tasks_raw.data();
  plan.n_v1_tasks_fds = tasks_raw.size();
  prepared.finalize_keep_fds();
  ScopeExit forget_tasks([&] {
    plan.v1_tasks_fds = nullptr;
    plan.n_v1_tasks_fds = 0;
    prepared.finalize_keep_fds();
  });

  int pidfd = -1;
  struct clone_args args {};
  args.flags = flags;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  if (options.cgroup_fd >= 0 && place) {
    args.cgroup = static_cast<uint64_t>(options.cgroup_fd);
  }
  long pid;
  {
    CORDON_TRY(sw, EffectiveIdSwitch::to(options.host_id));
    pid = sys::clone3(&args);
    if (pid == 0) {
      child_main(plan);
    }
  }
  if (pid < 0) {
    int err = errno;
    prepared.close_child_ends();
    return errno_error(err, "clone3");
  }
  SpawnedSandbox out;
  out.pid = static_cast<pid_t>(pid);
  out.pidfd.reset(pidfd);
  prepared.close_child_ends();

  auto abort_child = [&](Error e) -> Result<SpawnedSandbox> {
    (void)sys::pidfd_send_signal(out.pidfd.get(), SIGKILL, nullptr, 0);
    siginfo_t info{};
    (void)::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(out.pidfd.get()), &info,
                   WEXITED);
    return std::unexpected(std::move(e));
  };
  auto maps = write_id_maps(out.pid, plan.uid, plan.gid, options.host_id, options.host_id);
  if (!maps) {
    return abort_child(std::move(maps.error()).wrap("write the sandbox's id maps"));
  }
  auto send_go = [&]() -> Result<void> {
    char go = 1;
    if (::send(prepared.status_parent.get(), &go, 1, MSG_NOSIGNAL) != 1) {
      return sys_error("send the go byte");
    }
    return {};
  };
  // The child runs its first step (the v1 placement) without waiting for us, and may fail
  // it: it sends its error record and exits, and the go byte then fails (EPIPE). Kill it and
  // wait (without reaping) for its end: if it exited on its own, its record on the status
  // channel says why and the supervisor reaps it, as after any setup failure; if our SIGKILL
  // ended it, `e` is the reason. Either way it never ran the command: that needs the byte.
  auto abort_or_report = [&](Error e) -> Result<SpawnedSandbox> {
    (void)sys::pidfd_send_signal(out.pidfd.get(), SIGKILL, nullptr, 0);
    siginfo_t info{};
    if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(out.pidfd.get()), &info,
                 WEXITED | WNOWAIT) == 0 &&
        info.si_code == CLD_EXITED) {
      return std::move(out);
    }
    return abort_child(std::move(e));
  };
  if (auto sent = send_go(); !sent) {
    return abort_or_report(std::move(sent.error()));
  }
  return out;
}

}  // namespace cordon::sandbox
