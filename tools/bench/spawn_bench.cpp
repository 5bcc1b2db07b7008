// Spawn-to-exit latency of `/bin/true`, side by side in one run (these machines drift, so
// only ratios measured interleaved are meaningful): a bare fork+exec (the floor), `unshare`
// with user/mount/pid/ipc/uts/net namespaces, bubblewrap with an equivalent isolation set,
// `cordon run` with its full default sandbox, the engine library (start → settle) in a small
// process and in one with 1 GiB resident, the same through `cordon serve` (unix socket,
// JSON-RPC tools/call run_command) and `cordon mcp` (stdio), and the cost of the v1 cgroup
// placement alone. Then the sustained back-to-back rate of the small engine.
//
//   build/spawn_bench [--runs N] [--spacing-ms MS] [--rate-jobs N] [--big-mib MIB] [--json FILE]
//                     [--compare-host PATH]   (one more engine variant: another build's)
//
// With a warm pool in the engine (EngineOptions::warm_pool), every engine variant runs with
// the pool on, and an engine with it off runs interleaved too (what --compare-pool did).
//
// Each round runs every variant once, in a random order, with `spacing` between spawns (20 ms:
// how agents use it; the v1 cgroup placement costs an RCU grace period at that spacing).
// The engine variants run in helper processes (this binary with --engine-host), so the small
// and the big engine differ only in the memory they hold.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cordon/engine.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/prepare.hpp"
#include "sandbox/seccomp.hpp"
#include "sys/syscalls.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// What die() must undo, since std::exit skips the destructors of locals: the daemon (the
// engine hosts and `cordon mcp` end on EOF of their stdin), the placement cgroup, the work dir.
std::function<void()> g_cleanup;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "spawn_bench: %s\n", what.c_str());
  if (g_cleanup) {
    auto cleanup = std::move(g_cleanup);
    g_cleanup = nullptr;
    cleanup();
  }
  std::exit(1);
}

struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;  // its stdin (our write end), its stdout (our read end); -1 if none
};

// posix_spawn with stdin/stdout as pipes to us (pipes = true) or /dev/null; stderr /dev/null
// unless keep_stderr.
Child spawn(const std::vector<std::string>& argv, bool pipes, bool keep_stderr = false) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  Child c;
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipes) {
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) die("pipe2 failed");
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  } else {
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  }
  if (!keep_stderr) posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  if (posix_spawn(&c.pid, av[0], &fa, nullptr, av.data(), environ) != 0) {
    die("posix_spawn " + argv[0] + " failed");
  }
  posix_spawn_file_actions_destroy(&fa);
  if (pipes) {
    ::close(in[0]);
    ::close(out[1]);
    c.to = in[1];
    c.from = out[0];
  }
  return c;
}

// Ends a helper driven over its stdin: EOF there, then reap it.
void end_host(Child& c) {
  ::close(c.to);
  int st;
  ::waitpid(c.pid, &st, 0);
  ::close(c.from);
}

