// The clone3 child: the ordered recipe of DESIGN.md, applied with raw syscalls only.
//
// Runs in fresh user, mount, pid (as PID 1), ipc, uts and (optionally) net namespaces,
// holding every capability of its new user namespace until step 6. Nothing here allocates,
// locks, logs or throws: the parent prepared all data (ChildPlan). A failing step sends a
// {step, errno} record on the status channel and exits; the parent turns it into an Error.

#include "sandbox/child.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sandbox/beneath.hpp"
#include "sandbox/status.hpp"
#include "sandbox/signals.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {
namespace {

int g_status_fd = -1;

[[noreturn]] void fail_errno(SetupStep step, int err) {
  StatusRecord rec{};
  rec.kind = RecordKind::kSetupError;
  rec.step = step;
  rec.err = err;
  (void)::send(g_status_fd, &rec, sizeof rec, MSG_NOSIGNAL);
  ::_exit(126);
}

[[noreturn]] void fail(SetupStep step) { fail_errno(step, errno); }

bool wall_on(const ChildPlan& plan, Wall wall) {
#ifdef CORDON_TEST_WALLS
  return (plan.disabled_walls & static_cast<uint32_t>(wall)) == 0;
#else
  (void)plan;
  (void)wall;
  return true;
#endif
}

// mkdir -p relative to the new root; existing components (also on read-only binds) are fine.
// Through fds, no symlinks (sandbox/beneath.hpp: the paths may lead through the working root,
// which a job sharing it can change while this runs).
void mkdir_p(int root_fd, const char* rel, SetupStep step) {
  int fd = make_dirs_beneath(root_fd, rel);
  if (fd < 0) {
    fail_errno(step, -fd);
  }
  ::close(fd);
}

void move_tree(int root_fd, const TreeMount& tree, SetupStep step) {
  // The mount point: a directory, or an empty file for a single file; mounted on by its fd.
  int target =
      tree.is_file ? make_file_beneath(root_fd, tree.path) : make_dirs_beneath(root_fd, tree.path);
  if (target < 0) {
    fail_errno(step, -target);
  }
  if (tree.onto_itself) {
    struct stat from {
    }, to{};
    if (::fstat(tree.fd, &from) != 0 || ::fstat(target, &to) != 0) {
      fail(step);
    }
    if (from.st_dev != to.st_dev || from.st_ino != to.st_ino) {
      fail_errno(step, ESTALE);
    }
  }
  if (sys::move_mount(tree.fd, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) !=
      0) {
    fail(step);
  }
  ::close(target);
}

void remount_ro(const char* path, unsigned long keep, SetupStep step) {
  if (::mount(nullptr, path, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | keep, nullptr) != 0) {
    fail(step);
  }
}

// Binds `src` (a file or directory mount_etc made in the root tmpfs) over `dst` (in the cloned
// /etc): a detached copy of the root's mount at `src`, made read-only, nosuid, nodev and
// noexec while still detached, then moved onto `dst` opened beneath the new root with no
// symlink on its way. Not mount(2) on the path: these binds are made before pivot_root, and a
// directory on the way replaced by a symlink since the parent resolved it (etc_masks) led the
// bind into the host's tree (an absolute link) or onto another file (a relative one), leaving
// the sandbox's copy of the secret unmasked (failure fixed, session 28; security_etc_masks).
// Such a way now stops the setup with ELOOP. Binds nothing where `absent_ok` and `dst` no
// longer exists.
void bind_ro(int root_fd, const char* src, const char* dst, SetupStep step,
             bool absent_ok = false) {
  int target = open_beneath(root_fd, dst, O_PATH);
  if (target == -ENOENT && absent_ok) {
    return;
  }
  if (target < 0) {
    fail_errno(step, -target);
  }
  int tree = sys::open_tree(root_fd, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree < 0) {
    fail(step);
  }
  struct mount_attr attr {};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
  if (sys::mount_setattr(tree, "", AT_EMPTY_PATH, &attr) != 0 ||
      sys::move_mount(tree, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) !=
          0) {
    fail(step);
  }
  ::close(target);
  ::close(tree);
}

void write_new_file(int root_fd, const char* name, const char* data, size_t size, SetupStep step) {
  int fd = ::openat(root_fd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
  if (fd < 0) {
    fail(step);
  }
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      fail(step);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

void write_proc(const char* path, const char* value, SetupStep step) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    fail(step);
  }
  size_t len = std::strlen(value);
  if (::write(fd, value, len) != static_cast<ssize_t>(len)) {
    fail(step);
  }
  ::close(fd);
}

void mount_etc(const ChildPlan& plan, int root_fd) {
  // The sources of every bind below, in one directory of the root tmpfs: the generated files
  // (passwd, group, hostname, hosts), an empty file for the secrets that are files, an empty
  // directory (mode 000) for those that are directories. Each bind is a read-only, nosuid,
  // nodev, noexec copy of the root's mount at its source (bind_ro); the sources go once they
  // are bound (a removed directory can never gain an entry). Not a tmpfs of its own: every
  // superblock costs each memory cgroup on the machine a shrinker slot (see mount_tmp). No
  // mount of the source directory either: unmounting it cost an RCU grace period
  // (namespace_unlock), which every sandbox being built on the machine waits for in turn.
  constexpr SetupStep kGen = SetupStep::kMountEtc, kMask = SetupStep::kMountEtcMask;
  const bool masks = wall_on(plan, Wall::kEtcMask);
  if (::mkdirat(root_fd, ".cordon-src", 0755) != 0) {
    fail(kGen);
  }
  char name[32] = ".cordon-src/gen-00";
  auto gen_name = [&name](size_t i) {
    name[16] = static_cast<char>('0' + (i / 10) % 10);
    name[17] = static_cast<char>('0' + i % 10);
    return name;
  };
  for (size_t i = 0; i < plan.n_generated; ++i) {
    write_new_file(root_fd, gen_name(i), plan.generated[i].data, plan.generated[i].size, kGen);
  }
  if (masks) {
    write_new_file(root_fd, ".cordon-src/empty", "", 0, kMask);
    if (::mkdirat(root_fd, ".cordon-src/empty-dir", 0) != 0) {
      fail(kMask);
    }
  }
  for (size_t i = 0; i < plan.n_generated; ++i) {
    bind_ro(root_fd, gen_name(i), plan.generated[i].path, kGen);
  }
  // A secret the host removed since the masks were computed (an ssh host key being rotated)
  // is not there to show: its mask is skipped, not the sandbox failed (it was, with ENOENT,
  // until session 30). One that comes back while the sandbox runs is unmasked there, as a
  // secret that first appears then is (docs/security.md, Known limits); a parked sandbox is
  // not served once its masked paths changed (shape_still_holds). Only a missing way is
  // skipped: a symlink on it still stops the setup with ELOOP.
  if (masks) {
    for (size_t i = 0; i < plan.n_mask_files; ++i) {
      bind_ro(root_fd, ".cordon-src/empty", plan.mask_files[i], kMask, true);
    }
    for (size_t i = 0; i < plan.n_mask_dirs; ++i) {
      bind_ro(root_fd, ".cordon-src/empty-dir", plan.mask_dirs[i], kMask, true);
    }
  }
  for (size_t i = 0; i < plan.n_generated; ++i) {
    if (::unlinkat(root_fd, gen_name(i), 0) != 0) {
      fail(kGen);
    }
  }
  if (masks && (::unlinkat(root_fd, ".cordon-src/empty", 0) != 0 ||
                ::unlinkat(root_fd, ".cordon-src/empty-dir", AT_REMOVEDIR) != 0)) {
    fail(kMask);
  }
  if (::unlinkat(root_fd, ".cordon-src", AT_REMOVEDIR) != 0) {
    fail(kGen);
  }
}

void mount_proc(const ChildPlan& plan) {
  if (::mkdir("proc", 0555) != 0 && errno != EEXIST) {
    fail(SetupStep::kMountProc);
  }
  // We are PID 1 of the new pid namespace, so a fresh procfs shows only the sandbox.
  if (!wall_on(plan, Wall::kPidNamespace)) {
    // Test control only: without a pid namespace of its own the child may not mount a procfs
    // (the host's pid namespace belongs to the initial user namespace), so it gets the host's.
    if (::mount("/proc", "proc", nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      fail(SetupStep::kMountProc);
    }
  } else if (::mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=0") != 0) {
    fail(SetupStep::kMountProc);
  }
  // Per-sandbox quotas live in this user namespace's /proc/sys/user: one job cannot exhaust
  // inotify instances for the others, and max_user_namespaces=0 stops nested namespaces.
  if (wall_on(plan, Wall::kUserQuotas)) {
    for (size_t i = 0; i < plan.n_sysctls; ++i) {
      write_proc(plan.sysctls[i].path, plan.sysctls[i].value, SetupStep::kProcSysUser);
    }
  }
  // The network namespace's own settings, while /proc/sys is still writable. Only in a
  // namespace of the sandbox's own (loopback_up): in the host's (--network host, or the
  // net-namespace test control) they would be the host's.
  if (plan.loopback_up && wall_on(plan, Wall::kTcpOrphans)) {
    for (size_t i = 0; i < plan.n_net_sysctls; ++i) {
      write_proc(plan.net_sysctls[i].path, plan.net_sysctls[i].value, SetupStep::kNetSysctl);
    }
  }
  if (!wall_on(plan, Wall::kProcReadOnly)) {
    return;
  }
  for (size_t i = 0; i < plan.n_proc_read_only; ++i) {
    const char* p = plan.proc_read_only[i];
    if (::mount(p, p, nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      if (errno == ENOENT) {
        continue;  // e.g. no /proc/bus on this kernel
      }
      fail(SetupStep::kMountProcReadOnly);
    }
    remount_ro(p, MS_NOSUID | MS_NODEV | MS_NOEXEC, SetupStep::kMountProcReadOnly);
  }
}

void mount_dev(const ChildPlan& plan, int root_fd) {
  mkdir_p(root_fd, "dev", SetupStep::kMountDev);
  // 0755 whatever the umask (it was the mode of /dev's own tmpfs, mode=0755).
  if (::fchmodat(root_fd, "dev", 0755, 0) != 0) {
    fail(SetupStep::kMountDev);
  }
  // The root tmpfs's own `dev` bound onto itself: a mount of its own (nosuid, noexec, then
  // read-only below) without a superblock of its own.
  if (::mount("dev", "dev", nullptr, MS_BIND, nullptr) != 0 ||
      ::mount(nullptr, "dev", nullptr, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC, nullptr) !=
          0) {
    fail(SetupStep::kMountDev);
  }
  char dst[64];
  char src[64];
  for (size_t i = 0; i < plan.n_dev_nodes; ++i) {
    const char* node = plan.dev_nodes[i];
    size_t n = std::strlen(node);
    if (n > 40) {
      fail_errno(SetupStep::kMountDev, ENAMETOOLONG);
    }
    std::memcpy(dst, "dev/", 4);
    std::memcpy(dst + 4, node, n + 1);
    std::memcpy(src, "/dev/", 5);
    std::memcpy(src + 5, node, n + 1);
    int fd = ::openat(root_fd, dst, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
    if (fd < 0) {
      fail(SetupStep::kMountDev);
    }
    ::close(fd);
    // The host node is bound, not created: mknod needs CAP_MKNOD in the initial namespace.
    if (::mount(src, dst, nullptr, MS_BIND, nullptr) != 0) {
      fail(SetupStep::kMountDev);
    }
    // Writable (null, tty…) but never setuid or executable.
    if (::mount(nullptr, dst, nullptr, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC, nullptr) !=
        0) {
      fail(SetupStep::kMountDev);
    }
  }
  if (::mkdirat(root_fd, "dev/pts", 0755) != 0 || ::mkdirat(root_fd, "dev/shm", 01777) != 0 ||
      ::fchmodat(root_fd, "dev/shm", 01777, 0) != 0) {
    fail(SetupStep::kMountDevpts);
  }
  // A new devpts instance: the sandbox's ptys are not the host's, and ptmx is world-usable.
  // At most 64 of them: every instance but the host's draws on one pool (kernel.pty.max less
  // kernel.pty.reserve, 3072 here), and one sandbox took 3071, so another's `--tty` failed
  // with ENOSPC (a review, session 29).
  if (::mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620,max=64") != 0) {
    fail(SetupStep::kMountDevpts);
  }
  static const SymlinkEntry kDevLinks[] = {
      {"pts/ptmx", "dev/ptmx"},          {"/proc/self/fd", "dev/fd"},
      {"/proc/self/fd/0", "dev/stdin"},  {"/proc/self/fd/1", "dev/stdout"},
      {"/proc/self/fd/2", "dev/stderr"},
  };
  for (const auto& link : kDevLinks) {
    if (::symlinkat(link.target, root_fd, link.path) != 0) {
      fail(SetupStep::kMountDev);
    }
  }
  remount_ro("dev", MS_NOSUID | MS_NOEXEC, SetupStep::kMountDev);
}

// /tmp and /dev/shm: the root tmpfs's own `tmp` and `dev/shm` directories, each bound onto
// itself and made writable (nosuid, nodev), so they share its size and stay writable when the
// root goes read-only after the pivot (the flag is per mount). No tmpfs of their own: every
// superblock costs its own memory, and every memory cgroup on the machine keeps a shrinker
// slot for every superblock that ever existed at once (the kernel never shrinks that table),
// ~16 KiB per job at 1000 concurrent jobs. A file of the read-only root cannot be linked or
// renamed into them (EXDEV: another mount), and nothing of the root lies beneath them.
void mount_tmp(int root_fd) {
  mkdir_p(root_fd, "tmp", SetupStep::kMountTmp);
  // fchmodat: mkdirat's mode passes through the umask. dev/shm was made 01777 by mount_dev,
  // before /dev went read-only.
  if (::fchmodat(root_fd, "tmp", 01777, 0) != 0) {
    fail(SetupStep::kMountTmp);
  }
  static const char* const kDirs[] = {"tmp", "dev/shm"};
  for (const char* dir : kDirs) {
    if (::mount(dir, dir, nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, dir, nullptr, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV, nullptr) != 0) {
      fail(SetupStep::kMountTmp);
    }
  }
  // HOME for the command: created by us, so owned by the sandbox user.
  if (::mkdirat(root_fd, "tmp/home", 0700) != 0) {
    fail(SetupStep::kMountTmp);
  }
}

void loopback_up() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    fail(SetupStep::kLoopback);
  }
  struct ifreq ifr {};
  std::memcpy(ifr.ifr_name, "lo", 3);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) {
    fail(SetupStep::kLoopback);
  }
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) {
    fail(SetupStep::kLoopback);
  }
  ::close(s);
}

