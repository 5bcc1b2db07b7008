// probe — the escape-probe program cordon's security tests run INSIDE the sandbox.
//
// Each invocation makes exactly one attempt and prints exactly one line on stdout:
//
//   probe <name>: allowed[ <detail>]   the attack's syscall succeeded
//   probe <name>: errno <NAME>         it failed with that errno (strerrorname_np)
//   probe <name>: signal <NAME>        the attempt ran in a forked child that died by a signal
//                                      (seccomp KILL, SIGSYS, SIGSEGV from a dead int $0x80)
//   probe <name>: value <text>         a read-type probe's reading; an empty reading is `-`
//
// Exit status: 0 when a line was printed (the probe ran, whatever the kernel said); 1 when the
// probe could not even make its attempt (a pipe or fork it needs failed; message on stderr,
// nothing on stdout); 2 for a usage error (unknown name, wrong arguments, or `kill-all` outside
// a sandbox-shaped pid namespace, where it refuses to run). `exit`, `raise`, `sleep-forever`,
// `ignore-term-and-fork` and `inotify-exhaust hold` deliberately end otherwise. Multi-step
// probes report the errno of the first step that failed.
//
// Attempts that a seccomp filter may answer by killing the process run in a forked child, so
// the kill is reported as `signal SIG…` instead of the probe vanishing without its line.
//
// This file depends on nothing of cordon: plain C++ and libc, raw syscalls where glibc has no
// wrapper. It is linked statically so it runs in any mount layout a test builds, and never
// with sanitizers (their runtime wants /proc, big mappings and its own signal handlers, all of
// which the sandbox is meant to deny).

#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/capability.h>
#include <linux/if_ether.h>
#include <linux/io_uring.h>
#include <linux/ioprio.h>
#include <linux/keyctl.h>
#include <linux/openat2.h>
#include <linux/perf_event.h>
#include <linux/tiocl.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Args = std::span<char* const>;

// ---------------------------------------------------------------------------------------------
// Output grammar
// ---------------------------------------------------------------------------------------------

std::string_view g_probe_name = "?";

std::string errno_name(int err) {
  const char* name = strerrorname_np(err);
  return name != nullptr ? name : std::to_string(err);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "SIG" + std::to_string(sig);
}

std::string allowed(std::string_view detail = {}) {
  return detail.empty() ? std::string("allowed") : "allowed " + std::string(detail);
}
std::string denied(int err) { return "errno " + errno_name(err); }
std::string killed_by(int sig) { return "signal " + signal_name(sig); }
std::string value(std::string_view text) {
  return "value " + (text.empty() ? std::string("-") : std::string(text));
}
// Reads errno, so call it directly on the attack's return value.
std::string outcome_of(long rc) { return rc < 0 ? denied(errno) : allowed(); }

// One write(2) per line: stdout is usually a pipe, and nothing may sit in a stdio buffer when
// the probe is killed or forks.
void emit(const std::string& outcome) {
  std::string line = "probe " + std::string(g_probe_name) + ": " + outcome + "\n";
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = write(STDOUT_FILENO, p, left);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      _exit(1);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

[[noreturn]] void cannot_attempt(const char* what) {
  int err = errno;
  std::fprintf(stderr, "probe %.*s: cannot attempt: %s: %s\n",
               static_cast<int>(g_probe_name.size()), g_probe_name.data(), what,
               errno_name(err).c_str());
  std::exit(1);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "probe: %s (probe --help lists the probes)\n", message.c_str());
  std::exit(2);
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

struct ReadResult {
  std::string text;
  int err = 0;  // errno of the failed open/read, 0 on success
};

ReadResult read_file(const char* path, size_t limit = SIZE_MAX) {
  ReadResult r;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.err = errno;
    return r;
  }
  char buf[4096];
  while (r.text.size() < limit) {
    ssize_t n = read(fd, buf, std::min(sizeof(buf), limit - r.text.size()));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      r.err = errno;
      break;
    }
    if (n == 0) {
      break;
    }
    r.text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return r;
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) {
      ++i;
    }
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') {
      ++i;
    }
    if (i > start) {
      out.push_back(line.substr(start, i - start));
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) {
      out += sep;
    }
    out += p;
  }
  return out;
}

// "Key=value" for each requested /proc/self/status field, in the order asked; a field the
// kernel does not print is left out.
std::string status_fields(std::initializer_list<std::string_view> keys, int* err) {
  ReadResult status = read_file("/proc/self/status");
  *err = status.err;
  std::vector<std::string> parts;
  for (std::string_view key : keys) {
    for (std::string_view line : split(status.text, '\n')) {
      if (line.size() > key.size() && line.substr(0, key.size()) == key &&
          line[key.size()] == ':') {
        auto w = words(line.substr(key.size() + 1));
        parts.push_back(std::string(key) + "=" + (w.empty() ? "" : std::string(w[0])));
      }
    }
  }
  return join(parts, " ");
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 0xf];
  }
  return out;
}

std::string octal_mode(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0%o", static_cast<unsigned>(mode));
  return buf;
}

long parse_long(const char* text, const char* what) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0') {
    usage_error(std::string("bad ") + what + " `" + text + "`");
  }
  return v;
}

int parse_signal(const char* text) {
  std::string_view name = text;
  if (name.substr(0, 3) == "SIG") {
    name.remove_prefix(3);
  }
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev != nullptr && name == abbrev) {
      return sig;
    }
  }
  long v = parse_long(text, "signal");
  if (v <= 0 || v >= NSIG) {
    usage_error(std::string("bad signal `") + text + "`");
  }
  return static_cast<int>(v);
}

// Runs `attempt` in a forked child and reports how that child ended: the outcome it computed,
// or the signal that killed it. For attacks a seccomp filter may answer with KILL, and for
// attempts that change the calling process (unshare, keyrings, clone).
template <class F>
std::string in_child(F&& attempt) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) {
    cannot_attempt("pipe2");
  }
  pid_t pid = fork();
  if (pid < 0) {
    cannot_attempt("fork");
  }
  if (pid == 0) {
    close(fds[0]);
    std::string out = attempt();
    // Short pipe write (< PIPE_BUF) is atomic; a failure leaves the parent with EOF → exit 1.
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      cannot_attempt("waitpid");
    }
  }
  if (WIFSIGNALED(status)) {
    return killed_by(WTERMSIG(status));
  }
  if (out.empty()) {
    errno = 0;
    cannot_attempt("child exited without an outcome");
  }
  return out;
}

// The mount probes must not change the mount table of whoever runs them outside a sandbox
// (the tests' control runs are root on the host). So the child first tries to get a private
// mount namespace. Inside the sandbox that unshare is itself refused, and the mount is then
// attempted in the sandbox's own namespace — the real attack. What is reported is always the
// mount's own result.
void try_private_mount_ns() {
  if (unshare(CLONE_NEWNS) == 0) {
    // Without this, a mount under a shared parent would propagate back to the host.
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) {
      cannot_attempt("make / private in the new mount namespace");
    }
  }
}

// The file a mode/xattr probe works on: created if missing, used as it is otherwise (a test
// may point at a read-only host file).
void ensure_file(const char* path) {
  struct stat st;
  if (stat(path, &st) == 0) {
    return;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0755);
  if (fd < 0) {
    cannot_attempt("create the target file");
  }
  close(fd);
}

std::string mode_detail(const char* path) {
  struct stat st;
  if (stat(path, &st) < 0) {
    return "mode=" + denied(errno);
  }
  return "mode=" + octal_mode(st.st_mode);
}

// ---------------------------------------------------------------------------------------------
// Terminal injection (wall: the ioctl argument filter, 32-bit masked compare)
// ---------------------------------------------------------------------------------------------

// Pushes a byte into the controlling terminal's input queue: a sandboxed command sharing the
// user's pty could type commands into the shell that runs after it (CVE-2017-5226 in bwrap).
// On stdin, or on the descriptor given (1 and 2 are the same terminal when a caller's is
// handed in whole).
std::string probe_tiocsti(Args args) {
  int fd = args.empty() ? STDIN_FILENO : static_cast<int>(parse_long(args[0], "fd"));
  return in_child([fd] {
    char c = 'x';
    return outcome_of(ioctl(fd, TIOCSTI, &c));
  });
}

// The kernel truncates ioctl's cmd to 32 bits; a filter comparing all 64 bits would let
// TIOCSTI through with a high bit set (the bwrap/flatpak CVE-2019-10063 bypass).
std::string probe_tiocsti_bit32(Args) {
  return in_child([] {
    char c = 'x';
    unsigned long cmd = static_cast<unsigned long>(TIOCSTI) | (1UL << 32);
    return outcome_of(syscall(SYS_ioctl, STDIN_FILENO, cmd, &c));
  });
}

// TIOCLINUX TIOCL_SETSEL + TIOCL_PASTESEL is the console copy/paste injection route
// (CVE-2023-1523 class). On a pty the kernel answers ENOTTY/EINVAL; the filter answers EPERM.
std::string probe_tioclinux(Args) {
  return in_child([] {
    unsigned char arg[1 + sizeof(struct tiocl_selection)] = {};
    arg[0] = TIOCL_SETSEL;
    return outcome_of(ioctl(STDIN_FILENO, TIOCLINUX, arg));
  });
}

