#include "sandbox/features.hpp"

#include <fcntl.h>
#include <linux/mount.h>
#include <linux/sched.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "base/strings.hpp"
#include "sandbox/userns.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {
namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) {
    s.pop_back();
  }
  return s;
}

FeatureCheck check(std::string name, bool ok, std::string detail, std::string guarantee,
                   bool required = true) {
  return {std::move(name), ok, required, std::move(detail), std::move(guarantee)};
}

// clone3 a child into fresh namespaces that exits at once; the errno tells what is missing.
std::pair<bool, std::string> try_clone3(uint64_t flags) {
  int pidfd = -1;
  struct clone_args args {};
  args.flags = flags | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  long pid;
  int clone_errno = 0;
  {
    // As a sandbox's own namespaces are made: owned by a host id, not by root (see
    // EffectiveIdSwitch).
    std::optional<EffectiveIdSwitch> as_host;
    if (::geteuid() == 0) {
      auto sw = EffectiveIdSwitch::to(kHostIdBase);
      if (!sw) {
        return {false, sw.error().message()};
      }
      as_host.emplace(std::move(*sw));
    }
    pid = sys::clone3(&args);
    if (pid == 0) {
      ::_exit(0);
    }
    clone_errno = errno;
  }
  if (pid < 0) {
    return {false, "clone3: " + errno_name(clone_errno)};
  }
  siginfo_t info{};
  ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED);
  ::close(pidfd);
  return {true, "pidfd " + std::to_string(pidfd)};
}

}  // namespace