// Opens the pty inside the sandbox's own devpts and sends the master to the supervisor.
int open_pty(uint16_t cols, uint16_t rows) {
  int master = ::open("/dev/pts/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) {
    fail(SetupStep::kPty);
  }
  int unlock = 0;
  if (::ioctl(master, TIOCSPTLCK, &unlock) != 0) {
    fail(SetupStep::kPty);
  }
  int slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
  if (slave < 0) {
    fail(SetupStep::kPty);
  }
  // Sized here, not by the engine after it receives the master: that raced the command,
  // which could read 0x0 first (`stty size` printed "0 0").
  struct winsize ws {};
  ws.ws_col = cols;
  ws.ws_row = rows;
  if (::ioctl(master, TIOCSWINSZ, &ws) != 0) {
    fail(SetupStep::kPty);
  }
  StatusRecord rec{};
  rec.kind = RecordKind::kPtyMaster;
  struct iovec iov {
    &rec, sizeof rec
  };
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  std::memset(control, 0, sizeof control);
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &master, sizeof(int));
  if (::sendmsg(g_status_fd, &msg, MSG_NOSIGNAL) < 0) {
    fail(SetupStep::kPty);
  }
  ::close(master);
  return slave;
}

// Opens the cwd again beneath our own root and checks it is the directory the parent
// checked: a symlink or directory swapped in after the check fails the setup with ESTALE.
void enter_cwd(const ChildPlan& plan) {
  struct open_how how {};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  int fd = sys::openat2(AT_FDCWD, plan.cwd, &how);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOENT || errno == ENOTDIR || errno == EXDEV) {
      fail_errno(SetupStep::kCwd, ESTALE);
    }
    fail(SetupStep::kCwd);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    fail(SetupStep::kCwd);
  }
  if (st.st_dev != plan.cwd_dev || st.st_ino != plan.cwd_ino) {
    fail_errno(SetupStep::kCwd, ESTALE);
  }
  if (::fchdir(fd) != 0) {
    fail(SetupStep::kCwd);
  }
  ::close(fd);
}