// Line disciplines are a classic kernel attack surface (n_gsm CVE-2023-6546, n_hdlc
// CVE-2017-2636), reached through TIOCSETD. The filter blocks the ioctl number whatever the
// discipline, so the default is the harmless N_TTY (0); pass a number to try another.
std::string probe_tiocsetd(Args args) {
  int ldisc = args.empty() ? 0 : static_cast<int>(parse_long(args[0], "line discipline"));
  return in_child([ldisc] { return outcome_of(ioctl(STDIN_FILENO, TIOCSETD, &ldisc)); });
}

// ---------------------------------------------------------------------------------------------
// Namespaces and mounts (walls: seccomp namespace-flag filter, no capabilities, nested userns
// quota, nosuid/nodev mounts)
// ---------------------------------------------------------------------------------------------

// A nested user namespace hands back a full capability set over new namespaces: the doorway
// to most kernel LPEs of the last years (nf_tables, overlayfs, …).
std::string probe_userns(Args) {
  return in_child([] { return outcome_of(unshare(CLONE_NEWUSER)); });
}

int unshare_flag(std::string_view ns) {
  struct Entry {
    std::string_view name;
    int flag;
  };
  static constexpr Entry kNamespaces[] = {
      {"user", CLONE_NEWUSER},     {"mnt", CLONE_NEWNS},    {"net", CLONE_NEWNET},
      {"pid", CLONE_NEWPID},       {"ipc", CLONE_NEWIPC},   {"uts", CLONE_NEWUTS},
      {"cgroup", CLONE_NEWCGROUP}, {"time", CLONE_NEWTIME},
  };
  for (const auto& e : kNamespaces) {
    if (e.name == ns) {
      return e.flag;
    }
  }
  usage_error("unknown namespace `" + std::string(ns) + "` (user mnt net pid ipc uts cgroup time)");
}

// The same wall for every namespace type.
std::string probe_unshare(Args args) {
  int flag = unshare_flag(args[0]);
  return in_child([flag] { return outcome_of(unshare(flag)); });
}

// The same request through raw clone: a filter that only checks unshare would miss it.
std::string probe_clone_newuser(Args) {
  return in_child([] {
    long rc = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
    if (rc == 0) {
      syscall(SYS_exit_group, 0);  // the grandchild: nothing to do
    }
    if (rc < 0) {
      return denied(errno);
    }
    waitpid(static_cast<pid_t>(rc), nullptr, 0);
    return allowed();
  });
}

// A write lock on the first byte of a file made in `dir`, taken with fcntl command `cmd`.
std::string byte_lock(const char* dir, int cmd) {
  std::string path = std::string(dir) + "/byte-lock";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return "setup: open " + errno_name(errno);
  }
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_len = 1;
  long rc = fcntl(fd, cmd, &lock);
  int err = errno;
  close(fd);
  unlink(path.c_str());
  return rc < 0 ? denied(err) : allowed();
}

// An OFD byte-range lock (F_OFD_SETLK 37, or with `get` F_OFD_GETLK 36, which programs probe
// for OFD locks with): refused by the fixed filter, whose locks a command could make its own
// death walk (seccomp.cpp).
std::string probe_ofd_lock(Args args) {
  return byte_lock(args[0], args.size() > 1 && std::string_view(args[1]) == "get" ? 36 : 37);
}

// A classic F_SETLK lock, which stays allowed (it goes with its process).
std::string probe_posix_lock(Args args) { return byte_lock(args[0], F_SETLK); }

// dnotify on a directory (F_NOTIFY, 1026, DN_MODIFY).
std::string probe_dnotify(Args args) {
  int fd = open(args[0], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return "setup: open " + errno_name(errno);
  }
  long rc = fcntl(fd, 1026 /* F_NOTIFY */, 0x2 /* DN_MODIFY */);
  int err = errno;
  close(fd);
  return rc < 0 ? denied(err) : allowed();
}

// Sets one option on a new UDP socket of `family`: the kernel's (or a filter's) answer.
std::string udp_setsockopt(int family, int level, int name, const void* value, socklen_t len) {
  int s = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    return "setup: socket " + errno_name(errno);
  }
  long rc = setsockopt(s, level, name, value, len);
  int err = errno;
  close(s);
  return rc < 0 ? denied(err) : allowed();
}

// A one-instruction classic BPF socket filter (`accept everything`) on a UDP socket.
std::string probe_socket_filter(Args) {
  struct {
    uint16_t code;
    uint8_t jt, jf;
    uint32_t k;
  } insn[1] = {{0x06 /* BPF_RET | BPF_K */, 0, 0, 0xffffffff}};
  struct {
    unsigned short len;
    void* filter;
  } prog = {1, insn};
  return udp_setsockopt(AF_INET, SOL_SOCKET, 26 /* SO_ATTACH_FILTER */, &prog, sizeof prog);
}

// Takes one IPv6 flow label (a host-wide pool of 4096, not per network namespace).
std::string probe_flowlabel(Args) {
  struct {  // struct in6_flowlabel_req
    struct in6_addr dst;
    uint32_t label;
    uint8_t action, share;
    uint16_t flags, expires, linger;
    uint32_t pad;
  } req{};
  req.dst = in6addr_loopback;
  req.label = htonl(0x1000 + static_cast<uint32_t>(getpid()) % 0x80000);
  req.action = 0;     // IPV6_FL_A_GET
  req.share = 1;      // IPV6_FL_S_EXCL
  req.flags = 1 | 2;  // IPV6_FL_F_CREATE | IPV6_FL_F_EXCL
  req.expires = req.linger = 1;
  return udp_setsockopt(AF_INET6, IPPROTO_IPV6, 32 /* IPV6_FLOWLABEL_MGR */, &req, sizeof req);
}

// Resident pages of `fd`'s first `size` bytes (mincore of a mapping of them).
long resident_pages(int fd, size_t size) {
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return -1;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  long n = mincore(map, size, vec.data()) == 0 ? 0 : -1;
  for (unsigned char v : vec) {
    n += (n >= 0 && (v & 1)) ? 1 : 0;
  }
  munmap(map, size);
  return n;
}

// posix_fadvise(POSIX_FADV_DONTNEED) on a read-only descriptor of `file`, read whole first:
// "<resident pages before> <after>" (the kernel drops the clean pages: after is 0).
std::string probe_fadvise_dontneed(Args args) {
  int fd = open(args[0], O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return "setup: open " + errno_name(errno);
  }
  struct stat st {};
  char buf[65536];
  if (fstat(fd, &st) != 0 || st.st_size == 0) {
    close(fd);
    return "setup: fstat or an empty file";
  }
  fdatasync(fd);  // clean pages only are dropped
  while (read(fd, buf, sizeof buf) > 0) {
  }
  const auto size = static_cast<size_t>(st.st_size);
  long before = resident_pages(fd, size);
  int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  long after = resident_pages(fd, size);
  close(fd);
  if (rc != 0) {
    return denied(rc);
  }
  return value(std::to_string(before) + " " + std::to_string(after));
}

// Maps a file shared and read-only, touches each page, and advises MADV_COLD on it (20, not
// in these headers): what the advice did to the pages is read from outside (kpageflags).
std::string probe_madvise_cold(Args args) {
  int fd = open(args[0], O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
    return "setup: open or fstat, or an empty file";
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    return "setup: mmap " + errno_name(errno);
  }
  volatile const char* bytes = static_cast<const char*>(map);
  for (size_t i = 0; i < size; i += 4096) {
    (void)bytes[i];
  }
  constexpr int kMadvCold = 20;
  int rc = madvise(map, size, kMadvCold);
  int err = errno;
  munmap(map, size);
  return rc == 0 ? value("0") : denied(err);
}

