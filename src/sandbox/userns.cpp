#include "sandbox/userns.hpp"

#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "base/scope_exit.hpp"
#include "base/strings.hpp"
#include "sandbox/idmap_child.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {

namespace {

// Checks a directory of the lease path: ours (or root's, for a shared parent like /run/cordon),
// a directory, not a link, writable by no one else.
Result<void> check_lease_dir(int fd, const std::string& path, bool root_may_own) {
  CORDON_TRY_CTX(st, sys::fstat_fd(fd), "`{}`", path);
  bool owner_ok = st.st_uid == ::geteuid() || (root_may_own && st.st_uid == 0);
  if (!S_ISDIR(st.st_mode) || !owner_ok || (st.st_mode & 022) != 0) {
    return refusal("the host-id lease dir `{}` must be owned by uid {} and writable by no one else",
                   path, ::geteuid());
  }
  return {};
}

// Opens `lock_dir` (`<parent>/<leaf>`), creating the parent (0755) and the leaf (0700) when
// missing, each opened without following a link and checked: whoever could write the parent
// could move the leaf away and have the next cordon lease ids still in use.
Result<UniqueFd> open_lease_dir(const std::string& lock_dir) {
  std::string path = normalize_path(lock_dir);
  size_t slash = path.rfind('/');
  size_t pslash =
      slash == std::string::npos || slash == 0 ? std::string::npos : path.rfind('/', slash - 1);
  if (path.empty() || path[0] != '/' || slash == std::string::npos || pslash == std::string::npos) {
    return invalid("the host-id lease dir `{}` must be an absolute path two levels deep", lock_dir);
  }
  const std::string grand = pslash == 0 ? "/" : path.substr(0, pslash);
  const std::string parent_name = path.substr(pslash + 1, slash - pslash - 1);
  const std::string leaf = path.substr(slash + 1);
  int raw = ::open(grand.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (raw < 0) {
    return sys_error("open `{}`", grand);
  }
  UniqueFd gp(raw);
  if (::mkdirat(gp.get(), parent_name.c_str(), 0755) != 0 && errno != EEXIST) {
    return sys_error("mkdir `{}`", path.substr(0, slash));
  }
  raw = ::openat(gp.get(), parent_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (raw < 0) {
    return sys_error("open `{}`", path.substr(0, slash));
  }
  UniqueFd parent(raw);
  CORDON_CHECK(check_lease_dir(parent.get(), path.substr(0, slash), /*root_may_own=*/true));
  if (::mkdirat(parent.get(), leaf.c_str(), 0700) != 0 && errno != EEXIST) {
    return sys_error("mkdir `{}`", path);
  }
  raw = ::openat(parent.get(), leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (raw < 0) {
    return sys_error("open `{}`", path);
  }
  UniqueFd dir(raw);
  CORDON_CHECK(check_lease_dir(dir.get(), path, /*root_may_own=*/false));
  return dir;
}

// What locking one lease file found.
struct LeaseLock {
  std::optional<UniqueFd> fd;  // ours
  bool gone = false;           // released (removed) under us: the id may be free now
};

// Locks `name` in `dir` without waiting. The lock is ours only while the name still refers to
// the file we locked: a releaser removes the file under its lock, so a lock taken on a file
// opened before that is on a file no longer at this name (which another acquirer may have
// created anew). A name that is not a plain file (a link, a directory) is never ours.
Result<LeaseLock> lock_lease_file(int dir, const std::string& lock_dir, const std::string& name,
                                  bool create) {
  LeaseLock out;
  int fd =
      ::openat(dir, name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
  if (fd < 0) {
    if (errno == ENOENT && !create) {
      out.gone = true;  // released since the sweep listed it
      return out;
    }
    if (errno == ELOOP || errno == EISDIR || errno == ENXIO) {
      return out;  // not a lease file: held by no one, usable by no one
    }
    return sys_error("open `{}/{}`", lock_dir, name);
  }
  UniqueFd lock(fd);
  struct stat held {};
  if (::fstat(fd, &held) != 0) {
    return sys_error("fstat `{}/{}`", lock_dir, name);
  }
  if (!S_ISREG(held.st_mode)) {
    return out;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return sys_error("flock `{}/{}`", lock_dir, name);
    }
    return out;  // held
  }
  struct stat named {};
  int named_rc = ::fstatat(dir, name.c_str(), &named, AT_SYMLINK_NOFOLLOW);
  if (named_rc != 0 && errno != ENOENT) {
    return sys_error("stat `{}/{}`", lock_dir, name);
  }
  if (named_rc != 0 || held.st_dev != named.st_dev || held.st_ino != named.st_ino) {
    out.gone = true;
    return out;
  }
  out.fd = std::move(lock);
  return out;
}

// Tries per id when a lock finds its file released under it: each try may meet one more
// release, and after a few the id is left for a later probe.
constexpr int kTriesPerId = 4;

}  // namespace

Result<void> check_host_id_range(uint64_t base, uint64_t count) {
  if (count == 0 || base < 65536 || base + count > 0xFFFFFFFEULL) {
    return invalid(
        "host ids {}:{} (START:COUNT): START must be >= 65536, COUNT > 0 and the range below "
        "4294967294, e.g. {}:{}",
        base, count, kHostIdBase, kHostIdCount);
  }
  return {};
}

Result<HostIdLease> HostIdLease::acquire(const std::string& lock_dir, uid_t base, uid_t count) {
  CORDON_TRY(dir, open_lease_dir(lock_dir));
  // Random start: concurrent runs rarely probe the same files.
  std::random_device rd;
  uid_t start = static_cast<uid_t>(rd() % count);
  for (uid_t i = 0; i < count; ++i) {
    uid_t slot = (start + i) % count;
    // Keyed by the id itself, so differently configured ranges never hand the same host id
    // to two sandboxes.
    std::string name = std::to_string(base + slot);
    for (int attempt = 0; attempt < kTriesPerId; ++attempt) {
      CORDON_TRY(lock, lock_lease_file(dir.get(), lock_dir, name, /*create=*/true));
      if (lock.fd) {
        return HostIdLease(base + slot, std::move(*lock.fd), lock_dir + "/" + name);
      }
      if (!lock.gone) {
        break;  // held by a live lease (or not a lease file): the next id
      }
    }
  }
  return errno_error(EAGAIN, "lease a host uid in `{}`: all {} ids in use", lock_dir, count);
}

void HostIdLease::release() {
  if (lock_) {
    // Under the lock: nobody else holds this file now, and whoever opened it meanwhile sees
    // the name gone (or a new file) after locking and leaves it.
    (void)::unlink(path_.c_str());
    lock_.reset();
  }
}

HostIdLease& HostIdLease::operator=(HostIdLease&& other) noexcept {
  if (this != &other) {
    release();
    id_ = other.id_;
    lock_ = std::move(other.lock_);
    path_ = std::move(other.path_);
  }
  return *this;
}

HostIdLease::~HostIdLease() { release(); }

Result<size_t> HostIdLease::sweep(const std::string& lock_dir) {
  CORDON_TRY(dir, open_lease_dir(lock_dir));
  CORDON_TRY(names, sys::dir_entries(dir.get(), lock_dir));
  size_t swept = 0;
  for (const auto& name : names) {
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) {
      continue;  // not a lease file
    }
    auto lock = lock_lease_file(dir.get(), lock_dir, name, /*create=*/false);
    if (lock && lock->fd && ::unlinkat(dir.get(), name.c_str(), 0) == 0) {
      ++swept;  // removed under its lock, as a release does
    }
  }
  return swept;
}

Result<void> write_id_maps(pid_t pid, uid_t inside_uid, gid_t inside_gid, uid_t host_uid,
                           gid_t host_gid) {
  std::string dir = fmt::format("/proc/{}", pid);
  CORDON_CHECK(sys::write_file(dir + "/uid_map", fmt::format("{} {} 1\n", inside_uid, host_uid)));
  CORDON_CHECK(sys::write_file(dir + "/gid_map", fmt::format("{} {} 1\n", inside_gid, host_gid)));
  return {};
}

Result<EffectiveIdSwitch> EffectiveIdSwitch::to(uid_t id) {
  int old_bits = ::prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
  if (old_bits < 0) {
    return sys_error("prctl PR_GET_SECUREBITS");
  }
  if (::prctl(PR_SET_SECUREBITS, static_cast<unsigned long>(old_bits) | sys::kSecbitNoSetuidFixup,
              0, 0, 0) != 0) {
    return sys_error("prctl PR_SET_SECUREBITS NO_SETUID_FIXUP");
  }
  EffectiveIdSwitch sw(old_bits);
  // Raw syscalls: only this thread (the one that clones) changes credentials.
  if (::syscall(SYS_setresgid, -1, id, -1) != 0) {
    return sys_error("setresgid(-1, {}, -1)", id);
  }
  sw.gid_switched_ = true;
  if (::syscall(SYS_setresuid, -1, id, -1) != 0) {
    return sys_error("setresuid(-1, {}, -1)", id);
  }
  sw.uid_switched_ = true;
  return sw;
}

EffectiveIdSwitch::~EffectiveIdSwitch() {
  // Continuing as the wrong user would be worse than dying.
  if (uid_switched_ && ::syscall(SYS_setresuid, -1, 0, -1) != 0) {
    ::abort();
  }
  if (gid_switched_ && ::syscall(SYS_setresgid, -1, 0, -1) != 0) {
    ::abort();
  }
  if (old_bits_ >= 0) {
    (void)::prctl(PR_SET_SECUREBITS, static_cast<unsigned long>(old_bits_), 0, 0, 0);
  }
}

namespace {

#if defined(__x86_64__)
// Blocks every signal of this thread but those that end a process by default and have no
// handler, and restores the mask at the end of its scope. No handler runs in a child made
// meanwhile (it would run on the child's stack with our thread's thread-local storage, in
// memory it shares with us); a signal left unblocked ends the child, or us, as it would have
// before. Blocking those too would hold them back, and would look like the moment the CLI
// takes SIGTERM for itself (run/a_signal_before_init_is_ready_still_reaches_the_command
// watches the mask for that). The raw system call: glibc's pthread_sigmask leaves its own
// two signals (32, 33: thread cancellation and set*id broadcast) unblocked, and a threaded
// caller has a handler for the second.
class SignalsHeld {
 public:
  SignalsHeld() {
    uint64_t all = ~uint64_t{0};
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
      struct sigaction sa {};
      if (::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == SIG_DFL &&
          (sa.sa_flags & SA_SIGINFO) == 0) {
        all &= ~(uint64_t{1} << (sig - 1));
      }
    }
    if (::syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &old_, sizeof all) != 0) {
      err_ = errno;
    }
  }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;
  ~SignalsHeld() {
    if (err_ == 0) {
      (void)::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old_, nullptr, sizeof old_);
    }
  }
  int error() const { return err_; }