int build_landlock(const ChildPlan& plan, bool empty) {
  sys::LandlockRulesetAttr attr{};
  attr.handled_access_fs = plan.landlock_handled;
  attr.scoped = empty ? 0 : plan.landlock_scoped;
  size_t size = plan.landlock_abi >= 6 ? sizeof attr : sizeof(uint64_t);
  int rs = sys::landlock_create_ruleset(&attr, size, 0);
  if (rs < 0) {
    fail(SetupStep::kLandlock);
  }
  if (empty) {
    return rs;
  }
  for (size_t i = 0; i < plan.n_landlock_rules; ++i) {
    const LandlockPathRule& r = plan.landlock_rules[i];
    int pfd = ::open(r.path, O_PATH | O_CLOEXEC);
    if (pfd < 0) {
      if (errno == ENOENT) {
        continue;  // an optional device the host lacks
      }
      fail(SetupStep::kLandlock);
    }
    struct stat st {};
    if (::fstat(pfd, &st) != 0) {
      fail(SetupStep::kLandlock);
    }
    uint64_t access = r.access & plan.landlock_handled;
    if (!S_ISDIR(st.st_mode)) {
      // Only file rights may be granted on a file.
      access &= LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                LANDLOCK_ACCESS_FS_READ_FILE | sys::kLandlockAccessFsTruncate |
                sys::kLandlockAccessFsIoctlDev;
    }
    sys::LandlockPathBeneathAttr pb{};
    pb.allowed_access = access;
    pb.parent_fd = pfd;
    if (sys::landlock_add_rule(rs, sys::kLandlockRuleTypePathBeneath, &pb, 0) != 0) {
      fail(SetupStep::kLandlock);
    }
    ::close(pfd);
  }
  if (plan.exec_fd >= 0) {
    sys::LandlockPathBeneathAttr pb{};
    pb.allowed_access =
        (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE) & plan.landlock_handled;
    pb.parent_fd = plan.exec_fd;
    if (sys::landlock_add_rule(rs, sys::kLandlockRuleTypePathBeneath, &pb, 0) != 0) {
      fail(SetupStep::kLandlock);
    }
  }
  return rs;
}