// sync() or syncfs() on a file's descriptor: what they wrote back is read from outside
// (kpageflags' dirty bit of the file's pages).
std::string probe_sync(Args args) {
  const std::string how = args[0];
  int fd = open(args[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return "setup: open " + errno_name(errno);
  }
  int rc = 0;
  if (how == "sync") {
    sync();
  } else if (how == "syncfs") {
    rc = syncfs(fd);
  } else {
    close(fd);
    return "setup: sync or syncfs, not " + how;
  }
  int err = errno;
  close(fd);
  return rc == 0 ? value("0") : denied(err);
}

// TCP sockets of this network namespace that are orphans (closed, no descriptor, not yet
// gone): /proc/net/tcp lines with no inode in FIN_WAIT1, FIN_WAIT2, CLOSING or LAST_ACK,
// time-wait entries (timer 3, which show their FIN_WAIT2 substate) left out.
long tcp_orphans() {
  FILE* f = fopen("/proc/net/tcp", "re");
  if (f == nullptr) {
    return -1;
  }
  char line[512];
  long n = 0;
  while (fgets(line, sizeof line, f) != nullptr) {
    unsigned state = 0, timer = 0;
    unsigned long inode = 1;
    if (sscanf(line, " %*u: %*s %*s %x %*s %x:%*s %*s %*s %*s %lu", &state, &timer, &inode) == 3 &&
        inode == 0 && timer != 3 && (state == 4 || state == 5 || state == 9 || state == 0xB)) {
      ++n;
    }
  }
  fclose(f);
  return n;
}

// Makes `n` TCP orphans on loopback, then waits up to `secs` seconds for them to go:
// "<orphans left>". `zero-window`: each closed with data queued behind its peer's zero window
// (a listener that never accepts, with a 1-byte receive buffer). `linger2`: each with
// TCP_LINGER2 120 s, its peer accepted and kept open, so the close ends in FIN_WAIT2.
std::string probe_tcp_orphans(Args args) {
  const bool linger2 = std::string_view(args[0]) == "linger2";
  if (!linger2 && std::string_view(args[0]) != "zero-window") {
    usage_error(std::string("tcp-orphans takes zero-window or linger2, not `") + args[0] + "`");
  }
  const long n = parse_long(args[1], "count");
  const long secs = parse_long(args[2], "seconds");
  std::vector<int> keep;
  int listener = -1;
  sockaddr_in addr{};
  static char data[65536];
  for (long k = 0; k < n; ++k) {
    if (k % 2000 == 0) {  // a listener's backlog is at most somaxconn (4096)
      listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      int one = 1;
      if (!linger2) {
        setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &one, sizeof one);
      }
      addr = {};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof addr;
      if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
          listen(listener, 4096) != 0 ||
          getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        return "setup: listener " + errno_name(errno);
      }
      keep.push_back(listener);
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return "setup: connect " + errno_name(errno);
    }
    if (linger2) {
      int secs120 = 120;
      setsockopt(s, IPPROTO_TCP, TCP_LINGER2, &secs120, sizeof secs120);
      int peer = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (peer < 0) {
        return "setup: accept " + errno_name(errno);
      }
      keep.push_back(peer);
    } else {
      int one = 1;
      setsockopt(s, SOL_SOCKET, SO_SNDBUF, &one, sizeof one);
      fcntl(s, F_SETFL, O_NONBLOCK);
      while (write(s, data, sizeof data) > 0) {
      }
    }
    close(s);
  }
  long left = tcp_orphans();
  for (long waited = 0; left > 0 && waited < secs * 4; ++waited) {
    usleep(250000);
    left = tcp_orphans();
  }
  for (int fd : keep) {
    close(fd);
  }
  return value(std::to_string(left));
}

// clone3 passes its flags in memory, where seccomp cannot look, so the filter must answer
// ENOSYS for all of clone3 (glibc then falls back to clone, whose flags it can check).
std::string probe_clone3(Args) {
  struct CloneArgs {  // struct clone_args, CLONE_ARGS_SIZE_VER0
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
  };
  return in_child([] {
    CloneArgs ca{};
    ca.exit_signal = SIGCHLD;
    long rc = syscall(SYS_clone3, &ca, sizeof(ca));
    if (rc == 0) {
      syscall(SYS_exit_group, 0);
    }
    if (rc < 0) {
      return denied(errno);
    }
    waitpid(static_cast<pid_t>(rc), nullptr, 0);
    return allowed();
  });
}

std::string probe_mount_tmpfs(Args) {
  return in_child([] {
    try_private_mount_ns();
    long rc = mount("none", "/tmp", "tmpfs", 0, nullptr);
    int err = errno;
    if (rc == 0) {
      umount2("/tmp", MNT_DETACH);
      return allowed();
    }
    return denied(err);
  });
}

// Mounting a cgroup v1 hierarchy gives write access to release_agent, which the kernel runs
// as root on the host when the cgroup empties (CVE-2022-0492). Default controller: memory
// (a hierarchy that exists on hybrid hosts, so the mount would attach to the host's tree).
std::string probe_mount_cgroup_v1(Args args) {
  std::string controller = args.empty() ? "memory" : args[0];
  char dir[] = "/tmp/probe-cgroup-XXXXXX";
  // An existing directory is all mount needs; fall back to /tmp itself when it is read-only.
  const char* target = mkdtemp(dir) != nullptr ? dir : "/tmp";
  std::string out = in_child([&] {
    try_private_mount_ns();
    long rc = mount("cgroup", target, "cgroup", 0, controller.c_str());
    int err = errno;
    if (rc == 0) {
      umount2(target, MNT_DETACH);
      return allowed();
    }
    return denied(err);
  });
  if (target == dir) {
    rmdir(dir);
  }
  return out;
}

// The new mount API is a second door to every filesystem type; fsopen alone creates a
// superblock context (and reaches filesystem option parsers, CVE-2022-0185).
std::string probe_fsopen(Args) {
  return in_child([] {
    long fd = syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
    return outcome_of(fd);
  });
}

// A detached clone of a mount tree, movable anywhere: the mount API's bind mount.
std::string probe_open_tree(Args) {
  return in_child([] {
    long fd = syscall(SYS_open_tree, AT_FDCWD, "/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    return outcome_of(fd);
  });
}

// chroot escapes (chroot + chdir("..")) and confusion of setuid helpers.
std::string probe_chroot(Args) {
  return in_child([] { return outcome_of(chroot("/")); });
}

// Joining a namespace by fd, e.g. /proc/1/ns/mnt of the host if it were reachable.
std::string probe_setns(Args args) {
  std::string path = args[0];
  return in_child([path] {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return denied(errno);
    }
    return outcome_of(setns(fd, 0));
  });
}

// Device nodes: a char device for /dev/mem or a disk would bypass every file permission.
std::string probe_mknod_dev(Args args) {
  std::string path = args[0];
  return in_child([path] {
    long rc = mknod(path.c_str(), S_IFCHR | 0666, makedev(1, 3));
    int err = errno;
    if (rc == 0) {
      unlink(path.c_str());
      return allowed();
    }
    return denied(err);
  });
}

// ---------------------------------------------------------------------------------------------
// The sandbox's PID 1 (walls: init is non-dumpable, no CAP_SYS_PTRACE, ptrace filtered, no
// shared address space with the engine)
// ---------------------------------------------------------------------------------------------

// Tracing the init would let the command run code as the init. PTRACE_SEIZE makes the same
// ptrace_may_access(PTRACE_MODE_ATTACH) check as PTRACE_ATTACH without sending SIGSTOP:
// a control run outside a sandbox must not leave the host's PID 1 stopped when we exit.
// Sets a limit or the scheduling of `target`: "1" (the sandbox's init, or its process group),
// "1-high" (the same with bit 32 set in the pid and the `which` argument, which the kernel
// drops: an int), or "self" (0: the probe itself, its own group). Every value is what init
// already has (RLIMIT_CORE 0, nice 0, SCHED_OTHER, every CPU, no I/O class), so a call the
// filter lets through changes nothing. "user" calls name the probe's uid, init's too (any
// target).
std::string probe_init_sched(Args args) {
  const std::string call(args[0]), target(args[1]);
  if (target != "1" && target != "1-high" && target != "self") {
    usage_error("bad target `" + target + "`: 1, 1-high or self");
  }
  const uint64_t high = target == "1-high" ? (uint64_t{1} << 32) : 0;
  const uint64_t pid = (target == "self" ? 0 : 1) | high;
  constexpr uint64_t kIoprioWhoProcess = IOPRIO_WHO_PROCESS, kIoprioWhoPgrp = IOPRIO_WHO_PGRP,
                     kIoprioWhoUser = IOPRIO_WHO_USER;
  long rc = 0;
  if (call == "prlimit") {
    struct rlimit core = {0, 0};
    rc = syscall(SYS_prlimit64, pid, RLIMIT_CORE, &core, nullptr);
  } else if (call == "prlimit-read") {
    struct rlimit old {};
    rc = syscall(SYS_prlimit64, pid, RLIMIT_CORE, nullptr, &old);
  } else if (call == "setpriority") {
    rc = syscall(SYS_setpriority, uint64_t{PRIO_PROCESS} | high, pid, 0);
  } else if (call == "setpriority-pgrp") {
    rc = syscall(SYS_setpriority, uint64_t{PRIO_PGRP} | high, pid, 0);
  } else if (call == "setpriority-user") {
    rc = syscall(SYS_setpriority, uint64_t{PRIO_USER} | high, 0, 0);
  } else if (call == "sched-setscheduler") {
    struct sched_param p {};
    rc = syscall(SYS_sched_setscheduler, pid, SCHED_OTHER, &p);
  } else if (call == "sched-setparam") {
    struct sched_param p {};
    rc = syscall(SYS_sched_setparam, pid, &p);
  } else if (call == "sched-setattr") {
    uint32_t attr[14] = {};  // struct sched_attr, SCHED_ATTR_SIZE_VER1: SCHED_OTHER, nice 0
    attr[0] = sizeof attr;
    rc = syscall(SYS_sched_setattr, pid, attr, 0);
  } else if (call == "sched-setaffinity") {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      CPU_SET(cpu, &all);
    }
    rc = syscall(SYS_sched_setaffinity, pid, sizeof all, &all);
  } else if (call == "ioprio") {
    rc = syscall(SYS_ioprio_set, uint64_t{kIoprioWhoProcess} | high, pid, 0);
  } else if (call == "ioprio-pgrp") {
    rc = syscall(SYS_ioprio_set, uint64_t{kIoprioWhoPgrp} | high, pid, 0);
  } else if (call == "ioprio-user") {
    // The probe's uid by number: 0 is "the caller's" to setpriority but a uid to ioprio_set,
    // unmapped in the sandbox's user namespace (ESRCH).
    rc = syscall(SYS_ioprio_set, uint64_t{kIoprioWhoUser} | high, getuid(), 0);
  } else {
    usage_error("bad call `" + call + "`");
  }
  return outcome_of(rc);
}