double run_argv(const std::vector<std::string>& argv) {
  auto t0 = Clock::now();
  Child c = spawn(argv, false);
  int st = 0;
  ::waitpid(c.pid, &st, 0);
  double ms = ms_since(t0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    die(argv[0] + " exited with status " + std::to_string(st));
  }
  return ms;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Newline-delimited text over a pair of fds (a pipe pair or one socket twice).
class LineConn {
 public:
  LineConn(int out, int in) : out_(out), in_(in) {}
  void send(const std::string& line) {
    std::string s = line + "\n";
    size_t done = 0;
    while (done < s.size()) {
      ssize_t n = ::write(out_, s.data() + done, s.size() - done);
      if (n <= 0) die("write to a server failed");
      done += static_cast<size_t>(n);
    }
  }
  std::string read_line() {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      char tmp[65536];
      ssize_t n = ::read(in_, tmp, sizeof tmp);
      if (n <= 0) die("a server closed the connection");
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }
  // The reply to request `id` (notifications in between are skipped).
  std::string reply(int id) {
    std::string want = "\"id\":" + std::to_string(id) + ",";
    std::string want_end = "\"id\":" + std::to_string(id) + "}";
    for (;;) {
      std::string line = read_line();
      if (line.find(want) != std::string::npos || line.find(want_end) != std::string::npos) {
        return line;
      }
    }
  }

 private:
  int out_, in_;
  std::string buf_;
};

// A JSON-RPC (MCP) client of cordon serve or cordon mcp: one run_command of /bin/true,
// timed from the request to the reply that says it exited.
class ToolClient {
 public:
  explicit ToolClient(LineConn conn) : conn_(std::move(conn)) {
    conn_.send(
        R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",)"
        R"("capabilities":{},"clientInfo":{"name":"spawn_bench","version":"1"}}})");
    std::string r = conn_.reply(1);
    if (r.find("\"result\"") == std::string::npos) die("initialize failed: " + r);
    conn_.send(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  }
  double run_true() {
    int id = next_id_++;
    auto t0 = Clock::now();
    conn_.send(R"({"jsonrpc":"2.0","id":)" + std::to_string(id) +
               R"(,"method":"tools/call","params":{"name":"run_command","arguments":)"
               R"({"argv":["/bin/true"]}}})");
    std::string r = conn_.reply(id);
    double ms = ms_since(t0);
    if (r.find("\"state\":\"exited\"") == std::string::npos ||
        r.find("\"exitCode\":0") == std::string::npos) {
      die("run_command did not exit cleanly: " + r.substr(0, 2000));
    }
    return ms;
  }

 private:
  LineConn conn_;
  int next_id_ = 2;
};

// The warm pool (EngineOptions::warm_pool, warm_pool_size) may or may not be in the engine
// this is built against; these compile either way, so the benchmark needs no change when it
// lands. Returns the pool size the engine will use (0: no pool).
template <class Options>
size_t configure_pool(Options& o, bool on) {
  (void)on;
  if constexpr (requires { o.warm_pool; }) {
    o.warm_pool = on;
    if (!on) {
      return 0;
    }
    if constexpr (requires { o.warm_pool_size; }) {
      return o.warm_pool_size;
    }
    return 1;
  }
  return 0;
}

bool engine_has_pool() {
  cordon::EngineOptions o;
  return configure_pool(o, true) > 0;
}

// ---- the engine host: this binary with --engine-host, driven over stdin/stdout ----
// Commands (one line each): "r" runs one start->settle and answers its ms; "b N" runs N
// back to back and answers "total_ms median_ms"; EOF ends it.

int engine_host(const std::string& dir, const std::string& state, const std::string& policy,
                size_t resident_mib, bool pool) {
  if (resident_mib > 0) {
    // Touched, private, anonymous memory: what a big engine (caches, sessions) holds.
    size_t bytes = resident_mib << 20;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap of the resident memory failed");
    std::memset(p, 0x5a, bytes);
  }
  cordon::EngineOptions eo;
  eo.state_dir = state;
  eo.policy_path = policy;
  eo.spawner_path = dir + "/cordon-spawner";
  eo.init_path = dir + "/cordon-init";
  eo.default_seccomp_profile = dir + "/seccomp/default.json";
  configure_pool(eo, pool);
  auto engine = cordon::Engine::open(eo);
  if (!engine) die("engine: " + engine.error().message());
  auto one = [&] {
    auto t0 = Clock::now();
    auto s = (*engine)->start("bench", {.argv = {"/bin/true"}});
    if (!s) die("start: " + s.error().message());
    auto st = (*engine)->status("bench", s->task_id, std::chrono::seconds(30));
    double ms = ms_since(t0);
    if (!st || st->state != "exited") {
      die("engine job did not exit cleanly: " + (st ? st->state + " " + st->error : ""));
    }
    (void)(*engine)->remove("bench", s->task_id);
    return ms;
  };
  one();  // warm-up: the seccomp compile, the page cache
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    std::string cmd;
    char c;
    while (::read(0, &c, 1) == 1 && c != '\n') cmd.push_back(c);
    if (cmd.empty()) break;
    char out[128];
    if (cmd == "r") {
      std::snprintf(out, sizeof out, "%.6f\n", one());
    } else if (cmd.rfind("b ", 0) == 0) {
      int n = std::atoi(cmd.c_str() + 2);
      std::vector<double> each;
      auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) each.push_back(one());
      std::snprintf(out, sizeof out, "%.6f %.6f\n", ms_since(t0), percentile(each, 0.5));
    } else {
      die("engine host: unknown command " + cmd);
    }
    if (::write(1, out, std::strlen(out)) < 0) die("engine host: write failed");
  }
  engine->reset();
  return 0;
}