void drop_privileges(const ChildPlan& plan) {
  if (!wall_on(plan, Wall::kCapDrop)) {
    return;
  }
  // Locked securebits: no path back to capabilities through uid 0, setuid fixups or ambient.
  unsigned long bits = sys::kSecbitNoroot | sys::kSecbitNorootLocked | sys::kSecbitNoSetuidFixup |
                       sys::kSecbitNoSetuidFixupLocked | sys::kSecbitKeepCapsLocked |
                       sys::kSecbitNoCapAmbientRaise | sys::kSecbitNoCapAmbientRaiseLocked;
  if (::prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) {
    fail(SetupStep::kSecurebits);
  }
  for (int cap = 0; cap <= plan.cap_last_cap; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {
      fail(SetupStep::kBoundingSet);
    }
  }
  // Raw syscalls: glibc's wrappers would broadcast to threads through signals.
  if (::syscall(SYS_setgroups, 0, nullptr) != 0) {
    fail(SetupStep::kSetgroups);
  }
  if (::syscall(SYS_setresgid, plan.gid, plan.gid, plan.gid) != 0) {
    fail(SetupStep::kSetresgid);
  }
  if (::syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0) {
    fail(SetupStep::kSetresuid);
  }
  struct __user_cap_header_struct hdr {};
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  hdr.pid = 0;
  struct __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capset, &hdr, data) != 0) {
    fail(SetupStep::kCapabilities);
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
    fail(SetupStep::kCapabilities);
  }
}

