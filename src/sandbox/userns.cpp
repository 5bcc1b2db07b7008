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
#include <random>

#include "base/strings.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {

Result<HostIdLease> HostIdLease::acquire(const std::string& lock_dir, uid_t base, uid_t count) {
  if (::mkdir(lock_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return sys_error("mkdir `{}`", lock_dir);
  }
  // Random start: concurrent runs rarely probe the same files.
  std::random_device rd;
  uid_t start = static_cast<uid_t>(rd() % count);
  for (uid_t i = 0; i < count; ++i) {
    uid_t slot = (start + i) % count;
    // Keyed by the id itself, so differently configured ranges sharing a state dir never
    // hand the same host id to two sandboxes.
    std::string path = fmt::format("{}/{}", lock_dir, base + slot);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      return sys_error("open `{}`", path);
    }
    UniqueFd lock(fd);
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      return HostIdLease(base + slot, std::move(lock));
    }
    if (errno != EWOULDBLOCK) {
      return sys_error("flock `{}`", path);
    }
  }
  return errno_error(EAGAIN, "lease a host uid in `{}`: all {} ids in use", lock_dir, count);
}

Result<void> write_id_maps(pid_t pid, uid_t inside_uid, gid_t inside_gid, uid_t host_uid,
                           gid_t host_gid) {
  std::string dir = fmt::format("/proc/{}", pid);
  CORDON_CHECK(sys::write_file(dir + "/uid_map", fmt::format("{} {} 1\n", inside_uid, host_uid)));
  CORDON_CHECK(sys::write_file(dir + "/gid_map", fmt::format("{} {} 1\n", inside_gid, host_gid)));
  return {};
}

Result<UniqueFd> make_idmap_userns(uid_t disk_uid, gid_t disk_gid, uid_t host_uid, gid_t host_gid) {
  // A child in a new user namespace that only waits; we map it, keep its namespace, kill it.
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
  long pid = sys::clone3(&args);
  if (pid < 0) {
    return sys_error("clone3 (idmap user namespace)");
  }
  if (pid == 0) {
    char c;
    ::close(pipefd[1]);
    while (::read(pipefd[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
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