std::string probe_ptrace_init(Args) {
  return in_child([] { return outcome_of(ptrace(PTRACE_SEIZE, 1, nullptr, nullptr)); });
}

// Write access to the init's memory is code execution as the init.
std::string probe_proc1_mem(Args) {
  return in_child([] {
    int fd = open("/proc/1/mem", O_RDWR | O_CLOEXEC);
    return outcome_of(fd);
  });
}

// The init's environment may carry the engine's secrets.
std::string probe_proc1_environ(Args) {
  return in_child([] {
    ReadResult r = read_file("/proc/1/environ");
    if (r.err != 0) {
      return denied(r.err);
    }
    return allowed(std::to_string(r.text.size()) + " bytes");
  });
}

// The init's fds: the status pipe to the engine, and anything else that leaked into it.
std::string probe_proc1_fd(Args) {
  return in_child([] {
    DIR* d = opendir("/proc/1/fd");
    if (d == nullptr) {
      return denied(errno);
    }
    int count = 0;
    errno = 0;
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        ++count;
      }
      errno = 0;
    }
    int err = errno;
    closedir(d);
    return err != 0 ? denied(err) : allowed(std::to_string(count) + " entries");
  });
}

// CVE-2019-5736 (runc): opening the init's executable through /proc/1/exe for writing and
// overwriting the runtime binary on the host. Nothing is written even if the open succeeds.
std::string probe_proc1_exe_write(Args) {
  return in_child([] {
    int fd = open("/proc/1/exe", O_WRONLY | O_CLOEXEC);
    return outcome_of(fd);
  });
}

// Reading another process's memory without ptrace; same permission check as ptrace-read.
std::string probe_process_vm_readv(Args) {
  return in_child([] {
    // A mapped address of PID 1 if its maps are readable, else any address: the permission
    // check comes before the copy, so a refusal is still reported as such.
    char here[8] = {};
    uintptr_t addr = reinterpret_cast<uintptr_t>(here);
    ReadResult maps = read_file("/proc/1/maps", 4096);
    if (maps.err == 0 && !maps.text.empty()) {
      addr = std::strtoull(maps.text.c_str(), nullptr, 16);
    }
    char buf[8];
    iovec local{buf, sizeof(buf)};
    iovec remote{reinterpret_cast<void*>(addr), sizeof(buf)};
    long n = process_vm_readv(1, &local, 1, &remote, 1, 0);
    if (n < 0) {
      return denied(errno);
    }
    return allowed(std::to_string(n) + " bytes");
  });
}

// ---------------------------------------------------------------------------------------------
// Kernel attack surface (wall: the seccomp allowlist, EPERM for the dangerous families)
// ---------------------------------------------------------------------------------------------

// Keyrings are not namespaced: a sandbox could read or plant keys of the same uid elsewhere.
std::string probe_keyctl(Args) {
  return in_child([] { return outcome_of(syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "x")); });
}

std::string probe_add_key(Args) {
  return in_child([] {
    return outcome_of(syscall(SYS_add_key, "user", "probe", "x", 1, KEY_SPEC_PROCESS_KEYRING));
  });
}

// userfaultfd stalls kernel copies at will: the race-widening tool of many kernel exploits.
// `user-mode-only` asks for UFFD_USER_MODE_ONLY, which the kernel grants any user even with
// vm.unprivileged_userfaultfd=0 (5.11+): the variant a control run can see succeed.
std::string probe_userfaultfd(Args args) {
  int flags = O_CLOEXEC;
  if (!args.empty()) {
    if (std::string_view(args[0]) != "user-mode-only") {
      usage_error(std::string("bad userfaultfd mode `") + args[0] + "`");
    }
    flags |= 1;  // UFFD_USER_MODE_ONLY (linux/userfaultfd.h of 5.11+; our headers are 6.1)
  }
  return in_child([flags] { return outcome_of(syscall(SYS_userfaultfd, flags)); });
}

// io_uring performs syscalls-by-proxy that seccomp never sees, and has had many LPEs.
std::string probe_io_uring(Args) {
  return in_child([] {
    io_uring_params params{};
    return outcome_of(syscall(SYS_io_uring_setup, 4, &params));
  });
}

std::string probe_perf_event_open(Args) {
  return in_child([] {
    perf_event_attr attr{};
    attr.type = PERF_TYPE_SOFTWARE;
    attr.size = sizeof(attr);
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.disabled = 1;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    return outcome_of(syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC));
  });
}

// The BPF verifier is a large, often-broken attack surface; a socket filter is the program
// type unprivileged users could load. With a command number instead, that command is sent
// with a zeroed attribute: an unknown number reaches the kernel's dispatch (EINVAL) even
// where kernel.unprivileged_bpf_disabled refuses every real command, so a control can tell
// a filter's refusal of the whole syscall from the kernel's own.
std::string probe_bpf(Args args) {
  if (!args.empty()) {
    long cmd = parse_long(args[0], "bpf command");
    return in_child([cmd] {
      bpf_attr attr{};
      return outcome_of(syscall(SYS_bpf, cmd, &attr, sizeof(attr)));
    });
  }
  return in_child([] {
    bpf_insn insns[2] = {};
    insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = 0
    insns[0].dst_reg = BPF_REG_0;
    insns[1].code = BPF_JMP | BPF_EXIT;
    static char license[] = "GPL";
    bpf_attr attr{};
    attr.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;
    attr.insn_cnt = 2;
    attr.insns = reinterpret_cast<uintptr_t>(insns);
    attr.license = reinterpret_cast<uintptr_t>(license);
    return outcome_of(syscall(SYS_bpf, BPF_PROG_LOAD, &attr, sizeof(attr)));
  });
}

// Socket families by allowlist: vsock reaches the hypervisor, a network namespace does not
// isolate it.
std::string probe_vsock(Args) {
  return in_child([] { return outcome_of(socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0)); });
}

// Raw link-layer sockets: sniffing and spoofing, and the packet_set_ring LPEs.
std::string probe_packet(Args) {
  return in_child(
      [] { return outcome_of(socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL))); });
}

// Any family, type and protocol by name or number, for the allowlists' allowed side (and
// other families and protocols). `pair` asks socketpair(), which makes a socket of the
// protocol before it asks the protocol for a pair (inet has none: EOPNOTSUPP).
std::string probe_socket_or_pair(Args args, bool pair) {
  struct Named {
    std::string_view name;
    int value;
  };
  static constexpr Named kFamilies[] = {{"unix", AF_UNIX},     {"inet", AF_INET},
                                        {"inet6", AF_INET6},   {"netlink", AF_NETLINK},
                                        {"packet", AF_PACKET}, {"vsock", AF_VSOCK}};
  static constexpr Named kTypes[] = {{"stream", SOCK_STREAM},
                                     {"dgram", SOCK_DGRAM},
                                     {"raw", SOCK_RAW},
                                     {"seqpacket", SOCK_SEQPACKET}};
  static constexpr Named kProtocols[] = {{"tcp", IPPROTO_TCP},     {"udp", IPPROTO_UDP},
                                         {"icmp", IPPROTO_ICMP},   {"icmpv6", IPPROTO_ICMPV6},
                                         {"mptcp", IPPROTO_MPTCP}, {"udplite", IPPROTO_UDPLITE},
                                         {"sctp", IPPROTO_SCTP}};
  auto lookup = [](std::span<const Named> table, const char* text, const char* what) {
    for (const auto& e : table) {
      if (e.name == text) {
        return e.value;
      }
    }
    return static_cast<int>(parse_long(text, what));
  };
  int family = lookup(kFamilies, args[0], "socket family");
  int type = args.size() > 1 ? lookup(kTypes, args[1], "socket type") : SOCK_STREAM;
  int protocol = args.size() > 2 ? lookup(kProtocols, args[2], "socket protocol") : 0;
  return in_child([family, type, protocol, pair] {
    int fds[2] = {-1, -1};
    int rc = pair ? socketpair(family, type | SOCK_CLOEXEC, protocol, fds)
                  : (fds[0] = socket(family, type | SOCK_CLOEXEC, protocol));
    if (rc < 0) {
      return denied(errno);
    }
    for (int fd : fds) {
      if (fd >= 0) {
        close(fd);
      }
    }
    return allowed();
  });
}
std::string probe_socket(Args args) { return probe_socket_or_pair(args, false); }
std::string probe_socketpair(Args args) { return probe_socket_or_pair(args, true); }