// Puts each needed fd at its fixed number and closes everything else.
void arrange_fds(const ChildPlan& plan, int pty_slave, int ll_cmd, int ll_init) {
  struct Move {
    int src;
    int dst;
    bool cloexec;
  };
  Move moves[9];
  int n = 0;
  int in = plan.tty ? pty_slave : plan.stdin_fd;
  int out = plan.tty ? pty_slave : plan.stdout_fd;
  int err = plan.tty ? pty_slave : plan.stderr_fd;
  moves[n++] = {in, 0, false};
  moves[n++] = {out, 1, false};
  moves[n++] = {err, 2, false};
  moves[n++] = {plan.status_fd, kFdStatus, false};
  moves[n++] = {plan.plan_fd, kFdPlan, false};
  if (plan.exec_fd >= 0) {
    moves[n++] = {plan.exec_fd, kFdExec, false};
  }
  moves[n++] = {ll_cmd, kFdLandlockCmd, false};
  moves[n++] = {ll_init, kFdLandlockInit, false};
  moves[n++] = {plan.init_fd, kFdFirstFree, true};
  // Stage every source above the final range first so no dup2 clobbers a pending source.
  for (int i = 0; i < n; ++i) {
    if (moves[i].src < 0) {
      continue;
    }
    int tmp = ::fcntl(moves[i].src, F_DUPFD_CLOEXEC, 1000);
    if (tmp < 0) {
      fail(SetupStep::kFds);
    }
    moves[i].src = tmp;
  }
  for (int i = 0; i < n; ++i) {
    if (moves[i].src < 0) {
      continue;
    }
    if (::dup3(moves[i].src, moves[i].dst, moves[i].cloexec ? O_CLOEXEC : 0) < 0) {
      fail(SetupStep::kFds);
    }
  }
  g_status_fd = kFdStatus;
  if (wall_on(plan, Wall::kCloseFds)) {
    if (sys::close_range(kFdFirstFree + 1, ~0U, 0) != 0) {
      fail(SetupStep::kFds);
    }
  } else {
    // Test control: leave every inherited descriptor open, but still drop the staging copies.
    if (sys::close_range(1000, ~0U, 0) != 0) {
      fail(SetupStep::kFds);
    }
  }
  if (plan.exec_fd < 0) {
    ::close(kFdExec);
  }
}