struct EngineHost {
  Child child;
  LineConn conn;
  EngineHost(const std::string& self, const std::string& state, const std::string& policy,
             size_t mib, bool pool = true)
      : child(spawn({self, "--engine-host", state, policy, std::to_string(mib), pool ? "1" : "0"},
                    true, true)),
        conn(child.to, child.from) {
    if (conn.read_line() != "ready") die("engine host did not start");
  }
  double run() {
    conn.send("r");
    return std::atof(conn.read_line().c_str());
  }
  std::pair<double, double> back_to_back(int n) {
    conn.send("b " + std::to_string(n));
    std::string r = conn.read_line();
    double total = 0, median = 0;
    std::sscanf(r.c_str(), "%lf %lf", &total, &median);
    return {total, median};
  }
  ~EngineHost() { end_host(child); }
};

// ---- the parked hand-off: this binary with --handoff-host, driven over stdin/stdout ----
// What a pooled start costs at the least, without cordon: a process made ahead (as a parked
// init is) is handed a job (one byte), vforks, and the child execs /bin/true through a pinned
// fd; the parked process reaps it and answers (one byte). With `confine`, the parked process
// holds the default profile's filter and the fixed filter (compiled by cordon's own code),
// loaded once as a parked cordon-init loads them (kPlanPreloadFilters, since session 20; before,
// each child loaded both), and the child confines itself as a pooled cordon command does
// before its exec (init.cpp run_command: a session, no_new_privs, a Landlock domain). No
// namespaces, no cgroups, no records, one process hop: whatever a design adds to a pooled start
// comes on top of this.
int handoff_host(const std::string& dir, bool confine) {
  int exe = ::open("/bin/true", O_PATH | O_CLOEXEC);
  int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (exe < 0 || null < 0) die("handoff host: open /bin/true or /dev/null failed");
  std::vector<struct sock_filter> profile, fixed;
  int ruleset = -1;
  if (confine) {
    auto prof = cordon::policy::load_seccomp_profile(dir + "/seccomp/default.json");
    if (!prof) die("handoff host: " + prof.error().message());
    auto filters = cordon::sandbox::compile_filters(*prof, {});
    if (!filters) die("handoff host: " + filters.error().message());
    profile = filters->profile.insns;
    fixed = filters->fixed.insns;
    // The handled rights and scopes of a sandbox (prepare.cpp), with its rules' shape: read
    // and execute everywhere, everything in /tmp, the device's rights on /dev/null.
    int abi = cordon::sys::landlock_abi();
    if (abi < 1) die("handoff host: Landlock is not available");
    const uint64_t handled = cordon::sandbox::landlock_handled_access(abi);
    cordon::sys::LandlockRulesetAttr attr{};
    attr.handled_access_fs = handled;
    attr.scoped = cordon::sandbox::landlock_scopes(abi);
    ruleset =
        cordon::sys::landlock_create_ruleset(&attr, abi >= 6 ? sizeof attr : sizeof(uint64_t), 0);
    if (ruleset < 0) die("handoff host: landlock_create_ruleset failed");
    const uint64_t kRead =
        LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
    const uint64_t kDev = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                          cordon::sys::kLandlockAccessFsTruncate |
                          cordon::sys::kLandlockAccessFsIoctlDev;
    for (auto [path, access] :
         {std::pair<const char*, uint64_t>{"/", kRead}, {"/tmp", handled}, {"/dev/null", kDev}}) {
      int fd = ::open(path, O_PATH | O_CLOEXEC);
      cordon::sys::LandlockPathBeneathAttr pb{};
      pb.allowed_access = access & handled;
      pb.parent_fd = fd;
      if (fd < 0 || cordon::sys::landlock_add_rule(
                        ruleset, cordon::sys::kLandlockRuleTypePathBeneath, &pb, 0) != 0) {
        die(std::string("handoff host: landlock_add_rule ") + path + " failed");
      }
      ::close(fd);
    }
  }
  auto load = [](std::vector<struct sock_filter>& insns) {
    if (insns.empty()) return true;
    struct sock_fprog prog {};
    prog.len = static_cast<unsigned short>(insns.size());
    prog.filter = insns.data();
    return ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0;
  };
  // The two filters once, here, as a parked cordon-init loads them before its job
  // (kPlanPreloadFilters): each child inherits them.
  if (confine &&
      (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || !load(profile) || !load(fixed))) {
    die("handoff host: loading the filters failed");
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) == 1) {
    // vfork, as the floor's posix_spawn does: the copy of this process's page tables that a
    // fork pays would be a cost of this helper's size, not of the design (a parked cordon-init
    // is small). The child makes only system calls until its exec or _exit.
    pid_t pid = ::vfork();
    if (pid < 0) die("handoff host: vfork failed");
    if (pid == 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      if (confine && (::setsid() < 0 || ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
                      cordon::sys::landlock_restrict_self(ruleset, 0) != 0)) {
        ::_exit(126);
      }
      char arg0[] = "/bin/true";
      char* av[] = {arg0, nullptr};
      cordon::sys::execveat(exe, "", av, environ, AT_EMPTY_PATH);
      ::_exit(127);
    }
    int st = 0;
    bool reaped = ::waitpid(pid, &st, 0) == pid;
    char ok = reaped && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 'y' : 'n';
    if (::write(1, &ok, 1) != 1) die("handoff host: write failed");
  }
  return 0;
}