std::vector<FeatureCheck> probe_features(const std::string& state_dir) {
  std::vector<FeatureCheck> out;

  auto maxns = read_small_file("/proc/sys/user/max_user_namespaces");
  auto [userns_ok, userns_detail] =
      try_clone3(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS |
                 CLONE_NEWNET | CLONE_NEWCGROUP);
  out.push_back(check("clone3 + namespaces", userns_ok,
                      userns_detail + ", max_user_namespaces " + trim(maxns.value_or("?")),
                      "each command in its own user, mount, pid, ipc, uts, net and cgroup "
                      "namespaces, spawned with a pidfd"));

  {
    int fd = sys::pidfd_open(::getpid(), 0);
    out.push_back(check("pidfd", fd >= 0, fd >= 0 ? "pidfd_open works" : errno_name(errno),
                        "race-free waiting and signalling of the sandbox init"));
    if (fd >= 0) {
      ::close(fd);
    }
  }
  {
    auto fd = sys::openat2_fd(AT_FDCWD, "/etc", O_PATH, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
    // RESOLVE_BENEATH from AT_FDCWD="/" must refuse an absolute path: EXDEV proves openat2 works.
    bool ok = !fd && fd.error().sys_errno() == EXDEV;
    out.push_back(check("openat2 RESOLVE_BENEATH", ok,
                        ok ? "absolute path refused with EXDEV"
                           : (fd ? "accepted an escape" : fd.error().message()),
                        "cwd and executables resolved beneath the working root by the kernel"));
  }
  {
    int fd = sys::open_tree(AT_FDCWD, "/usr", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    bool ok = fd >= 0;
    std::string detail = ok ? "open_tree(OPEN_TREE_CLONE) works" : errno_name(errno);
    if (ok) {
      struct mount_attr attr {};
      attr.attr_set = MOUNT_ATTR_RDONLY;
      ok = sys::mount_setattr(fd, "", AT_EMPTY_PATH, &attr) == 0;
      if (!ok) {
        detail = "mount_setattr: " + errno_name(errno);
      }
      ::close(fd);
    }
    out.push_back(check("mount API", ok, detail,
                        "sources opened and checked by fd, then mounted from that fd"));
  }
  {
    // Idmapped mount of the state dir's filesystem (where working roots usually live too).
    auto userns = make_idmap_userns(0, 0, kHostIdBase, kHostIdBase);
    std::string detail;
    bool ok = false;
    if (!userns) {
      detail = userns.error().message();
    } else {
      ::mkdir(state_dir.c_str(), 0700);
      int fd = sys::open_tree(AT_FDCWD, state_dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
      if (fd < 0) {
        detail = "open_tree `" + state_dir + "`: " + errno_name(errno);
      } else {
        struct mount_attr attr {};
        attr.attr_set = MOUNT_ATTR_IDMAP;
        attr.userns_fd = static_cast<uint64_t>(userns->get());
        ok = sys::mount_setattr(fd, "", AT_EMPTY_PATH, &attr) == 0;
        detail = ok ? "MOUNT_ATTR_IDMAP works on the state dir's filesystem"
                    : "mount_setattr MOUNT_ATTR_IDMAP: " + errno_name(errno);
        ::close(fd);
      }
    }
    out.push_back(check("idmapped mounts", ok, detail,
                        "files the command creates land owned by the working root's owner; "
                        "without it the command writes as its unprivileged host uid",
                        false));
  }
  {
    int abi = sys::landlock_abi();
    out.push_back(check("Landlock", abi >= 1,
                        abi >= 1 ? "ABI " + std::to_string(abi) : errno_name(errno),
                        "second wall: writes only in the root, /tmp and /dev/shm"));
    out.push_back(check("Landlock scopes (ABI 6)", abi >= 6,
                        abi >= 6 ? "abstract unix sockets and signals scoped" : "missing",
                        "host abstract sockets unreachable even with --network host", false));
  }
  {
    auto actions = read_small_file("/proc/sys/kernel/seccomp/actions_avail");
    bool ok = actions && actions->find("kill_process") != std::string::npos &&
              actions->find("errno") != std::string::npos;
    out.push_back(check("seccomp filter", ok, trim(actions.value_or("no seccomp")),
                        "syscall allowlist, argument checks (TIOCSTI, setuid bits, namespaces)"));
    std::string unknown;
    int count = 0;
    for (int nr = 0; nr < 470; ++nr) {
      char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_X86_64, nr);
      if (name == nullptr) {
        if (nr >= 335 && nr < 424) {
          continue;  // never assigned on x86_64
        }
        unknown += (unknown.empty() ? "" : " ") + std::to_string(nr);
        ++count;
      }
      ::free(name);
    }
    out.push_back(check("libseccomp syscall names", true,
                        std::to_string(count) + " numbers unknown to libseccomp " +
                            std::to_string(seccomp_version()->major) + "." +
                            std::to_string(seccomp_version()->minor) + "." +
                            std::to_string(seccomp_version()->micro) + ": " + unknown,
                        "syscalls libseccomp cannot name get the profile's default (ENOSYS); "
                        "profile rules naming them are skipped with a warning",
                        false));
  }
  {
    auto legacy = read_small_file("/proc/sys/dev/tty/legacy_tiocsti");
    std::string v = trim(legacy.value_or("absent"));
    out.push_back(check("legacy TIOCSTI", true, "dev.tty.legacy_tiocsti = " + v,
                        v == "1" ? "TIOCSTI works on this kernel: cordon's fixed seccomp filter "
                                   "refuses it (32-bit masked compare)"
                                 : "the kernel refuses TIOCSTI; cordon refuses it as well",
                        false));
  }
  {
    std::string conflicts = host_id_range_conflicts();
    out.push_back(check("reserved host ids", conflicts.empty(),
                        conflicts.empty()
                            ? fmt::format("{}..{} unused by passwd, group, subuid, subgid",
                                          kHostIdBase, kHostIdBase + kHostIdCount - 1)
                            : conflicts,
                        "each sandbox runs as its own host uid that no host user has"));
  }
  {
    auto inst = read_small_file("/proc/sys/fs/inotify/max_user_instances");
    out.push_back(check("per-user limits", true,
                        "fs.inotify.max_user_instances = " + trim(inst.value_or("?")),
                        "charged per sandbox: every sandbox has its own host uid, and its own "
                        "user.max_inotify_instances quota inside",
                        false));
  }
  return out;
}

}  // namespace cordon::sandbox
