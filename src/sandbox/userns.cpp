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
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "base/strings.hpp"
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

long clone3_in_owned_userns(struct clone_args* args) {
  // The lock keeps two callers from restoring the flag under each other's clone.
  static std::mutex mu;
  std::unique_lock lock(mu);
  int was_dumpable = ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
  if (was_dumpable < 0 || (was_dumpable != 0 && ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)) {
    return -1;  // errno is prctl's
  }
  long pid = sys::clone3(args);
  if (pid == 0) {
    (void)lock.release();  // the child's copy: never unlocked, never used
    return 0;
  }
  const int clone_errno = errno;
  // Only 1 is set again (2, "suidsafe", is the kernel's own). Should that fail we stay
  // non-dumpable, the stricter side, and go on.
  if (was_dumpable == 1) {
    (void)::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  }
  errno = clone_errno;
  return pid;
}

Result<UniqueFd> make_idmap_userns(uid_t disk_uid, gid_t disk_gid, uid_t host_uid, gid_t host_gid) {
  // A child in a new user namespace that only waits; we map it, keep its namespace, end it.
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    return sys_error("pipe2");
  }
  UniqueFd rd(pipefd[0]);
  UniqueFd wr(pipefd[1]);
  int pidfd = -1;
  struct clone_args args {};
  args.flags = CLONE_NEWUSER | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  long pid = clone3_in_owned_userns(&args);
  if (pid == 0) {
    char c;
    ::close(pipefd[1]);
    while (::read(pipefd[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  if (pid < 0) {
    return sys_error("clone3 (idmap user namespace)");
  }
  UniqueFd child(pidfd);
  auto reap = [&] {
    wr.reset();
    siginfo_t info{};
    ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(child.get()), &info, WEXITED);
  };
  auto maps = write_id_maps(static_cast<pid_t>(pid), disk_uid, disk_gid, host_uid, host_gid);
  if (!maps) {
    reap();
    return std::unexpected(std::move(maps.error()).wrap("map idmap user namespace"));
  }
  std::string ns = fmt::format("/proc/{}/ns/user", pid);
  auto fd = sys::open_fd(ns, O_RDONLY);
  reap();
  return fd;
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