struct HandoffHost {
  Child child;
  HandoffHost(const std::string& self, bool confine)
      : child(spawn({self, "--handoff-host", confine ? "1" : "0"}, true, true)) {
    LineConn conn(child.to, child.from);
    if (conn.read_line() != "ready") die("handoff host did not start");
  }
  double run() {
    auto t0 = Clock::now();
    char c = 'g';
    if (::write(child.to, &c, 1) != 1 || ::read(child.from, &c, 1) != 1) {
      die("handoff host: the pipe broke");
    }
    double ms = ms_since(t0);
    if (c != 'y') die("handoff host: /bin/true did not exit 0");
    return ms;
  }
  ~HandoffHost() { end_host(child); }
};

long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

std::string self_dir() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin(self, static_cast<size_t>(n > 0 ? n : 0));
  return bin.substr(0, bin.rfind('/'));
}

// The v1 placement cordon does on this host, alone: a fresh child moves itself into a job's
// memory, pids and cpu cgroups (it writes "0" to each `tasks` file, opened by the parent, as
// a sandbox does first thing: ChildPlan::v1_tasks_fds), timed by the child around the writes.
class V1Placement {
 public:
  V1Placement() {
    auto layout = cordon::sandbox::detect_cgroup_layout();
    if (!layout || layout->mode != cordon::sandbox::CgroupMode::kHybrid) return;
    if (!cordon::sandbox::prepare_parents(*layout)) return;
    auto cg = cordon::sandbox::JobCgroup::create(*layout, "bench-" + std::to_string(::getpid()),
                                                 cordon::sandbox::CgroupLimits{});
    if (!cg) die("create the placement cgroup: " + cg.error().message());
    cgroup_.emplace(std::move(*cg));
  }
  bool available() const { return cgroup_.has_value(); }
  void destroy() {
    if (cgroup_) {
      (void)cgroup_->destroy();
      cgroup_.reset();
    }
  }
  double run() {
    std::vector<int> tasks;
    for (int dir : cgroup_->v1_dirfds()) {
      int fd = ::openat(dir, "tasks", O_WRONLY | O_CLOEXEC);
      if (fd < 0) die("open a v1 `tasks` file failed");
      tasks.push_back(fd);
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) die("pipe2 failed");
    pid_t pid = ::fork();
    if (pid == 0) {
      auto t0 = Clock::now();
      for (int fd : tasks) {
        if (::write(fd, "0", 1) != 1) ::_exit(1);
      }
      double ms = ms_since(t0);
      ::_exit(::write(p[1], &ms, sizeof ms) == sizeof ms ? 0 : 1);
    }
    ::close(p[1]);
    for (int fd : tasks) ::close(fd);
    double ms = -1;
    bool got = ::read(p[0], &ms, sizeof ms) == sizeof ms;
    ::close(p[0]);
    int st;
    ::waitpid(pid, &st, 0);
    if (!got || !WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the placement child failed");
    return ms;
  }

 private:
  std::optional<cordon::sandbox::JobCgroup> cgroup_;
};

struct Args {
  int runs = 500;
  int spacing_ms = 20;
  int rate_jobs = 200;
  size_t big_mib = 1024;
  std::string json_out;
  std::string compare_host;  // another build's spawn_bench: its engine as one more variant (A/B)
};

void bench(const Args& args, const std::string& work) {
  const int runs = args.runs, spacing_ms = args.spacing_ms, rate_jobs = args.rate_jobs;
  const size_t big_mib = args.big_mib;
  const std::string& json_out = args.json_out;
  std::string dir = self_dir();
  std::string self = dir + "/spawn_bench";
  std::string root = work + "/root";
  std::filesystem::create_directories(root);
  std::string policy = work + "/policy.json";
  std::ofstream(policy) << "{\"allowedExecutables\": [\"/bin/true\", \"/usr/bin/true\"], "
                           "\"cwdRoot\": \""
                        << root << "\"}";

  cordon::EngineOptions defaults;
  const size_t pool_size = configure_pool(defaults, true);
  EngineHost small(self, work + "/engine-small", policy, 0);
  EngineHost big(self, work + "/engine-big", policy, big_mib);
  // With a warm pool in the engine, the same engine without it, interleaved: the pool's effect.
  std::optional<EngineHost> unpooled;
  if (engine_has_pool()) {
    unpooled.emplace(self, work + "/engine-nopool", policy, 0, false);
  }
  // A/B of a change: the small engine of another build (its spawn_bench as the host, with the
  // engine, cordon-spawner and cordon-init next to it), interleaved with this one's.
  std::optional<EngineHost> other_build;
  if (!args.compare_host.empty()) {
    other_build.emplace(args.compare_host, work + "/engine-other-build", policy, 0);
  }
  long small_rss = rss_kib(small.child.pid), big_rss = rss_kib(big.child.pid);
  HandoffHost handoff(self, false), handoff_confined(self, true);

  Child daemon = spawn({dir + "/cordon", "serve", "--policy", policy, "--state-dir",
                        work + "/daemon", "--socket", work + "/d.sock"},
                       false);
  V1Placement placement;
  g_cleanup = [&placement, pid = daemon.pid, work] {
    ::kill(pid, SIGTERM);
    int st;
    ::waitpid(pid, &st, 0);
    placement.destroy();
    std::error_code ec;
    std::filesystem::remove_all(work, ec);
  };
  int sock = -1;
  for (int i = 0; i < 1000 && sock < 0; ++i) {
    sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s/d.sock", work.c_str());
    if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(sock);
      sock = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // not a test: a startup poll
    }
  }
  if (sock < 0) die("cordon serve did not listen");
  LineConn hello(sock, sock);
  hello.send(R"({"cordon":"connect","session":"bench"})");
  if (hello.read_line().find("\"ok\":true") == std::string::npos) die("daemon handshake failed");
  ToolClient via_daemon(LineConn(sock, sock));