 private:
  uint64_t old_ = 0;  // the kernel's sigset on x86-64: 64 bits
  int err_ = 0;
};
#endif

}  // namespace

Result<UniqueFd> make_idmap_userns(uid_t disk_uid, gid_t disk_gid, uid_t host_uid, gid_t host_gid) {
  // A child in a new user namespace that only waits; we map it, keep its namespace, end it.
  // Root makes it as `host_uid` (EffectiveIdSwitch): a namespace owned by root would give any
  // process of euid 0, even one without any capability, CAP_SYS_PTRACE over the child (its
  // memory, which is ours; its namespace, whose maps we are writing), also while it exits.
  // Another caller's processes may reach the child only as their own.
  int pidfd = -1;
  std::optional<EffectiveIdSwitch> as_host;
  auto become_host = [&]() -> Result<void> {
    if (::geteuid() == 0) {
      CORDON_TRY(sw, EffectiveIdSwitch::to(host_uid));
      as_host.emplace(std::move(sw));
    }
    return {};
  };
#if defined(__x86_64__)
  alignas(64) char stack[16384];  // the child's; untouched by this frame until it is reaped
  IdmapChildArgs child_args{::getpid()};
  long pid;
  {
    SignalsHeld held;
    if (held.error() != 0) {
      return errno_error(held.error(), "pthread_sigmask (idmap user namespace)");
    }
    CORDON_CHECK(become_host());
    pid = ::clone(idmap_child, stack + sizeof stack,
                  CLONE_VM | CLONE_FILES | CLONE_NEWUSER | CLONE_PIDFD | SIGCHLD,
                  static_cast<void*>(&child_args), &pidfd);
    const int clone_errno = errno;
    as_host.reset();
    errno = clone_errno;
  }
  if (pid < 0) {
    return sys_error("clone (idmap user namespace)");
  }
#else
  // A fork that waits for its pipe's EOF (its copy of the write end closed first).
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    return sys_error("pipe2");
  }
  UniqueFd rd(pipefd[0]);
  UniqueFd wr(pipefd[1]);
  struct clone_args args {};
  args.flags = CLONE_NEWUSER | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  CORDON_CHECK(become_host());
  long pid = sys::clone3(&args);
  if (pid == 0) {
    char c;
    ::close(pipefd[1]);
    while (::read(pipefd[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  const int clone_errno = errno;
  as_host.reset();
  if (pid < 0) {
    return errno_error(clone_errno, "clone3 (idmap user namespace)");
  }
#endif
  UniqueFd child(pidfd);
  // On every way out: killed and reaped.
  ScopeExit reap([&] {
    (void)sys::pidfd_send_signal(child.get(), SIGKILL, nullptr, 0);
    siginfo_t info{};
    while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(child.get()), &info,
                    WEXITED) != 0 &&
           errno == EINTR) {
    }
  });
  auto maps = write_id_maps(static_cast<pid_t>(pid), disk_uid, disk_gid, host_uid, host_gid);
  if (!maps) {
    return std::unexpected(std::move(maps.error()).wrap("map idmap user namespace"));
  }
  CORDON_TRY(ns, sys::open_fd(fmt::format("/proc/{}/ns/user", pid), O_RDONLY));
  // The maps and the namespace were reached by pid: the child is not reaped yet (by us; nor by
  // an embedder that ignores SIGCHLD or waits for any child), so that pid was still its own.
  if (sys::pidfd_send_signal(child.get(), 0, nullptr, 0) != 0) {
    return sys_error("pidfd_send_signal (the idmap namespace's child ended early)");
  }
  return ns;
}

namespace {

// Lines "name:x:id:..." (passwd/group) or "name:start:count" (subuid/subgid).
void check_db(const std::string& path, bool ranges, uid_t base, uid_t count, std::string& out) {
  auto text = read_small_file(path);
  if (!text) {
    return;
  }
  for (const auto& line : split(*text, '\n')) {
    auto f = split(line, ':');
    if (ranges && f.size() >= 3) {
      auto start = parse_uint(f[1]);
      auto n = parse_uint(f[2]);
      if (start && n && *start<uint64_t{base} + count&& * start + *n> base) {
        out += fmt::format("{}: {} overlaps the reserved range; ", path, line);
      }
    } else if (!ranges && f.size() >= 3) {
      auto id = parse_uint(f[2]);
      if (id && *id >= base && *id < uint64_t{base} + count) {
        out += fmt::format("{}: {} uses an id in the reserved range; ", path, f[0]);
      }
    }
  }
}

}  // namespace

std::string host_id_range_conflicts(uid_t base, uid_t count) {
  std::string out;
  check_db("/etc/passwd", false, base, count, out);
  check_db("/etc/group", false, base, count, out);
  check_db("/etc/subuid", true, base, count, out);
  check_db("/etc/subgid", true, base, count, out);
  return out;
}

}  // namespace cordon::sandbox