// One go byte from the parent; EOF (the parent gave up or died) ends the child.
void wait_go(const ChildPlan& plan) {
  char go = 0;
  ssize_t got;
  do {
    got = ::recv(plan.status_fd, &go, 1, 0);
  } while (got < 0 && errno == EINTR);
  if (got != 1) {
    ::_exit(125);
  }
}

}  // namespace

void child_main(const ChildPlan& plan) {
  g_status_fd = plan.status_fd;

  // 0. Only the plan's descriptors stay open (keep_fds is sorted ascending).
  if (wall_on(plan, Wall::kCloseFds)) {
    unsigned next = 0;
    for (size_t i = 0; i < plan.n_keep_fds; ++i) {
      unsigned keep = static_cast<unsigned>(plan.keep_fds[i]);
      if (keep > next && sys::close_range(next, keep - 1, 0) != 0) {
        fail(SetupStep::kFds);
      }
      next = keep + 1;
    }
    if (sys::close_range(next, ~0U, 0) != 0) {
      fail(SetupStep::kFds);
    }
  }

  // A session of its own: otherwise init (and so the whole sandbox until the command's own
  // setsid) stays in the caller's session, with the caller's terminal as its controlling
  // terminal, and a Ctrl-C there signals init directly. cordon forwards the caller's signals.
  if (::setsid() < 0) {
    fail(SetupStep::kSession);
  }

  // An empty signal mask: a mask survives clone3 and exec, and the engine's spawner blocks
  // SIGCHLD for its signalfd (init and the command expect to start unblocked). Raw syscall.
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0) {
    fail(SetupStep::kFds);
  }

  // 1. Hybrid hosts: into the v1 job cgroups, before anything else runs or is allocated
  // here (ChildPlan::v1_tasks_fds); the descriptors are closed at once. Then wait for the go
  // byte: id maps written. EOF: the parent gave up.
  for (size_t i = 0; i < plan.n_v1_tasks_fds; ++i) {
    ssize_t w;
    do {
      w = ::write(plan.v1_tasks_fds[i], "0", 1);
    } while (w < 0 && errno == EINTR);
    if (w != 1) {
      fail(SetupStep::kCgroupPlace);
    }
    ::close(plan.v1_tasks_fds[i]);
  }
  wait_go(plan);
  // Once here, off the command's path (a parked sandbox does it before its job exists): init
  // then has only its own three handlers to reset for the command.
  default_all_signals();

  // 2. After the v1 placement, so v1 paths are rooted at the job too.
  if (plan.unshare_cgroupns && ::unshare(CLONE_NEWCGROUP) != 0) {
    fail(SetupStep::kCgroupNs);
  }

  // 3. Mounts, under a fresh tmpfs that becomes the root. Nothing propagates to the host.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    fail(SetupStep::kMountPrivate);
  }
  if (::mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, plan.root_options) != 0) {
    fail(SetupStep::kMountRootTmpfs);
  }
  if (::chdir("/tmp") != 0) {
    fail(SetupStep::kMountRootTmpfs);
  }
  int root_fd = ::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) {
    fail(SetupStep::kMountRootTmpfs);
  }
  for (size_t i = 0; i < plan.n_system_trees; ++i) {
    move_tree(root_fd, plan.system_trees[i], SetupStep::kMountSystem);
  }
  for (size_t i = 0; i < plan.n_symlinks; ++i) {
    if (::symlinkat(plan.symlinks[i].target, root_fd, plan.symlinks[i].path) != 0) {
      fail(SetupStep::kMountSystem);
    }
  }
  mount_etc(plan, root_fd);
  mount_proc(plan);
  mount_dev(plan, root_fd);
  // /tmp and /dev/shm before the working root, so a root under /tmp stays visible.
  mount_tmp(root_fd);
  for (size_t i = 0; i < plan.n_user_trees; ++i) {
    move_tree(root_fd, plan.user_trees[i],
              i == 0 ? SetupStep::kMountWorkRoot : SetupStep::kMountReadOnlyPath);
  }

  // 4. pivot_root into the tmpfs and drop the host's tree; then the root itself goes read-only.
  if (sys::pivot_root(".", ".") != 0) {
    fail(SetupStep::kPivotRoot);
  }
  if (::umount2(".", MNT_DETACH) != 0 || ::chdir("/") != 0) {
    fail(SetupStep::kPivotRoot);
  }
  remount_ro("/", MS_NOSUID | MS_NODEV, SetupStep::kPivotRoot);
  ::close(root_fd);

  if (plan.loopback_up) {
    loopback_up();
  }
  // In the host's uts namespace (test-walls control only) the name is the host's: setting it
  // there would be refused (EPERM) or, worse, rename the host.
  if (wall_on(plan, Wall::kUtsNamespace) &&
      ::sethostname(plan.hostname, std::strlen(plan.hostname)) != 0) {
    fail(SetupStep::kHostname);
  }
  for (size_t i = 0; i < plan.n_rlimits; ++i) {
    struct rlimit64 lim {
      plan.rlimits[i].soft, plan.rlimits[i].hard
    };
    if (::syscall(SYS_prlimit64, 0, plan.rlimits[i].resource, &lim, nullptr) != 0) {
      fail(SetupStep::kRlimits);
    }
  }
  // The command's umask is the caller's, never looser than 022: an embedder's umask 0 made
  // every file a job created in the working root writable by every host user (a red-team
  // review of the library, session 39). A stricter one (077) is kept.
  ::umask(::umask(0) | 022);

  // 5. The pty and the Landlock rulesets.
  int pty_slave = plan.tty ? open_pty(plan.tty_cols, plan.tty_rows) : -1;
  int ll_cmd = build_landlock(plan, false);
  int ll_init = build_landlock(plan, true);

  // 6. Drop every privilege; PDEATHSIG after the last credential change (which clears it).
  drop_privileges(plan);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) {
    fail(SetupStep::kPdeathsig);
  }
  // The cwd, checked against what the parent checked, entered as the command's user: with
  // our capabilities a directory it may not search (mode 000) would be entered here but not
  // by a parked sandbox's init (warm pool), which enters the job's cwd after the drop.
  if (plan.cwd != nullptr) {  // a parked sandbox: init enters the job's cwd
    enter_cwd(plan);
  }
  struct pollfd pfd {
    plan.status_fd, POLLIN, 0
  };
  if (::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR))) {
    ::_exit(125);  // the supervisor died before PDEATHSIG was armed
  }

  // 7. Only the plan's descriptors survive, at fixed numbers.
  arrange_fds(plan, pty_slave, ll_cmd, ll_init);

  // 8. Exec the init from the fd opened before pivot_root: no copy of our memory stays.
  static char init_name[] = "cordon-init";
  char* const argv[] = {init_name, nullptr};
  char* const envp[] = {nullptr};
  sys::execveat(kFdFirstFree, "", argv, envp, AT_EMPTY_PATH);
  fail(SetupStep::kExecInit);
}

}  // namespace cordon::sandbox