  Child mcp = spawn({dir + "/cordon", "mcp", "--policy", policy, "--state-dir", work + "/mcp",
                     "--session", "bench"},
                    true);
  ToolClient via_mcp(LineConn(mcp.to, mcp.from));

  const std::string kFloor = "fork+exec (floor)", kBwrap = "bubblewrap",
                    kRun = "cordon run (full sandbox, v1 limits)",
                    kRunDaemon = "cordon run --socket (daemon's pool)",
                    kEngine = "engine library start->settle",
                    kBig = "engine library, 1 GiB resident", kDaemon = "cordon serve run_command",
                    kMcp = "cordon mcp run_command",
                    kPlace = "v1 placement alone (the child, 3 writes)",
                    kHandoff = "parked process: vfork+exec",
                    kHandoffConfined = "parked process: vfork, confine, exec";
  std::map<std::string, std::function<double()>> variants = {
      {kFloor, [] { return run_argv({"/bin/true"}); }},
      {"unshare -U -m -p -i -u -n -f",
       [] {
         return run_argv({"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "--pid",
                          "--ipc", "--uts", "--net", "--fork", "/bin/true"});
       }},
      {kBwrap,
       [root] {
         return run_argv({"/usr/bin/bwrap",
                          "--unshare-all",
                          "--die-with-parent",
                          "--new-session",
                          "--ro-bind",
                          "/usr",
                          "/usr",
                          "--symlink",
                          "usr/bin",
                          "/bin",
                          "--symlink",
                          "usr/lib",
                          "/lib",
                          "--symlink",
                          "usr/lib64",
                          "/lib64",
                          "--proc",
                          "/proc",
                          "--dev",
                          "/dev",
                          "--tmpfs",
                          "/tmp",
                          "--bind",
                          root,
                          root,
                          "/bin/true"});
       }},
      {kRun,
       [dir, root, work] {
         return run_argv({dir + "/cordon", "run", "--root", root, "--state-dir", work + "/run",
                          "--", "/bin/true"});
       }},
      // The same CLI through the daemon above: its sandbox comes from the daemon's warm pool.
      {kRunDaemon,
       [dir, root, work] {
         return run_argv({dir + "/cordon", "run", "--socket", work + "/d.sock", "--cwd", root, "--",
                          "/bin/true"});
       }},
      {kEngine, [&small] { return small.run(); }},
      {kBig, [&big] { return big.run(); }},
      {kDaemon, [&via_daemon] { return via_daemon.run_true(); }},
      {kMcp, [&via_mcp] { return via_mcp.run_true(); }},
      {kHandoff, [&handoff] { return handoff.run(); }},
      {kHandoffConfined, [&handoff_confined] { return handoff_confined.run(); }},
  };
  if (placement.available()) variants[kPlace] = [&placement] { return placement.run(); };
  if (unpooled) {
    variants["engine library, warm pool off"] = [&unpooled] { return unpooled->run(); };
  }
  if (other_build) {
    variants["engine library, --compare-host"] = [&other_build] { return other_build->run(); };
  }