// Raw IP sockets need CAP_NET_RAW (which `setcap` tries to plant on a file).
std::string probe_raw_socket(Args) {
  return in_child(
      [] { return outcome_of(socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP)); });
}

// Module loading: the cap check comes before the fd is looked at, so EBADF means allowed.
std::string probe_finit_module(Args) {
  return in_child([] { return outcome_of(syscall(SYS_finit_module, -1, "", 0)); });
}

// Replacing the running kernel. Bad fds again: EBADF means the call was allowed through.
std::string probe_kexec_file_load(Args) {
  return in_child([] { return outcome_of(syscall(SYS_kexec_file_load, -1, -1, 1, "", 0)); });
}

// Any syscall number with zero arguments: the allowlist must answer ENOSYS for syscalls it
// does not know (libseccomp 2.5.4 knows nothing after ~456).
std::string probe_raw_syscall(Args args) {
  long nr = parse_long(args[0], "syscall number");
  return in_child([nr] { return outcome_of(syscall(nr, 0, 0, 0, 0, 0, 0)); });
}

// x32 syscalls are x86-64 syscalls with bit 30 set; a filter checking only the arch token
// (AUDIT_ARCH_X86_64 for both) and not the bit sees a different syscall than runs.
std::string probe_x32(Args) {
  return in_child([] {
    long rc;
    asm volatile("syscall" : "=a"(rc) : "a"(39L | 0x40000000L) : "rcx", "r11", "memory");
    return rc < 0 ? denied(static_cast<int>(-rc)) : allowed(std::to_string(rc));
  });
}

// i386 syscalls through int $0x80 have other numbers under AUDIT_ARCH_I386; the filter must
// kill other architectures. Without IA32 emulation the kernel answers SIGSEGV.
std::string probe_int80(Args) {
  return in_child([] {
    long rc;
    asm volatile("int $0x80" : "=a"(rc) : "a"(20L) : "r8", "r9", "r10", "r11", "memory");
    int value32 = static_cast<int>(rc);
    return value32 < 0 ? denied(-value32) : allowed(std::to_string(value32));
  });
}

// ---------------------------------------------------------------------------------------------
// Credentials as seen from inside (walls: empty capability sets, locked securebits,
// no_new_privs, setgroups(0), seccomp mode 2, closed fds)
// ---------------------------------------------------------------------------------------------

std::string status_value(std::initializer_list<std::string_view> keys) {
  int err = 0;
  std::string v = status_fields(keys, &err);
  return err != 0 ? denied(err) : value(v);
}

std::string probe_caps(Args) {
  return status_value({"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"});
}

std::string probe_nonewprivs(Args) {
  int err = 0;
  std::string v = status_fields({"NoNewPrivs"}, &err);
  if (err != 0) {
    return denied(err);
  }
  return value(v.substr(v.find('=') == std::string::npos ? v.size() : v.find('=') + 1));
}

std::string probe_seccomp_mode(Args) { return status_value({"Seccomp", "Seccomp_filters"}); }

std::string probe_groups(Args) {
  uid_t ru, eu, su;
  gid_t rg, eg, sg;
  getresuid(&ru, &eu, &su);
  getresgid(&rg, &eg, &sg);
  int n = getgroups(0, nullptr);
  if (n < 0) {
    return denied(errno);
  }
  std::vector<gid_t> groups(static_cast<size_t>(n));
  n = getgroups(n, groups.data());
  if (n < 0) {
    return denied(errno);
  }
  std::vector<std::string> list;
  for (int i = 0; i < n; ++i) {
    list.push_back(std::to_string(groups[static_cast<size_t>(i)]));
  }
  auto triple = [](unsigned a, unsigned b, unsigned c) {
    return std::to_string(a) + "," + std::to_string(b) + "," + std::to_string(c);
  };
  return value("uid=" + triple(ru, eu, su) + " gid=" + triple(rg, eg, sg) +
               " groups=" + join(list, ","));
}

std::string probe_securebits(Args) {
  int bits = prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
  if (bits < 0) {
    return denied(errno);
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%x", static_cast<unsigned>(bits));
  return value(buf);
}

// Every fd above 2 the command inherited: a leaked engine fd is a way out of every mount.
std::string probe_fds(Args) {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) {
    return denied(errno);
  }
  int self = dirfd(d);
  std::vector<int> fds;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && fd > 2 && fd != self) {
      fds.push_back(static_cast<int>(fd));
    }
  }
  closedir(d);
  std::sort(fds.begin(), fds.end());
  std::vector<std::string> parts;
  for (int fd : fds) {
    parts.push_back(std::to_string(fd));
  }
  return value(join(parts, " "));
}

std::string probe_rlimits(Args) {
  struct Entry {
    const char* name;
    int resource;
  };
  static constexpr Entry kLimits[] = {
      {"as", RLIMIT_AS},       {"core", RLIMIT_CORE},     {"cpu", RLIMIT_CPU},
      {"fsize", RLIMIT_FSIZE}, {"nofile", RLIMIT_NOFILE}, {"nproc", RLIMIT_NPROC},
  };
  auto num = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("inf") : std::to_string(v); };
  std::vector<std::string> parts;
  for (const auto& e : kLimits) {
    rlimit rl;
    if (getrlimit(e.resource, &rl) < 0) {
      return denied(errno);
    }
    parts.push_back(std::string(e.name) + "=" + num(rl.rlim_cur) + "/" + num(rl.rlim_max));
  }
  return value(join(parts, " "));
}

// ---------------------------------------------------------------------------------------------
// Files (walls: the mount tree, read-only binds, nosuid, the setuid/setgid mode filter,
// Landlock)
// ---------------------------------------------------------------------------------------------

// /etc/shadow, /root, host files outside the working root.
std::string probe_read_file(Args args) {
  ReadResult r = read_file(args[0], 64);
  if (r.err != 0) {
    return denied(r.err);
  }
  return value(hex(r.text));
}