  std::vector<std::string> names;
  for (auto& [k, v] : variants) names.push_back(k);
  std::map<std::string, std::vector<double>> samples;
  std::mt19937 rng(12345);
  for (auto& nm : names) variants[nm]();  // warm-up round (page cache, caches), not counted
  for (int r = 0; r < runs; ++r) {
    std::shuffle(names.begin(), names.end(), rng);
    for (auto& nm : names) {
      samples[nm].push_back(variants[nm]());
      std::this_thread::sleep_for(std::chrono::milliseconds(spacing_ms));
    }
  }
  // Back to back: the next job starts as soon as the previous one settled.
  auto [b2b_total_ms, b2b_median_ms] = small.back_to_back(rate_jobs);
  double rate = rate_jobs / (b2b_total_ms / 1000.0);

  double floor = percentile(samples[kFloor], 0.5);
  double bwrap = percentile(samples[kBwrap], 0.5);
  std::printf("spawn-to-exit of /bin/true, %d interleaved runs each, %d ms apart\n", runs,
              spacing_ms);
  std::printf("%-38s %10s %10s %9s %9s %9s\n", "variant", "median ms", "p99 ms", "x floor",
              "p99/floor", "x bwrap");
  std::string json = "{\"runs\": " + std::to_string(runs) +
                     ", \"spacingMs\": " + std::to_string(spacing_ms) + ", \"variants\": {";
  bool first = true;
  for (auto& [nm, v] : samples) {
    double med = percentile(v, 0.5), p99 = percentile(v, 0.99);
    std::printf("%-38s %10.3f %10.3f %9.2f %9.2f %9.2f\n", nm.c_str(), med, p99, med / floor,
                p99 / floor, med / bwrap);
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\": {\"medianMs\": %.4f, \"p99Ms\": %.4f, \"xFloor\": %.4f, "
                  "\"p99xFloor\": %.4f, \"xBwrap\": %.4f}",
                  first ? "" : ", ", nm.c_str(), med, p99, med / floor, p99 / floor, med / bwrap);
    json += buf;
    first = false;
  }
  double eng = percentile(samples[kEngine], 0.5), bigm = percentile(samples[kBig], 0.5);
  double run = percentile(samples[kRun], 0.5);
  double place = samples.count(kPlace) ? percentile(samples[kPlace], 0.5) : 0;
  std::printf("\nratios\n");
  std::printf(
      "  engine 1 GiB resident / small engine (median)   %.2f  (engine RSS %ld MiB vs %ld "
      "MiB)\n",
      bigm / eng, big_rss / 1024, small_rss / 1024);
  std::printf("  cordon run / bubblewrap (median)                 %.2f\n", run / bwrap);
  const double run_daemon = percentile(samples[kRunDaemon], 0.5);
  std::printf("  cordon run --socket / bubblewrap (median)        %.2f  (the daemon's warm pool)\n",
              run_daemon / bwrap);
  if (place > 0) {
    std::printf(
        "  cordon run minus the v1 placement / bubblewrap   %.2f  (cordon run always places "
        "into v1 on this host; the sandbox moves itself, %.3f ms)\n",
        (run - place) / bwrap, place);
  }
  const double handoff_ms = percentile(samples[kHandoff], 0.5),
               confined_ms = percentile(samples[kHandoffConfined], 0.5);
  std::printf(
      "  parked process, vfork+exec / floor             %.2f  (one hand-off to a process made "
      "ahead)\n",
      handoff_ms / floor);
  std::printf(
      "  parked process, vfork, confine, exec / floor   %.2f  (the least a pooled start that "
      "confines each command costs: %.3f ms of confinement)\n",
      confined_ms / floor, confined_ms - handoff_ms);
  std::printf("  engine library / parked process confined       %.2f  (what the engine adds)\n",
              eng / confined_ms);
  std::printf(
      "  back to back, small engine: %d jobs, %.1f jobs/s, median %.3f ms (%.2f x "
      "floor), pool size %zu\n",
      rate_jobs, rate, b2b_median_ms, b2b_median_ms / floor, pool_size);
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "}, \"floorMs\": %.4f, \"bwrapMs\": %.4f, \"bigOverSmall\": %.4f, "
                "\"smallEngineRssKiB\": %ld, \"bigEngineRssKiB\": %ld, \"runOverBwrap\": %.4f, "
                "\"runMinusPlacementOverBwrap\": %.4f, \"runViaDaemonOverBwrap\": %.4f, "
                "\"handoffOverFloor\": %.4f, \"handoffConfinedOverFloor\": %.4f, "
                "\"backToBack\": {\"jobs\": %d, "
                "\"jobsPerSecond\": %.2f, \"medianMs\": %.4f, \"poolSize\": %zu}}\n",
                floor, bwrap, bigm / eng, small_rss, big_rss, run / bwrap,
                place > 0 ? (run - place) / bwrap : 0.0, run_daemon / bwrap, handoff_ms / floor,
                confined_ms / floor, rate_jobs, rate, b2b_median_ms, pool_size);
  json += buf;
  if (!json_out.empty()) std::ofstream(json_out) << json;

  end_host(mcp);
  ::close(sock);
  int st;
  ::kill(daemon.pid, SIGTERM);
  ::waitpid(daemon.pid, &st, 0);
  g_cleanup = nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--handoff-host") {
    return handoff_host(self_dir(), std::string(argv[2]) == "1");
  }
  if (argc == 6 && std::string(argv[1]) == "--engine-host") {
    return engine_host(self_dir(), argv[2], argv[3], std::strtoul(argv[4], nullptr, 10),
                       std::string(argv[5]) == "1");
  }
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      args.runs = std::atoi(argv[++i]);
    } else if (a == "--spacing-ms" && i + 1 < argc) {
      args.spacing_ms = std::atoi(argv[++i]);
    } else if (a == "--rate-jobs" && i + 1 < argc) {
      args.rate_jobs = std::atoi(argv[++i]);
    } else if (a == "--big-mib" && i + 1 < argc) {
      args.big_mib = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--json" && i + 1 < argc) {
      args.json_out = argv[++i];
    } else if (a == "--compare-host" && i + 1 < argc) {
      args.compare_host = argv[++i];
    } else if (a == "--compare-pool") {
      // Kept for the pool branch's callers: the comparison runs whenever the engine has a pool.
    } else {
      std::fprintf(stderr,
                   "usage: spawn_bench [--runs N] [--spacing-ms MS] [--rate-jobs N] "
                   "[--big-mib MIB] [--json FILE] [--compare-host PATH]\n");
      return 2;
    }
  }
  if (args.runs < 1 || args.rate_jobs < 1) die("--runs and --rate-jobs must be at least 1");
  char tmpl[] = "/var/tmp/cordon-bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) die("mkdtemp failed");
  std::string work = tmpl;
  g_cleanup = [work] {
    std::error_code ec;
    std::filesystem::remove_all(work, ec);
  };
  bench(args, work);
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  return 0;
}