// Reads from a descriptor number the probe did not open: a leaked fd is usable with read(2)
// alone, with no path lookup for the mount tree or Landlock to refuse.
std::string probe_read_fd(Args args) {
  long fd = parse_long(args[0], "fd");
  char buf[64];
  ssize_t n;
  do {
    n = read(static_cast<int>(fd), buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return denied(errno);
  }
  return value(hex(std::string_view(buf, static_cast<size_t>(n))));
}

std::string probe_stat(Args args) {
  struct stat st;
  if (stat(args[0], &st) < 0) {
    return denied(errno);
  }
  return value("mode=" + octal_mode(st.st_mode) + " uid=" + std::to_string(st.st_uid) +
               " gid=" + std::to_string(st.st_gid) + " size=" + std::to_string(st.st_size));
}

// The device and inode of the cwd the command was started in, as decimal numbers: the cwd
// race test compares them with the directory it checked on the host.
std::string probe_cwd_ident(Args) {
  struct stat st;
  if (stat(".", &st) < 0) {
    return denied(errno);
  }
  return value(std::to_string(static_cast<unsigned long long>(st.st_dev)) + " " +
               std::to_string(static_cast<unsigned long long>(st.st_ino)));
}

// Writes `x`, or the text given (a number for a sysctl, which refuses `x` with EINVAL).
std::string probe_write_file(Args args) {
  std::string_view text = args.size() > 1 ? std::string_view(args[1]) : "x";
  int fd = open(args[0], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return denied(errno);
  }
  long n = write(fd, text.data(), text.size());
  int err = errno;
  close(fd);
  return n < 0 ? denied(err) : allowed();
}

std::string probe_mkdir(Args args) { return outcome_of(mkdir(args[0], 0755)); }

// A hard link and a rename, as the kernel answers them (no copy fallback as ln or mv have).
std::string probe_link(Args args) { return outcome_of(link(args[0], args[1])); }
std::string probe_rename(Args args) { return outcome_of(rename(args[0], args[1])); }

// setxattr(2) of a string value (tests/vm marks a cgroup delegated as systemd does).
std::string probe_setxattr(Args args) {
  return outcome_of(::setxattr(args[0], args[1], args[2], std::strlen(args[2]), 0));
}

// Every way of getting a setuid/setgid bit onto a file. The sandbox's mounts are nosuid,
// but a file it leaves in the working root keeps its bits on the host, where they count.
// Each variant is its own syscall because the filter must cover every one.

std::string probe_setuid_file(Args args) {  // chmod(2)
  const char* path = args[0];
  ensure_file(path);
  return in_child([path] {
    long rc = syscall(SYS_chmod, path, 04755);
    return rc < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

std::string probe_fchmod_setuid(Args args) {  // fchmod(2) on an fd
  const char* path = args[0];
  ensure_file(path);
  return in_child([path] {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return denied(errno);
    }
    long rc = syscall(SYS_fchmod, fd, 04755);
    return rc < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

std::string probe_fchmodat_setuid(Args args) {  // fchmodat(2)
  const char* path = args[0];
  ensure_file(path);
  return in_child([path] {
    long rc = syscall(SYS_fchmodat, AT_FDCWD, path, 04755);
    return rc < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

// fchmodat2 (Linux 6.6, nr 452) postdates libseccomp 2.5.4: an allowlist that forgot it must
// still answer ENOSYS.
std::string probe_fchmodat2_setuid(Args args) {
  const char* path = args[0];
  ensure_file(path);
  return in_child([path] {
    long rc = syscall(452, AT_FDCWD, path, 04755, 0);
    return rc < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

// mkdir(2) drops S_ISGID from its mode argument itself, so the detail shows whether the bit
// arrived (it can also come from a setgid parent).
std::string probe_setgid_dir(Args args) {
  const char* path = args[0];
  return in_child([path] {
    long rc = mkdir(path, 02755);
    return rc < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

std::string probe_open_creat_setuid(Args args) {  // openat(2) with O_CREAT
  const char* path = args[0];
  return in_child([path] {
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 06755);
    return fd < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

std::string probe_creat_setuid(Args args) {  // creat(2)
  const char* path = args[0];
  return in_child([path] {
    long fd = syscall(SYS_creat, path, 06755);
    return fd < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

// openat2 passes its mode inside struct open_how, where seccomp cannot look.
std::string probe_openat2_setuid(Args args) {
  const char* path = args[0];
  return in_child([path] {
    open_how how{};
    how.flags = O_CREAT | O_WRONLY | O_CLOEXEC;
    how.mode = 06755;
    long fd = syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));
    return fd < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

// mknod(2) of a regular file needs no privilege and takes a full mode.
std::string probe_mknod_setuid(Args args) {
  const char* path = args[0];
  return in_child([path] {
    long rc = mknod(path, S_IFREG | 04755, 0);
    return rc < 0 ? denied(errno) : allowed(mode_detail(path));
  });
}

// An unnamed O_TMPFILE created with the setuid bit, then given a name: the mode filter must
// see the open, and the link through /proc/self/fd must not launder it.
std::string probe_tmpfile_setuid(Args args) {
  std::string dir = args[0];
  std::string name = dir + "/" + args[1];
  return in_child([dir, name] {
    int fd = open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 04755);
    if (fd < 0) {
      return denied(errno);
    }
    std::string fd_path = "/proc/self/fd/" + std::to_string(fd);
    long rc = linkat(AT_FDCWD, fd_path.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW);
    std::string link = rc < 0 ? errno_name(errno) : "ok";
    struct stat st;
    std::string mode = fstat(fd, &st) < 0 ? errno_name(errno) : octal_mode(st.st_mode);
    return allowed("linkat=" + link + " mode=" + mode);
  });
}

// File capabilities are setuid by another name: a v2 security.capability granting
// CAP_NET_RAW (effective) to whoever executes the file.
std::string probe_setcap(Args args) {
  const char* path = args[0];
  ensure_file(path);
  return in_child([path] {
    vfs_cap_data cap{};
    cap.magic_etc = htole32(VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE);
    cap.data[0].permitted = htole32(1U << CAP_NET_RAW);
    long rc = setxattr(path, "security.capability", &cap, XATTR_CAPS_SZ_2, 0);
    return outcome_of(rc);
  });
}

// ---------------------------------------------------------------------------------------------
// Network and signals (walls: the network namespace, the pid namespace, kill scope)
// ---------------------------------------------------------------------------------------------

// A numeric address only: the probe is static and has no resolver. Bounded to 5 s so a
// blackholed address cannot hang a test.
std::string probe_tcp_connect(Args args) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  long port = parse_long(args[1], "port");
  if (port < 0 || port > 65535) {
    usage_error("bad port");
  }
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, args[0], &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, args[0], &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    usage_error(std::string("not a numeric address `") + args[0] + "`");
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return denied(errno);
  }
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0) {
    out = allowed();
  } else if (errno != EINPROGRESS) {
    out = denied(errno);
  } else {
    pollfd p{fd, POLLOUT, 0};
    int n = poll(&p, 1, 5000);
    int err = 0;
    socklen_t elen = sizeof(err);
    if (n < 0) {
      out = denied(errno);
    } else if (n == 0) {
      out = denied(ETIMEDOUT);
    } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0) {
      out = denied(errno);
    } else {
      out = err != 0 ? denied(err) : allowed();
    }
  }
  close(fd);
  return out;
}

// Abstract unix sockets are scoped by network namespace, not by the filesystem: reaching the
// host's (X11, dbus, containerd-shim) is an escape.
std::string probe_abstract_connect(Args args) {
  std::string_view name = args[0];
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(sun.sun_path)) {
    usage_error("abstract name too long");
  }
  std::memcpy(sun.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return denied(errno);
  }
  long rc = connect(fd, reinterpret_cast<sockaddr*>(&sun), len);
  std::string out = outcome_of(rc);
  close(fd);
  return out;
}

std::string probe_kill(Args args) {
  auto pid = static_cast<pid_t>(parse_long(args[0], "pid"));
  int sig = args.size() > 1 ? parse_signal(args[1]) : SIGTERM;
  return outcome_of(kill(pid, sig));
}

// Whether kill(-1) can only reach a sandbox: we must be a direct child of our pid namespace's
// init (how the sandbox's init runs the command), and that namespace must not be the initial
// one, where pid 2 is kthreadd with parent 0 (in any other pid namespace only pid 1 has
// parent 0). NSpid cannot tell: a fresh /proc, as the sandbox mounts, shows one level only.
bool kill_all_is_contained() {
  if (getppid() != 1) {
    return false;
  }
  ReadResult stat2 = read_file("/proc/2/stat");
  size_t paren = stat2.text.rfind(')');
  if (stat2.err == 0 && paren != std::string::npos) {
    auto fields = words(std::string_view(stat2.text).substr(paren + 1));  // state, ppid, ...
    if (fields.size() > 1 && fields[1] == "0") {
      return false;
    }
  }
  return true;
}

// Everything the pid namespace lets us signal. Refused unless contained (above): the tests'
// control runs are root outside any sandbox, where kill(-1, SIGKILL) ends the machine.
std::string probe_kill_all(Args) {
  if (!kill_all_is_contained()) {
    usage_error("kill-all runs only as a direct child of a non-initial pid namespace's init");
  }
  return outcome_of(kill(-1, SIGKILL));
}

std::string probe_getpid(Args) { return value(std::to_string(getpid())); }

// ---------------------------------------------------------------------------------------------
// Resource walls (per-sandbox /proc/sys/user quotas, pids.max, memory.max, rlimits)
// ---------------------------------------------------------------------------------------------

// Makes POSIX timers (SIGEV_NONE) until the kernel refuses or `max` exist: "value N ERRNO" or
// "value N max". Each holds a queued signal, counted against RLIMIT_SIGPENDING; all of the
// host's timers share one hash.
std::string probe_posix_timers(Args args) {
  const long max = std::stol(args[0]);
  struct sigevent sev {};
  sev.sigev_notify = SIGEV_NONE;
  long made = 0;
  for (; made < max; ++made) {
    int id = 0;
    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &sev, &id) != 0) {
      return value(std::to_string(made) + " " + errno_name(errno));
    }
  }
  return value(std::to_string(made) + " max");
}

// inotify instances are a per-user kernel quota: one sandbox must not use up its uid's share.
// With `hold`, the instances stay open after the line until stdin reaches EOF, so a test can
// check a second sandbox and the host while this one holds its whole quota.
std::string probe_inotify_exhaust(Args args) {
  bool hold = !args.empty();
  if (hold && std::string_view(args[0]) != "hold") {
    usage_error(std::string("inotify-exhaust takes only `hold`, not `") + args[0] + "`");
  }
  // Lift the soft fd limit to the hard one so the inotify quota, not RLIMIT_NOFILE, is what
  // stops us (both answer EMFILE).
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  constexpr int kCap = 100000;
  int count = 0;
  int err = 0;
  while (count < kCap) {
    if (inotify_init1(IN_CLOEXEC) < 0) {
      err = errno;
      break;
    }
    ++count;
  }
  std::string out = value(std::to_string(count) + " " + (err != 0 ? errno_name(err) : "capped"));
  if (!hold) {
    return out;
  }
  emit(out);
  char buf[256];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR)) {
      _exit(0);
    }
  }
}

std::string probe_inotify_one(Args) { return outcome_of(inotify_init1(IN_CLOEXEC)); }

std::string probe_fork_bomb(Args) {
  constexpr size_t kCap = 100000;
  std::vector<pid_t> children;
  children.reserve(kCap);
  const pid_t parent = getpid();
  int err = 0;
  while (children.size() < kCap) {
    pid_t pid = fork();
    if (pid < 0) {
      err = errno;
      break;
    }
    if (pid == 0) {
      // Should the probe die before it reaps us, do not outlive it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) {
        _exit(0);
      }
      for (;;) {
        pause();
      }
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    kill(pid, SIGKILL);
  }
  for (pid_t pid : children) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  return value(std::to_string(children.size()) + " " + (err != 0 ? errno_name(err) : "capped"));
}

// Spins for <ms> of wall-clock time and reports the CPU time it got meanwhile, both in
// microseconds: a CPU limit shows as CPU time well below the wall-clock time.
std::string probe_cpu_burn(Args args) {
  long ms = parse_long(args[0], "ms");
  auto usec = [](clockid_t clock) {
    struct timespec ts {};
    clock_gettime(clock, &ts);
    return static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  };
  long long start = usec(CLOCK_MONOTONIC);
  long long cpu_start = usec(CLOCK_PROCESS_CPUTIME_ID);
  long long now = start;
  while (now - start < ms * 1000LL) {
    for (volatile int i = 0; i < 10000; ++i) {
    }
    now = usec(CLOCK_MONOTONIC);
  }
  long long cpu = usec(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
  return value("cpu_us=" + std::to_string(cpu) + " wall_us=" + std::to_string(now - start));
}

std::string probe_memory_hog(Args args) {
  long mib = parse_long(args[0], "MiB");
  if (mib < 0) {
    usage_error("bad MiB");
  }
  constexpr size_t kMiB = 1 << 20;
  for (long i = 0; i < mib; ++i) {
    void* p = mmap(nullptr, kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return denied(errno);
    }
    std::memset(p, 0xa5, kMiB);  // touch every page so it is charged
  }
  return allowed(std::to_string(mib) + " MiB");
}

// Opens <conns> loopback TCP connections in the sandbox's own network namespace and sends on
// each, never reading, until the kernel takes no more: the bytes queued in socket buffers
// (kernel memory the job's memory limit must bound). Stops early when a socket cannot be
// made (out of memory, descriptors).
std::string probe_tcp_fill(Args args) {
  long conns = parse_long(args[0], "conns");
  if (conns <= 0) {
    usage_error("bad conns");
  }
  int srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (srv < 0 || bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 ||
      listen(srv, 1024) < 0 || getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    return denied(errno);
  }
  static char chunk[65536];
  std::memset(chunk, 'x', sizeof chunk);
  unsigned long long queued = 0;
  long made = 0;
  for (; made < conns; ++made) {
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0 || connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
      break;
    }
    if (accept4(srv, nullptr, nullptr, SOCK_CLOEXEC) < 0 ||
        fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) < 0) {
      break;
    }
    for (;;) {
      ssize_t n = send(c, chunk, sizeof chunk, MSG_NOSIGNAL);
      if (n <= 0) {
        break;  // EAGAIN: the buffers are full (or the memory limit is reached)
      }
      queued += static_cast<unsigned long long>(n);
    }
  }
  return value("queued " + std::to_string(queued) + " conns " + std::to_string(made));
}

// Makes <conns> loopback connections to listeners it never accepts from (4096 per listener,
// each on a port of its own; IPv6 `::1` with a third argument `6`), closing each client end at
// once, then sleeps <ms>: the server ends stay queued, charged to no memory cgroup. Prints how
// many it made.
std::string probe_tcp_unaccepted(Args args) {
  long conns = parse_long(args[0], "conns");
  long hold_ms = parse_long(args[1], "ms");
  const bool v6 = args.size() > 2 && std::string_view(args[2]) == "6";
  if (conns <= 0 || hold_ms < 0) {
    usage_error("bad conns or ms");
  }
  constexpr long kPerListener = 4096;
  long made = 0;
  while (made < conns) {
    sockaddr_storage ss{};
    socklen_t len;
    if (v6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof *a;
    }
    const int family = v6 ? AF_INET6 : AF_INET;
    int srv = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (srv < 0 || bind(srv, reinterpret_cast<sockaddr*>(&ss), len) < 0 ||
        listen(srv, kPerListener) < 0 ||
        getsockname(srv, reinterpret_cast<sockaddr*>(&ss), &len) < 0) {
      return denied(errno);
    }
    for (long i = 0; i < kPerListener && made < conns; ++i, ++made) {
      int c = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (c < 0 || connect(c, reinterpret_cast<sockaddr*>(&ss), len) < 0) {
        return value("made " + std::to_string(made) + " then errno " + errno_name(errno));
      }
      close(c);
    }
  }
  std::printf("probe tcp-unaccepted: made %ld\n", made);
  std::fflush(stdout);
  usleep(static_cast<useconds_t>(hold_ms) * 1000);
  return value("held " + std::to_string(made));
}

// ---------------------------------------------------------------------------------------------
// What the sandbox looks like from inside (walls: uts, net, user, mount namespaces)
// ---------------------------------------------------------------------------------------------

std::string probe_hostname(Args) {
  utsname u;
  if (uname(&u) < 0) {
    return denied(errno);
  }
  return value(u.nodename);
}

// Sets the hostname, then reads it back: `allowed <name>` is the name the probe's uts
// namespace has afterwards.
std::string probe_sethostname(Args args) {
  if (sethostname(args[0], std::strlen(args[0])) < 0) {
    return denied(errno);
  }
  return allowed(probe_hostname({}).substr(std::strlen("value ")));
}

// SysV IPC objects belong to an ipc namespace, not to the filesystem: the host's segment or
// queue of `key` is reachable only from the host's namespace. `allowed` when the lookup finds
// it (a mode 0666 object needs no capability).
std::string probe_sysv_shm(Args args) {
  auto key = static_cast<key_t>(parse_long(args[0], "key"));
  return outcome_of(shmget(key, 0, 0));
}

std::string probe_sysv_msg(Args args) {
  auto key = static_cast<key_t>(parse_long(args[0], "key"));
  return outcome_of(msgget(key, 0));
}

std::string probe_netdevs(Args) {
  ReadResult r = read_file("/proc/net/dev");
  if (r.err != 0) {
    return denied(r.err);
  }
  std::vector<std::string> names;
  auto lines = split(r.text, '\n');
  for (size_t i = 2; i < lines.size(); ++i) {  // two header lines
    size_t colon = lines[i].find(':');
    if (colon != std::string_view::npos) {
      auto w = words(lines[i].substr(0, colon));
      if (!w.empty()) {
        names.emplace_back(w[0]);
      }
    }
  }
  return value(join(names, " "));
}

// Each map line with its whitespace collapsed; lines joined by ", ".
std::string id_map(const char* path) {
  ReadResult r = read_file(path);
  if (r.err != 0) {
    return denied(r.err);
  }
  std::vector<std::string> lines;
  for (std::string_view line : split(r.text, '\n')) {
    std::vector<std::string> w;
    for (auto word : words(line)) {
      w.emplace_back(word);
    }
    if (!w.empty()) {
      lines.push_back(join(w, " "));
    }
  }
  return value(join(lines, ", "));
}

std::string probe_uid_map(Args) { return id_map("/proc/self/uid_map"); }
std::string probe_gid_map(Args) { return id_map("/proc/self/gid_map"); }

// The /proc/self/cgroup lines, joined by spaces: with a cgroup namespace they read `/`.
std::string probe_cgroup(Args) {
  ReadResult r = read_file("/proc/self/cgroup");
  if (r.err != 0) {
    return denied(r.err);
  }
  std::vector<std::string> lines;
  for (std::string_view line : split(r.text, '\n')) {
    if (!line.empty()) {
      lines.emplace_back(line);
    }
  }
  return value(join(lines, " "));
}

// Mount points (field 5 of mountinfo, octal escapes kept), in mount order.
std::string probe_mounts(Args) {
  ReadResult r = read_file("/proc/self/mountinfo");
  if (r.err != 0) {
    return denied(r.err);
  }
  std::vector<std::string> points;
  for (std::string_view line : split(r.text, '\n')) {
    auto w = words(line);
    if (w.size() > 4) {
      points.emplace_back(w[4]);
    }
  }
  return value(join(points, " "));
}

// ---------------------------------------------------------------------------------------------
// Process lifetime (used by the timeout and exit-status tests; these do not return)
// ---------------------------------------------------------------------------------------------

[[noreturn]] void sleep_forever() {
  for (;;) {
    pause();
  }
}

std::string probe_sleep_forever(Args) {
  emit(value(std::to_string(getpid())));
  sleep_forever();
}

// A tree that ignores SIGTERM: only the SIGKILL escalation (or the cgroup kill) ends it. The
// child has no PDEATHSIG on purpose; the sandbox must find it on its own.
std::string probe_ignore_term_and_fork(Args) {
  signal(SIGTERM, SIG_IGN);
  pid_t pid = fork();
  if (pid < 0) {
    cannot_attempt("fork");
  }
  if (pid == 0) {
    sleep_forever();  // inherits SIG_IGN for SIGTERM
  }
  emit(value(std::to_string(pid)));
  sleep_forever();
}

std::string probe_exit(Args args) {
  long code = parse_long(args[0], "exit code");
  emit(value(std::to_string(code)));
  _exit(static_cast<int>(code));
}

std::string probe_raise(Args args) {
  int sig = parse_signal(args[0]);
  emit(value(signal_name(sig)));
  // A test runner may have blocked or ignored it; the point is to die by it.
  signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  _exit(0);  // a signal whose default is to be ignored
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

struct Probe {
  std::string_view name;
  std::string_view arg_usage;  // shown by --help
  size_t min_args;
  size_t max_args;
  std::string (*run)(Args);
};

constexpr Probe kProbes[] = {
    {"tiocsti", "[fd]", 0, 1, probe_tiocsti},
    {"tiocsti-bit32", "", 0, 0, probe_tiocsti_bit32},
    {"tioclinux", "", 0, 0, probe_tioclinux},
    {"tiocsetd", "[ldisc]", 0, 1, probe_tiocsetd},
    {"userns", "", 0, 0, probe_userns},
    {"unshare", "<user|mnt|net|pid|ipc|uts|cgroup|time>", 1, 1, probe_unshare},
    {"clone-newuser", "", 0, 0, probe_clone_newuser},
    {"clone3", "", 0, 0, probe_clone3},
    {"ofd-lock", "<dir> [get]", 1, 2, probe_ofd_lock},
    {"posix-lock", "<dir>", 1, 1, probe_posix_lock},
    {"dnotify", "<dir>", 1, 1, probe_dnotify},
    {"socket-filter", "", 0, 0, probe_socket_filter},
    {"flowlabel", "", 0, 0, probe_flowlabel},
    {"posix-timers", "<max>", 1, 1, probe_posix_timers},
    {"fadvise-dontneed", "<file>", 1, 1, probe_fadvise_dontneed},
    {"madvise-cold", "<file>", 1, 1, probe_madvise_cold},
    {"sync", "<sync|syncfs> <file>", 2, 2, probe_sync},
    {"tcp-orphans", "<zero-window|linger2> <n> <secs>", 3, 3, probe_tcp_orphans},
    {"mount-tmpfs", "", 0, 0, probe_mount_tmpfs},
    {"mount-cgroup-v1", "[controller]", 0, 1, probe_mount_cgroup_v1},
    {"fsopen", "", 0, 0, probe_fsopen},
    {"open-tree", "", 0, 0, probe_open_tree},
    {"chroot", "", 0, 0, probe_chroot},
    {"setns", "<nsfile>", 1, 1, probe_setns},
    {"mknod-dev", "<path>", 1, 1, probe_mknod_dev},
    {"ptrace-init", "", 0, 0, probe_ptrace_init},
    {"init-sched",
     "<prlimit|prlimit-read|setpriority|setpriority-pgrp|setpriority-user|sched-setscheduler|sched-"
     "setparam|"
     "sched-setattr|sched-setaffinity|ioprio|ioprio-pgrp|ioprio-user> <1|1-high|self>",
     2, 2, probe_init_sched},
    {"proc1-mem", "", 0, 0, probe_proc1_mem},
    {"proc1-environ", "", 0, 0, probe_proc1_environ},
    {"proc1-fd", "", 0, 0, probe_proc1_fd},
    {"proc1-exe-write", "", 0, 0, probe_proc1_exe_write},
    {"process-vm-readv", "", 0, 0, probe_process_vm_readv},
    {"keyctl", "", 0, 0, probe_keyctl},
    {"add-key", "", 0, 0, probe_add_key},
    {"userfaultfd", "[user-mode-only]", 0, 1, probe_userfaultfd},
    {"io-uring", "", 0, 0, probe_io_uring},
    {"perf-event-open", "", 0, 0, probe_perf_event_open},
    {"bpf", "[cmd-number]", 0, 1, probe_bpf},
    {"vsock", "", 0, 0, probe_vsock},
    {"packet", "", 0, 0, probe_packet},
    {"socket",
     "<unix|inet|inet6|netlink|packet|vsock|nr> [stream|dgram|raw|seqpacket|nr] "
     "[tcp|udp|icmp|icmpv6|mptcp|udplite|sctp|nr]",
     1, 3, probe_socket},
    {"socketpair", "<family> [type] [protocol] (as socket)", 1, 3, probe_socketpair},
    {"raw-socket", "", 0, 0, probe_raw_socket},
    {"finit-module", "", 0, 0, probe_finit_module},
    {"kexec-file-load", "", 0, 0, probe_kexec_file_load},
    {"raw-syscall", "<nr>", 1, 1, probe_raw_syscall},
    {"x32", "", 0, 0, probe_x32},
    {"int80", "", 0, 0, probe_int80},
    {"caps", "", 0, 0, probe_caps},
    {"nonewprivs", "", 0, 0, probe_nonewprivs},
    {"groups", "", 0, 0, probe_groups},
    {"securebits", "", 0, 0, probe_securebits},
    {"seccomp-mode", "", 0, 0, probe_seccomp_mode},
    {"fds", "", 0, 0, probe_fds},
    {"rlimits", "", 0, 0, probe_rlimits},
    {"read-file", "<path>", 1, 1, probe_read_file},
    {"stat", "<path>", 1, 1, probe_stat},
    {"cwd-ident", "", 0, 0, probe_cwd_ident},
    {"read-fd", "<fd>", 1, 1, probe_read_fd},
    {"write-file", "<path> [text]", 1, 2, probe_write_file},
    {"mkdir", "<path>", 1, 1, probe_mkdir},
    {"link", "<old> <new>", 2, 2, probe_link},
    {"rename", "<old> <new>", 2, 2, probe_rename},
    {"setxattr", "<path> <name> <value>", 3, 3, probe_setxattr},
    {"setuid-file", "<path>", 1, 1, probe_setuid_file},
    {"fchmod-setuid", "<path>", 1, 1, probe_fchmod_setuid},
    {"fchmodat-setuid", "<path>", 1, 1, probe_fchmodat_setuid},
    {"fchmodat2-setuid", "<path>", 1, 1, probe_fchmodat2_setuid},
    {"setgid-dir", "<path>", 1, 1, probe_setgid_dir},
    {"open-creat-setuid", "<path>", 1, 1, probe_open_creat_setuid},
    {"creat-setuid", "<path>", 1, 1, probe_creat_setuid},
    {"openat2-setuid", "<path>", 1, 1, probe_openat2_setuid},
    {"mknod-setuid", "<path>", 1, 1, probe_mknod_setuid},
    {"tmpfile-setuid", "<dir> <name>", 2, 2, probe_tmpfile_setuid},
    {"setcap", "<path>", 1, 1, probe_setcap},
    {"tcp-connect", "<numeric-host> <port>", 2, 2, probe_tcp_connect},
    {"abstract-connect", "<name>", 1, 1, probe_abstract_connect},
    {"kill", "<pid> [signal]", 1, 2, probe_kill},
    {"kill-all", "", 0, 0, probe_kill_all},
    {"getpid", "", 0, 0, probe_getpid},
    {"inotify-exhaust", "[hold]", 0, 1, probe_inotify_exhaust},
    {"inotify-one", "", 0, 0, probe_inotify_one},
    {"fork-bomb", "", 0, 0, probe_fork_bomb},
    {"memory-hog", "<MiB>", 1, 1, probe_memory_hog},
    {"cpu-burn", "<ms>", 1, 1, probe_cpu_burn},
    {"tcp-fill", "<conns>", 1, 1, probe_tcp_fill},
    {"tcp-unaccepted", "<conns> <ms> [6]", 2, 3, probe_tcp_unaccepted},
    {"hostname", "", 0, 0, probe_hostname},
    {"sethostname", "<name>", 1, 1, probe_sethostname},
    {"sysv-shm", "<key>", 1, 1, probe_sysv_shm},
    {"sysv-msg", "<key>", 1, 1, probe_sysv_msg},
    {"netdevs", "", 0, 0, probe_netdevs},
    {"uid-map", "", 0, 0, probe_uid_map},
    {"gid-map", "", 0, 0, probe_gid_map},
    {"cgroup", "", 0, 0, probe_cgroup},
    {"mounts", "", 0, 0, probe_mounts},
    {"sleep-forever", "", 0, 0, probe_sleep_forever},
    {"ignore-term-and-fork", "", 0, 0, probe_ignore_term_and_fork},
    {"exit", "<code>", 1, 1, probe_exit},
    {"raise", "<signal>", 1, 1, probe_raise},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage_error("usage: probe <name> [args…] | --list | --help");
  }
  std::string_view name = argv[1];
  if (name == "--list" || name == "--help") {
    std::string out;
    for (const auto& p : kProbes) {
      out += std::string(p.name);
      if (name == "--help" && !p.arg_usage.empty()) {
        out += " " + std::string(p.arg_usage);
      }
      out += "\n";
    }
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  for (const auto& p : kProbes) {
    if (p.name != name) {
      continue;
    }
    Args args(argv + 2, static_cast<size_t>(argc - 2));
    if (args.size() < p.min_args || args.size() > p.max_args) {
      usage_error("usage: probe " + std::string(p.name) + " " + std::string(p.arg_usage));
    }
    g_probe_name = p.name;
    emit(p.run(args));
    return 0;
  }
  usage_error("unknown probe `" + std::string(name) + "`");
}
