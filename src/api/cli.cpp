#include "api/cli.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/daemon.hpp"
#include "api/doctor.hpp"
#include "api/mcp.hpp"
#include "api/tools.hpp"
#include "base/base64.hpp"
#include "base/json_fields.hpp"
#include "base/strings.hpp"
#include "base/utf8.hpp"
#include "engine/oneshot.hpp"
#include "policy/host_paths.hpp"
#include "sandbox/userns.hpp"
#include "sys/fs.hpp"

extern char** environ;

namespace cordon::api {
namespace {

using json = nlohmann::json;

constexpr const char* kUsage = R"(usage: cordon run [options] -- PROGRAM [ARGS...]
       cordon doctor [--state-dir DIR]
       cordon mcp --policy FILE [--state-dir DIR] [--session NAME]
       cordon mcp --connect SOCKET [--session NAME]
       cordon serve --policy FILE [--state-dir DIR] [--socket PATH] [--allow-uid UID]...
       cordon start|status|wait|output|kill|write|resize|list|rm [--socket PATH] [--session NAME] [--json] ...
       cordon --version

Runs PROGRAM once inside a kernel-enforced sandbox (no shell, ever) and exits with its exit
code (128+N when killed by signal N). Options of `run`:
  --root DIR          working root, bound read-write at its own path (default: current dir)
  --cwd DIR           working directory inside the root (default: current dir if inside, else root)
  --ro PATH           also bind a host path read-only at its own path (repeatable)
  --network none|host default none: a fresh network namespace with only loopback up
  --memory BYTES      memory limit, e.g. 2G (default 2G)
  --pids N            process/thread limit (default 1024)
  --cpus N            CPU limit in cores, e.g. 1.5 (default: half the host's cores, at least 1)
  --timeout SECONDS   wall clock limit (default 3600); SIGTERM, then SIGKILL after the grace
  --kill-grace SECONDS  time between SIGTERM and SIGKILL (default 5)
  --max-output BYTES  per-stream output cap (default 1G); the command is killed at the cap
  --env NAME=VALUE    set a variable (repeatable)
  --pass-env NAME     copy a variable from cordon's environment (repeatable)
  --seccomp FILE      seccomp profile, OCI JSON (default: the shipped default.json)
  --user UID          the uid the command sees inside (default 1000)
  --json-status FILE  write the authoritative outcome as JSON (symlinks refused)
  --tty               give the command a new pty, relayed to this terminal
  --allow-ptrace      allow ptrace inside the sandbox (sanitizer builds; see docs/security.md)
  --allow-netlink     allow NETLINK_ROUTE sockets (getifaddrs, `ip`); their queued replies are
                      charged to no memory cgroup (see docs/security.md)
  --state-dir DIR     cordon's state directory (default /var/lib/cordon as root)
  --host-ids START:COUNT  the reserved host uid/gid range, one id per concurrent sandbox
                      (default 1879048192:65536; `cordon doctor` checks it is unused)
  --socket PATH       run through a running `cordon serve` instead, in a sandbox from its
                      warm pool shaped by its policy (only --cwd, --timeout, --env,
                      --pass-env and --json-status apply)

`cordon mcp` serves the agent tools (docs/tools.md) as an MCP server on stdin/stdout; it ends,
and its running commands with it, when stdin closes. Jobs are kept in the state dir under the
session (default `default`), so a restarted server answers for them.

`cordon serve` (alias `cordon daemon`) serves the same tools on a unix socket (default <state-dir>/daemon.sock) to
root, its own uid, the policy's daemon.allowedUids and each --allow-uid; sessions are per
peer uid; a named session outlives its connection, an unnamed one ends with it.
`cordon mcp --connect SOCKET` is a thin MCP front on stdio for it, so long jobs survive the
agent's restarts.

Exit codes besides the command's own: 122 OOM-killed, 123 output cap, 124 timeout,
125 refused or could not set up, 126 cannot execute, 127 program not found.
)";

struct RunArgs {
  std::optional<std::string> root, cwd, seccomp, json_status, state_dir;
  std::optional<std::string> socket;  // run through a daemon's warm pool (run_via_daemon)
  std::vector<std::string> given;     // every option given, for --socket's refusals
  std::vector<std::string> ro, env, pass_env, argv, test_disable_walls;
  std::string network = "none";
  std::optional<uint64_t> memory, pids, max_output;
  std::optional<double> cpus, timeout_s, grace_s;
  std::optional<std::string> host_ids;
  uint32_t user = 1000;
  bool tty = false, allow_ptrace = false, allow_netlink = false;
};

// A --timeout or --kill-grace in seconds whose milliseconds fit an int64 with room to spare
// (a cast from a double past that is undefined). A billion seconds is 31 years.
bool seconds_fit(const std::optional<double>& s) { return !s || *s <= 1e9; }

// Every message for the operator's terminal goes out through here. A message can carry text a
// job wrote (a script's `#!` line in its root, a path), so its control characters are shown
// escaped as the status tail's are; newlines and tabs stay (an operator's refusal text may have
// lines). Failure fixed (a review, session 35): a job rewrote an allowlisted script's `#!`
// line to OSC 52 and cursor sequences, and the refusal of its start wrote the operator's
// clipboard and forged lines on their terminal.
void say(const char* prefix, const std::string& msg) {
  std::fprintf(stderr, "cordon: %s%s\n", prefix, escape_controls(msg).c_str());
}

// How many bytes at the end of `text` may go on in the next page of output: a CR (its LF may
// start the next page) or the first bytes of a UTF-8 character cut short (a proper prefix of a
// well-formed sequence, as the pager's own decoding rule says: utf8_unit_length).
size_t continued_tail(const std::string& text) {
  if (!text.empty() && text.back() == '\r') {
    return 1;
  }
  for (size_t k = 1; k <= 3 && k <= text.size(); ++k) {
    const auto* p = reinterpret_cast<const uint8_t*>(text.data() + text.size() - k);
    if (utf8_unit_length(p, k, /*final=*/false) == 0) {
      return k;
    }
  }
  return 0;
}

// A command's output as the operator's terminal shows it: a CR before LF is a pty's line end,
// kept as LF; every other control character is escaped (escape_controls).
std::string for_terminal(std::string_view text) {
  std::string lines;
  lines.reserve(text.size());
  for (size_t k = 0; k < text.size(); ++k) {
    if (!(text[k] == '\r' && k + 1 < text.size() && text[k + 1] == '\n')) {
      lines += text[k];
    }
  }
  return escape_controls(lines);
}

int refuse(const std::string& msg, int code = kExitRefused) {
  say("", msg);
  return code;
}

std::string exe_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) {
    return ".";
  }
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

std::string first_existing(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates) {
    if (::access(c.c_str(), F_OK) == 0) {
      return c;
    }
  }
  return candidates.front();
}

std::string default_state_dir() {
  if (::geteuid() == 0) {
    return "/var/lib/cordon";
  }
  const char* xdg = ::getenv("XDG_STATE_HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/cordon";
  }
  const char* home = ::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.local/state/cordon";
}

bool valid_env_name(const std::string& n) {
  if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) {
    return false;
  }
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
      return false;
    }
  }
  return true;
}

// argv[0] rules: no shell, ever; so no metacharacters and no PATH lookup.
Result<std::string> resolve_program(const std::string& arg0, const std::string& cwd) {
  if (arg0.empty()) {
    return refusal("the program name is empty");
  }
  if (arg0.find_first_of(" \t\n\r;&|<>()$`\\\"'*?[]{}~!#") != std::string::npos) {
    return refusal(
        "`{}` looks like shell syntax: cordon runs commands with NO shell. Pass the "
        "program and its arguments as separate words, e.g. `cordon run -- /usr/bin/make "
        "test`",
        arg0);
  }
  if (arg0[0] == '/') {
    return normalize_path(arg0);
  }
  if (arg0.find('/') != std::string::npos) {
    return normalize_path(cwd + "/" + arg0);
  }
  std::string hint;
  const char* path = ::getenv("PATH");
  for (const auto& dir : split(path ? path : "/usr/bin:/bin", ':')) {
    std::string cand = dir + "/" + arg0;
    if (!dir.empty() && dir[0] == '/' && ::access(cand.c_str(), X_OK) == 0) {
      hint = fmt::format(", e.g. `{}`", cand);
      break;
    }
  }
  return refusal(
      "`{}` is not a path: cordon does no PATH lookup (there is no shell). Give the "
      "program's absolute path{}",
      arg0, hint);
}

std::optional<sandbox::Wall> wall_by_name(const std::string& n) {
  using sandbox::Wall;
  static const std::pair<const char*, Wall> kWalls[] = {
      {"seccomp-profile", Wall::kSeccompProfile},
      {"seccomp-fixed", Wall::kSeccompFixed},
      {"landlock", Wall::kLandlock},
      {"pid-namespace", Wall::kPidNamespace},
      {"net-namespace", Wall::kNetNamespace},
      {"cap-drop", Wall::kCapDrop},
      {"etc-mask", Wall::kEtcMask},
      {"proc-readonly", Wall::kProcReadOnly},
      {"user-quotas", Wall::kUserQuotas},
      {"tcp-orphans", Wall::kTcpOrphans},
      {"no-new-privs", Wall::kNoNewPrivs},
      {"dumpable", Wall::kDumpable},
      {"close-fds", Wall::kCloseFds},
      {"ro-paths", Wall::kReadOnlyPaths},
      {"ipc-namespace", Wall::kIpcNamespace},
      {"uts-namespace", Wall::kUtsNamespace},
      {"cgroup-placement", Wall::kCgroupPlacement},
  };
  for (const auto& [name, w] : kWalls) {
    if (n == name) {
      return w;
    }
  }
  return std::nullopt;
}

json status_json(const engine::OneshotReport& r, const engine::OneshotRequest& req) {
  json j;
  j["state"] = r.state;
  j["exitCode"] = r.state == "exited" ? json(r.exit_code) : json(nullptr);
  if (r.term_signal > 0) {
    const char* abbrev = sigabbrev_np(r.term_signal);
    j["signal"] = abbrev ? std::string("SIG") + abbrev : std::to_string(r.term_signal);
    j["signalNumber"] = r.term_signal;
  } else {
    j["signal"] = nullptr;
  }
  j["waitStatus"] = r.have_wait_status ? json(r.wait_status) : json(nullptr);
  j["durationMs"] = std::chrono::duration<double, std::milli>(r.duration).count();
  j["message"] = r.message;
  j["argv"] = r.argv;
  j["stdoutBytes"] = r.stdout_bytes;
  j["stderrBytes"] = r.stderr_bytes;
  if (!r.output_limit_stream.empty()) {
    j["outputLimitStream"] = r.output_limit_stream;
  }
  if (!r.setup_step.empty()) {
    j["setup"] = {{"step", r.setup_step}, {"errno", errno_name(r.setup_errno)}};
  }
  j["signalledByCaller"] = r.signalled_by_caller;
  if (r.usage_known) {
    j["usage"] = {{"peakMemoryBytes", r.peak_memory_bytes},
                  {"cpuTimeUs", r.cpu_usec},
                  {"oomKills", r.oom_kills},
                  {"pidsLimitHits", r.pids_max_hits}};
  } else {
    j["usage"] = nullptr;
  }
  const auto& a = r.applied;
  j["sandbox"] = {
      {"namespaces", {"user", "mount", "pid", "ipc", "uts", "cgroup"}},
      {"networkNamespace", a.network_namespace},
      {"hostUid", r.host_uid},
      {"insideUid", req.spec.inside_uid},
      {"idmappedRoot", a.idmapped_root},
      {"idmapFallback", a.idmap_fallback},
      {"landlockAbi", a.landlock_abi},
      {"landlockScopes", a.landlock_scopes},
      {"seccompProfile", req.seccomp_profile_path},
      {"seccompProfileApplied", a.seccomp_profile},
      {"seccompFixedFilter", a.seccomp_fixed},
      {"pinnedExecutable", a.pinned_executable},
      {"interpreter", a.interpreter},
      {"cgroupMode", r.cgroup_mode},
      {"limits",
       {{"memoryBytes", req.memory_bytes},
        {"pids", req.pids},
        {"cpus", req.cpus},
        {"timeoutMs", req.timeout.count()},
        {"killGraceMs", req.kill_grace.count()},
        {"maxOutputBytes", req.max_output_bytes}}},
  };
  if (a.network_namespace) {
    j["sandbox"]["namespaces"].push_back("net");
  }
  j["warnings"] = a.warnings;
  return j;
}

// --pass-env (each must be set in our environment), then --env over it, into `env` (a name
// already there takes the new value in its place). Shared by the standalone and the daemon run.
Result<void> add_requested_env(const RunArgs& a,
                               std::vector<std::pair<std::string, std::string>>& env) {
  auto set_env = [&env](const std::string& n, const std::string& v) {
    for (auto& [k, val] : env) {
      if (k == n) {
        val = v;
        return;
      }
    }
    env.emplace_back(n, v);
  };
  for (const auto& n : a.pass_env) {
    if (!valid_env_name(n)) {
      return refusal("--pass-env `{}` is not a variable name", n);
    }
    const char* v = ::getenv(n.c_str());
    if (v == nullptr) {
      return refusal("--pass-env {}: not set in cordon's environment; use --env {}=VALUE", n, n);
    }
    set_env(n, v);
  }
  for (const auto& e : a.env) {
    size_t eq = e.find('=');
    if (eq == std::string::npos || !valid_env_name(e.substr(0, eq))) {
      return refusal("--env `{}` must be NAME=VALUE with NAME made of letters, digits and _", e);
    }
    set_env(e.substr(0, eq), e.substr(eq + 1));
  }
  return {};
}

// --json-status: opened before anything runs, refusing symlinks anywhere in its path; each
// write replaces the whole file. Without the option, writes do nothing.
class StatusFile {
 public:
  static Result<StatusFile> open(const std::optional<std::string>& path) {
    StatusFile f;
    if (path) {
      // O_NONBLOCK and a regular file only: a FIFO a job left at the path (the working root
      // is the job's) hung every later run before its spawn (found by a review, session 29).
      // Truncated once it is known to be a regular file (O_TRUNC would act on what is refused).
      auto opened = sys::openat2_fd(AT_FDCWD, *path, O_WRONLY | O_CREAT | O_NONBLOCK,
                                    RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS, 0644);
      auto not_a_file = [&] {
        return refusal("--json-status `{}` is not a regular file; give the path of a file", *path);
      };
      if (!opened && opened.error().sys_errno() == ENXIO) {  // a FIFO nobody reads
        return not_a_file();
      }
      CORDON_TRY_CTX(fd, std::move(opened), "--json-status");
      CORDON_TRY_CTX(st, sys::fstat_fd(fd.get()), "--json-status");
      if (!S_ISREG(st.st_mode)) {
        return not_a_file();
      }
      if (::ftruncate(fd.get(), 0) != 0) {
        return sys_error("--json-status: ftruncate `{}`", *path);
      }
      f.fd_ = std::move(fd);
    }
    return f;
  }
  // A write that fails is said on stderr: the file then does not hold this run's outcome.
  void write(const json& j) const {
    if (!fd_) {
      return;
    }
    std::string text = json_fields::dump(j, 2) + "\n";
    if (::ftruncate(fd_.get(), 0) != 0) {
      warn_unwritten("ftruncate", errno);
      return;
    }
    for (size_t done = 0; done < text.size();) {
      ssize_t w =
          ::pwrite(fd_.get(), text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (w < 0 && errno == EINTR) {
        continue;
      }
      if (w <= 0) {
        warn_unwritten("pwrite", w < 0 ? errno : EIO);
        return;
      }
      done += static_cast<size_t>(w);
    }
  }

 private:
  static void warn_unwritten(const char* syscall, int err) {
    std::fprintf(stderr,
                 "cordon: warning: --json-status: %s: %s; the file does not hold this "
                 "run's outcome\n",
                 syscall, errno_name(err).c_str());
  }
  UniqueFd fd_;
};

// The --json-status outcome of a refused run.
json refused_outcome(const std::string& message) {
  return {{"state", "refused"}, {"message", message}, {"exitCode", nullptr}};
}

// A refusal of `cordon run` before its command runs: said on stderr and, with --json-status,
// written there as the outcome, so a refused run never leaves an earlier run's outcome in the
// file for a caller to read as this one's.
int refuse_run(const RunArgs& a, const std::string& msg, int code = kExitRefused) {
  if (a.json_status) {
    auto status = StatusFile::open(a.json_status);
    if (!status) {
      refuse(status.error().message());
    } else {
      status->write(refused_outcome(msg));
    }
  }
  return refuse(msg, code);
}

// The exit code of an outcome the standalone and the daemon run name alike, or nullopt for the
// ones each reads its own way (a setup failure, a refusal).
std::optional<int> exit_code_of(const std::string& state, int exit_code, int signal) {
  if (state == "exited") {
    return exit_code;
  }
  if (state == "killed") {
    return 128 + signal;
  }
  if (state == "timeout") {
    return kExitTimeout;
  }
  if (state == "oom") {
    return kExitOom;
  }
  if (state == "output-limit") {
    return kExitOutputLimit;
  }
  return std::nullopt;
}

int exit_code_for(const engine::OneshotReport& r) {
  if (auto code = exit_code_of(r.state, r.exit_code, r.term_signal)) {
    return *code;
  }
  if (r.state == "setup-failed" && r.setup_step == "command: exec") {
    return r.setup_errno == ENOENT ? kExitNotFound : kExitCannotExec;
  }
  return kExitRefused;
}

std::string absolute_path(const std::string& p) {
  char cwdbuf[PATH_MAX];
  if (p.empty() || p[0] == '/' || ::getcwd(cwdbuf, sizeof cwdbuf) == nullptr) {
    return normalize_path(p);
  }
  return normalize_path(std::string(cwdbuf) + "/" + p);
}

int run_main(const RunArgs& a) {
  // Everything a refusal can name is checked before anything is created.
  char cwdbuf[PATH_MAX];
  if (::getcwd(cwdbuf, sizeof cwdbuf) == nullptr) {
    return refuse_run(a, fmt::format("getcwd: {}", errno_name(errno)));
  }
  std::string here = cwdbuf;
  // Absolute and normalized before the guard checks them, and used so from here on: the guard
  // compared a normalized path while the run used the one given, so `link/../st` (the link
  // into the root) or a relative `--seccomp` escaped it (a review, session 29).
  std::string state_dir = absolute_path(a.state_dir.value_or(default_state_dir()));
  std::string bin_dir = exe_dir();
  std::string seccomp = absolute_path(a.seccomp.value_or(first_existing(
      {bin_dir + "/seccomp/default.json", bin_dir + "/../share/cordon/seccomp/default.json"})));
  std::string init =
      first_existing({bin_dir + "/cordon-init", bin_dir + "/../libexec/cordon/cordon-init"});
  std::vector<std::string> protected_paths = {state_dir, seccomp, init, bin_dir + "/cordon"};
  auto guard = policy::HostPathGuard::from_system(protected_paths);
  auto bound_root = policy::open_bind_path(a.root.value_or(here), O_DIRECTORY, "--root");
  if (!bound_root) {
    return refuse_run(a, bound_root.error().message());
  }
  const std::string root = bound_root->path;
  if (auto ok = guard.check(root, "--root"); !ok) {
    return refuse_run(a, ok.error().message());
  }

  engine::OneshotRequest req;
  sandbox::SandboxSpec& spec = req.spec;
  spec.root = root;
  std::string cwd;
  if (a.cwd) {
    cwd = (*a.cwd)[0] == '/' ? normalize_path(*a.cwd) : normalize_path(root + "/" + *a.cwd);
    if (!path_within(cwd, root)) {
      return refuse_run(a,
                        fmt::format("--cwd `{}` is not inside the working root `{}`", cwd, root));
    }
  } else {
    cwd = path_within(here, root) ? here : root;
  }
  spec.cwd = cwd;
  for (const auto& ro : a.ro) {
    // A directory or a single file.
    auto r = policy::open_bind_path(ro, 0, "--ro");
    if (!r) {
      return refuse_run(a, r.error().message());
    }
    const std::string resolved = r->path;
    if (auto ok = guard.check(resolved, "--ro"); !ok) {
      return refuse_run(a, ok.error().message());
    }
    spec.read_only_paths.push_back(resolved);
  }
  if (a.argv.empty()) {
    return refuse_run(
        a, "nothing to run: give the program after `--`, e.g. `cordon run -- /usr/bin/make`");
  }
  auto prog = resolve_program(a.argv[0], cwd);
  if (!prog) {
    return refuse_run(a, prog.error().message());
  }
  spec.argv = a.argv;
  spec.argv[0] = *prog;
  if (a.network == "none") {
    spec.network = sandbox::NetworkMode::kNone;
  } else if (a.network == "host") {
    spec.network = sandbox::NetworkMode::kHost;
  } else {
    return refuse_run(a, fmt::format("--network must be `none` or `host`, not `{}`", a.network));
  }
  spec.inside_uid = a.user;
  spec.inside_gid = a.user;
  spec.tty = a.tty;
  spec.allow_ptrace = a.allow_ptrace;
  spec.allow_netlink_route = a.allow_netlink;

  // The environment: a minimal safe one; nothing else of ours leaks in.
  std::vector<std::pair<std::string, std::string>> env = {
      {"PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"},
      {"HOME", "/tmp/home"},
      {"LANG", "C.UTF-8"},
      {"TERM", ::getenv("TERM") ? ::getenv("TERM") : "dumb"},
  };
  if (auto ok = add_requested_env(a, env); !ok) {
    return refuse_run(a, ok.error().message());
  }
  for (const auto& [k, v] : env) {
    spec.env.push_back(k + "=" + v);
  }

#ifdef CORDON_TEST_WALLS
  for (const auto& w : a.test_disable_walls) {
    auto wall = wall_by_name(w);
    if (!wall) {
      return refuse_run(a, fmt::format("unknown wall `{}`", w));
    }
    spec.disabled_walls |= static_cast<uint32_t>(*wall);
  }
#else
  (void)wall_by_name;
#endif

  long ncpu = ::sysconf(_SC_NPROCESSORS_ONLN);
  req.memory_bytes = a.memory.value_or(2ULL << 30);
  req.pids = a.pids.value_or(1024);
  req.cpus = a.cpus.value_or(std::max(1.0, static_cast<double>(ncpu > 0 ? ncpu : 2) / 2));
  if (req.memory_bytes < (8ULL << 20)) {
    return refuse_run(a, "--memory must be at least 8M");
  }
  // As the policy's bounds: init and the command are two processes, and the kernel's
  // PID_MAX_LIMIT; an output cap of 0 read as "no cap".
  if (req.pids < 2 || req.pids > 4194304) {
    return refuse_run(a, "--pids must be 2 to 4194304 (cordon-init and the command are two)");
  }
  if (req.cpus <= 0) {
    return refuse_run(a, "--cpus must be positive");
  }
  if (!seconds_fit(a.timeout_s) || !seconds_fit(a.grace_s)) {
    return refuse_run(a, "--timeout and --kill-grace must be at most 1000000000 seconds");
  }
  req.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s.value_or(3600) * 1000));
  req.kill_grace = std::chrono::milliseconds(static_cast<int64_t>(a.grace_s.value_or(5) * 1000));
  if (req.timeout.count() <= 0) {
    return refuse_run(a, "--timeout must be positive");
  }
  req.max_output_bytes = a.max_output.value_or(1ULL << 30);
  if (req.max_output_bytes < 1 || req.max_output_bytes > (1ULL << 40)) {
    return refuse_run(a, "--max-output must be 1 to 1T bytes per stream (0 is not \"no cap\")");
  }
  spec.tmp_size_bytes = std::min<uint64_t>(req.memory_bytes, 1ULL << 30);
  if (a.host_ids) {
    auto parts = split(*a.host_ids, ':');
    auto start = parts.size() == 2 ? parse_uint(parts[0]) : std::nullopt;
    auto count = parts.size() == 2 ? parse_uint(parts[1]) : std::nullopt;
    if (!start || !count || !sandbox::check_host_id_range(*start, *count)) {
      return refuse_run(a,
                        "--host-ids must be START:COUNT with START >= 65536 and the range below "
                        "4294967294, e.g. 1879048192:65536");
    }
    req.host_id_base = static_cast<uid_t>(*start);
    req.host_id_count = static_cast<uid_t>(*count);
  }
  req.seccomp_profile_path = seccomp;
  req.init_path = init;
  req.state_dir = state_dir;
  if (::mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return refuse_run(a,
                      fmt::format("create the state dir `{}`: {}", state_dir, errno_name(errno)));
  }

  // --json-status is opened before the spawn, refusing symlinks anywhere in its path.
  auto status_file = StatusFile::open(a.json_status);
  if (!status_file) {
    return refuse(status_file.error().message());
  }

  bool stdin_tty = ::isatty(STDIN_FILENO) != 0;
  if (a.tty) {
    if (!stdin_tty) {
      return refuse_run(a, "--tty needs a terminal on stdin");
    }
    req.terminal_fd = STDIN_FILENO;
    // The pty is made at the caller's size: the supervisor copies the size again once it has
    // the master, but the command may have read it by then (`stty size` printed the default
    // `30 120` in 5 of 60 runs). Should the ioctl fail, the default 120x30 stays.
    winsize ws{};
    if (::ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0) {
      spec.tty_cols = ws.ws_col;
      spec.tty_rows = ws.ws_row;
    }
  } else {
    req.stdin_fd = stdin_tty ? -1 : STDIN_FILENO;
  }

  auto report = engine::run_oneshot(req);
  auto write_status = [&](const json& j) { status_file->write(j); };
  if (!report) {
    const Error& e = report.error();
    int code = kExitRefused;
    if (e.code() == ErrorCode::kNotFound) {
      code = kExitNotFound;
    } else if (e.code() == ErrorCode::kRefused && e.sys_errno() == EACCES) {
      code = kExitCannotExec;
    }
    write_status(refused_outcome(e.message()));
    return refuse(e.message(), code);
  }
  write_status(status_json(*report, req));
  for (const auto& w : report->applied.warnings) {
    say("warning: ", w);
  }
  if (!report->message.empty() && report->state != "exited" && report->state != "killed") {
    say("", report->message);
  }
  return exit_code_for(*report);
}

// `cordon run --socket PATH`: the same command through a running daemon, so it starts in a
// sandbox from the daemon's warm pool. The daemon's policy shapes that sandbox, so an option
// that would shape it here is refused, naming where to set it. The connection's session is
// unnamed: if cordon dies, the daemon kills the command (as the standalone run's sandbox dies
// with it). stdout and stderr are copied byte for byte as they grow; the exit code is mapped
// as the standalone run's.
int run_via_daemon(const RunArgs& a) {
  static const std::map<std::string, std::string> kShapes = {
      {"--root", "cwdRoot"},
      {"--ro", "readOnlyPaths"},
      {"--network", "network"},
      {"--memory", "limits"},
      {"--pids", "limits"},
      {"--cpus", "limits"},
      {"--kill-grace", "timeouts"},
      {"--max-output", "limits"},
      {"--seccomp", "its seccomp"},
      {"--user", "its user"},
      {"--host-ids", "its host ids"},
      {"--state-dir", "its state dir"},
      {"--allow-ptrace", "its walls"},
      {"--allow-netlink", "allowNetlinkRoute"},
      {"--test-disable-wall", "its walls"}};
  for (const auto& opt : a.given) {
    if (auto it = kShapes.find(opt); it != kShapes.end()) {
      return refuse_run(
          a, fmt::format(
                 "`{}` cannot be used with --socket: the daemon's policy shapes its sandboxes (set "
                 "{} there), or run without --socket for a sandbox of this command's own",
                 opt, it->second));
    }
  }
  if (a.tty) {
    return refuse_run(
        a,
        "--tty cannot be used with --socket: run without --socket, or use `cordon start --pty` "
        "and `cordon write`");
  }
  if (a.argv.empty()) {
    return refuse_run(a,
                      "give the program after `--`, e.g. `cordon run --socket S -- /usr/bin/make`");
  }
  char cwdbuf[PATH_MAX];
  if (::getcwd(cwdbuf, sizeof cwdbuf) == nullptr) {
    return refuse_run(a, fmt::format("getcwd: {}", errno_name(errno)));
  }
  const std::string here = cwdbuf;
  const std::string cwd = !a.cwd               ? here
                          : (*a.cwd)[0] == '/' ? normalize_path(*a.cwd)
                                               : normalize_path(here + "/" + *a.cwd);
  auto program = resolve_program(a.argv[0], cwd);
  if (!program) {
    return refuse_run(
        a, program.error().message(),
        program.error().code() == ErrorCode::kNotFound ? kExitNotFound : kExitRefused);
  }
  // The daemon's tools carry text, not a byte stream: input waiting on stdin would be lost.
  if (::isatty(STDIN_FILENO) == 0) {
    int pending = 0;
    if (::ioctl(STDIN_FILENO, FIONREAD, &pending) == 0 && pending > 0) {
      return refuse_run(
          a,
          "stdin has input, which --socket cannot pass on (the command's stdin is empty): run "
          "without --socket to pipe input into the command");
    }
  }
  json args = {{"argv", a.argv}, {"cwd", cwd}};
  args["argv"][0] = *program;
  if (!seconds_fit(a.timeout_s)) {
    return refuse_run(a, "--timeout must be at most 1000000000 seconds");
  }
  // As the standalone run: not positive is refused (it was sent as a 1 ms timeout).
  if (a.timeout_s && !(*a.timeout_s > 0)) {
    return refuse_run(a, "--timeout must be positive");
  }
  if (a.timeout_s) {
    args["timeoutMs"] = static_cast<uint64_t>(std::max(1.0, *a.timeout_s * 1000));
  }
  // As the standalone run; the daemon then applies its policy's environment rules.
  std::vector<std::pair<std::string, std::string>> env;
  if (auto ok = add_requested_env(a, env); !ok) {
    return refuse_run(a, ok.error().message());
  }
  for (const auto& [k, v] : env) {
    args["env"][k] = v;
  }
  // Before connecting: what JSON cannot carry would reach the command changed.
  if (!a.cwd && first_invalid_utf8(cwd)) {
    return refuse_run(
        a, fmt::format(
               "the current directory `{}` (the default --cwd) is not UTF-8, and the daemon's JSON "
               "carries only text; run without --socket, which passes bytes as given",
               cwd));
  }
  if (auto text = check_text_arguments(args); !text) {
    return refuse_run(a, text.error().message());
  }
  auto status_file = StatusFile::open(a.json_status);
  if (!status_file) {
    return refuse(status_file.error().message());
  }
  auto write_status = [&](const json& j) { status_file->write(j); };
  // Every refusal from here on is also the --json-status outcome, as in the standalone run.
  auto refuse_with_status = [&](const std::string& msg) {
    write_status(refused_outcome(msg));
    return refuse(msg);
  };

  namespace jf = json_fields;
  auto client = DaemonClient::connect(*a.socket, "");
  if (!client) {
    return refuse_with_status(fmt::format("{}; or run without --socket", client.error().message()));
  }
  // A tool's answer, or its refusal as an error (the daemon's message says what to do). A
  // job that could not start is an error result too, but carries the job's settled status:
  // that is an outcome, mapped to an exit code below like any other.
  auto call = [&](const std::string& tool, const json& arguments) -> Result<json> {
    CORDON_TRY(r, client->call(tool, arguments));
    json sc = jf::object(r, "structuredContent");
    if (!jf::boolean(r, "isError") || (sc.contains("taskId") && sc.contains("state"))) {
      return sc;
    }
    const json content = jf::array(r, "content");
    std::string first = content.empty() ? "" : jf::str(content[0], "text");
    return refusal("{}", jf::str(jf::object(sc, "error"), "message", first));
  };
  // Started and waited for a quarter second in one call (its answer carries the tails of a
  // settled job's output too, which the copy below does not use: it pages the bytes).
  // Failure fixed (a review, session 23): --json-status got those tails and a hint when the
  // job settled within the quarter second, and command_status's answer otherwise.
  args["yieldMs"] = 250;
  auto started = call("run_command", args);
  if (!started) {
    return refuse_with_status(started.error().message());
  }
  const std::string task = jf::str(*started, "taskId");
  // The status as command_status words it: run_command adds the tails of a settled job's
  // output and a hint naming this connection's session, which --json-status does not get.
  started->erase("output");
  started->erase("hint");
  // Copies what is new in one stream to `fd`, page by page until the daemon has no more now.
  struct Copied {
    uint64_t offset = 0;
  } out, err;
  auto copy_new = [&](const char* stream, Copied& c, int fd) -> Result<void> {
    for (;;) {
      CORDON_TRY(page, call("command_output", {{"taskId", task},
                                               {"stream", stream},
                                               {"unit", "bytes"},
                                               {"offset", c.offset},
                                               {"limit", kMaxPageLimit}}));
      auto bytes = base64_decode(jf::str(page, "content"));
      if (!bytes || jf::u64(page, "offset") != c.offset) {
        return invalid("the daemon sent a malformed page of {}", stream);
      }
      for (size_t done = 0; done < bytes->size();) {
        ssize_t w = ::write(fd, bytes->data() + done, bytes->size() - done);
        if (w < 0 && errno == EINTR) {
          continue;
        }
        if (w <= 0) {
          return errno_error(w < 0 ? errno : EIO, "write the command's {} to cordon's own", stream);
        }
        done += static_cast<size_t>(w);
      }
      c.offset += bytes->size();
      if (!jf::boolean(page, "hasMore") || bytes->empty()) {
        return {};
      }
    }
  };
  // Wait a quarter second at a time for the settle, copying what each stream gained meanwhile
  // (a job that printed nothing costs no page call).
  json status = *started;
  for (;;) {
    if (!jf::boolean(status, "settled")) {
      auto next = call("command_status", {{"taskId", task}, {"waitMs", 250}});
      if (!next) {
        return refuse_with_status(next.error().message());
      }
      status = std::move(*next);
    }
    const bool settled = jf::boolean(status, "settled");
    for (auto [stream, copied, fd] :
         {std::tuple{"stdout", &out, STDOUT_FILENO}, std::tuple{"stderr", &err, STDERR_FILENO}}) {
      const uint64_t total = jf::u64(status, std::string(stream) + "Bytes");
      if (total <= copied->offset) {
        continue;
      }
      auto ok = copy_new(stream, *copied, fd);
      if (!ok && (ok.error().sys_errno() == EPIPE || ok.error().sys_errno() == ECONNRESET)) {
        // The reader went away (`cordon run --socket … | head`): cordon ends as a pipeline's
        // writer does, with SIGPIPE's code and no message, and the daemon ends the job with
        // this connection (its unnamed session). Before (session 35, found beside the
        // standalone run's fix): exit 125 and "write … EPIPE" on stderr.
        json gone = status;
        gone["message"] = fmt::format(
            "the reader of cordon's {} went away; the daemon ends the job with this run's "
            "connection",
            stream);
        write_status(gone);
        return 128 + SIGPIPE;
      }
      if (!ok) {
        return refuse_with_status(
            fmt::format("{} (task {}, the daemon's unnamed session; its output is banked there)",
                        ok.error().message(), task));
      }
      // Once settled the stream is final: all of it must have come, or the run says so.
      if (settled && copied->offset != total) {
        return refuse_with_status(
            fmt::format("the daemon sent {} of the {} bytes of {} (task {}): the output is "
                        "incomplete",
                        copied->offset, total, stream, task));
      }
    }
    if (settled) {
      break;
    }
  }
  write_status(status);
  // All of its output is copied and its outcome told: the job goes with the connection. It
  // lives in the daemon's unnamed session of this connection, which no client can name again,
  // and the daemon ends that session, records and all, when the connection closes
  // (daemon.cpp, serve_connection). Failure fixed (a review, session 12): every run left its
  // record there, and the daemon refused every start after 10000 runs. Until session 23 the
  // run also removed its job itself and waited for the answer: 1–3 ms of every run here.
  const std::string state = jf::str(status, "state");
  const std::string message = jf::str(status, "message");
  if (!message.empty() && state != "exited" && state != "killed") {
    say("", message);
  }
  // "SIGTERM", or the number itself for a signal without a name (real-time ones).
  int signal = SIGKILL;
  const std::string sig = jf::str(status, "signal");
  for (int n = 1; n < NSIG; ++n) {
    const char* abbrev = sigabbrev_np(n);
    if ((abbrev != nullptr && sig == std::string("SIG") + abbrev) || sig == std::to_string(n)) {
      signal = n;
      break;
    }
  }
  if (auto code =
          exit_code_of(state, static_cast<int>(jf::u64(status, "exitCode") & 0xFF), signal)) {
    return *code;
  }
  // The tools carry no structured cause, only the message (engine.cpp words both).
  if (state == "failed" && (message.find("command: exec: ENOENT") != std::string::npos ||
                            message.find("does not exist on this host") != std::string::npos)) {
    return kExitNotFound;
  }
  if (state == "failed" && message.find("command: exec:") != std::string::npos) {
    return kExitCannotExec;
  }
  return kExitRefused;
}

template <class T>
bool take(int& i, int argc, char** argv, T& out, const char* name, std::string& err,
          std::optional<T> (*parse)(std::string_view)) {
  if (i + 1 >= argc) {
    err = fmt::format("{} needs a value", name);
    return false;
  }
  auto v = parse(argv[++i]);
  if (!v) {
    err = fmt::format("{}: `{}` is not a valid value", name, argv[i]);
    return false;
  }
  out = *v;
  return true;
}

std::optional<std::string> as_string(std::string_view s) { return std::string(s); }

int parse_run(int argc, char** argv) {
  RunArgs a;
  std::string err;
  int i = 2;
  for (; i < argc; ++i) {
    std::string opt = argv[i];
    auto str = [&](std::optional<std::string>& out) {
      std::string v;
      if (!take<std::string>(i, argc, argv, v, opt.c_str(), err, as_string)) {
        return false;
      }
      out = v;
      return true;
    };
    auto push = [&](std::vector<std::string>& out) {
      std::string v;
      if (!take<std::string>(i, argc, argv, v, opt.c_str(), err, as_string)) {
        return false;
      }
      out.push_back(v);
      return true;
    };
    auto size = [&](std::optional<uint64_t>& out) {
      uint64_t v;
      if (!take<uint64_t>(i, argc, argv, v, opt.c_str(), err, parse_size)) {
        return false;
      }
      out = v;
      return true;
    };
    auto dec = [&](std::optional<double>& out) {
      double v;
      if (!take<double>(i, argc, argv, v, opt.c_str(), err, parse_decimal)) {
        return false;
      }
      out = v;
      return true;
    };
    bool ok = true;
    if (!opt.empty() && opt[0] == '-' && opt != "--") {
      a.given.push_back(opt);
    }
    if (opt == "--") {
      ++i;
      break;
    } else if (opt == "--socket") {
      ok = str(a.socket);
    } else if (opt == "--root") {
      ok = str(a.root);
    } else if (opt == "--cwd") {
      ok = str(a.cwd);
    } else if (opt == "--ro") {
      ok = push(a.ro);
    } else if (opt == "--network") {
      std::optional<std::string> n;
      ok = str(n);
      if (ok) a.network = *n;
    } else if (opt == "--memory") {
      ok = size(a.memory);
    } else if (opt == "--pids") {
      ok = size(a.pids);
    } else if (opt == "--cpus") {
      ok = dec(a.cpus);
    } else if (opt == "--timeout") {
      ok = dec(a.timeout_s);
    } else if (opt == "--kill-grace") {
      ok = dec(a.grace_s);
    } else if (opt == "--max-output") {
      ok = size(a.max_output);
    } else if (opt == "--env") {
      ok = push(a.env);
    } else if (opt == "--pass-env") {
      ok = push(a.pass_env);
    } else if (opt == "--seccomp") {
      ok = str(a.seccomp);
    } else if (opt == "--user") {
      uint64_t u;
      ok = take<uint64_t>(i, argc, argv, u, "--user", err, parse_uint);
      if (ok && u > 65533) {
        err = "--user must be below 65534";
        ok = false;
      }
      a.user = static_cast<uint32_t>(u);
    } else if (opt == "--json-status") {
      ok = str(a.json_status);
    } else if (opt == "--state-dir") {
      ok = str(a.state_dir);
    } else if (opt == "--host-ids") {
      ok = str(a.host_ids);
    } else if (opt == "--tty") {
      a.tty = true;
    } else if (opt == "--allow-ptrace") {
      a.allow_ptrace = true;
    } else if (opt == "--allow-netlink") {
      a.allow_netlink = true;
#ifdef CORDON_TEST_WALLS
    } else if (opt == "--test-disable-wall") {
      ok = push(a.test_disable_walls);
#endif
    } else if (opt == "-h" || opt == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!opt.empty() && opt[0] == '-') {
      return refuse_run(a, fmt::format("unknown option `{}` (see `cordon run --help`)", opt));
    } else {
      break;
    }
    if (!ok) {
      return refuse_run(a, err);
    }
  }
  for (; i < argc; ++i) {
    a.argv.emplace_back(argv[i]);
  }
  return a.socket ? run_via_daemon(a) : run_main(a);
}

// Options shared by `cordon mcp` and `cordon daemon`.
struct ServerArgs {
  std::optional<std::string> policy, state_dir, connect, socket;
  std::string session = "default";
  std::vector<uid_t> allow_uids;
};

std::optional<int> parse_server_args(int argc, char** argv, const char* cmd, bool daemon,
                                     ServerArgs& a) {
  for (int i = 2; i < argc; ++i) {
    std::string opt = argv[i];
    bool takes_value = opt == "--policy" || opt == "--state-dir" ||
                       (!daemon && (opt == "--session" || opt == "--connect")) ||
                       (daemon && (opt == "--socket" || opt == "--allow-uid"));
    if (takes_value && i + 1 >= argc) {
      return refuse(fmt::format("{}: {} needs a value", cmd, opt), 2);
    }
    if (opt == "-h" || opt == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (!takes_value) {
      return refuse(fmt::format("{}: unknown argument `{}` (see `cordon --help`)", cmd, opt), 2);
    }
    std::string v = argv[++i];
    if (opt == "--policy") {
      a.policy = v;
    } else if (opt == "--state-dir") {
      a.state_dir = v;
    } else if (opt == "--session") {
      a.session = v;
    } else if (opt == "--connect") {
      a.connect = v;
    } else if (opt == "--socket") {
      a.socket = v;
    } else if (opt == "--allow-uid") {
      auto uid = parse_uint(v);
      if (!uid || *uid >= 0xFFFFFFFFULL) {
        return refuse(fmt::format("{}: --allow-uid `{}` is not a uid", cmd, v), 2);
      }
      a.allow_uids.push_back(static_cast<uid_t>(*uid));
    }
  }
  return std::nullopt;
}

// The engine's files next to this binary (build tree) or in the installed layout.
std::optional<int> engine_options(const ServerArgs& a, const char* cmd, EngineOptions& e) {
  if (!a.policy) {
    return refuse(fmt::format("{}: --policy FILE is required: it lists the executables and the "
                              "working root the agent may use (docs/policy.md)",
                              cmd),
                  2);
  }
  e.policy_path = absolute_path(*a.policy);
  e.state_dir = absolute_path(a.state_dir.value_or(default_state_dir()));
  std::string bin_dir = exe_dir();
  e.spawner_path =
      first_existing({bin_dir + "/cordon-spawner", bin_dir + "/../libexec/cordon/cordon-spawner"});
  e.init_path =
      first_existing({bin_dir + "/cordon-init", bin_dir + "/../libexec/cordon/cordon-init"});
  e.default_seccomp_profile = first_existing(
      {bin_dir + "/seccomp/default.json", bin_dir + "/../share/cordon/seccomp/default.json"});
  if (::mkdir(e.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return refuse(fmt::format("create the state dir `{}`: {}", e.state_dir, errno_name(errno)));
  }
  return std::nullopt;
}

int mcp_command(int argc, char** argv) {
  ServerArgs a;
  if (auto code = parse_server_args(argc, argv, "mcp", false, a)) {
    return *code;
  }
  if (a.connect) {
    if (!a.session.empty() && !valid_session(a.session)) {
      return refuse(
          fmt::format("mcp: --session `{}` is no session name: {}", a.session, kSessionNameRule),
          2);
    }
    // A thin front for a running daemon: its jobs outlive this process and the agent's.
    return run_mcp_connect(*a.connect, a.session);
  }
  // The state dir may later be a daemon's, which ends every session of its unnamed form at
  // its start: such a name here would lose its jobs then.
  if (!valid_session(a.session)) {
    return refuse(
        fmt::format("mcp: --session `{}` is no session name: {}", a.session, kSessionNameRule), 2);
  }
  if (is_connection_session(a.session)) {
    return refuse(fmt::format("mcp: --session `{}` has the form `u<uid>.conn-<16 hex digits>` a "
                              "daemon gives the session of a connection without a handshake, and "
                              "a daemon started on this state dir would end it, jobs and all: "
                              "pick another name",
                              a.session),
                  2);
  }
  McpOptions o;
  o.session = a.session;
  if (auto code = engine_options(a, "mcp", o.engine)) {
    return *code;
  }
  // The protocol gets private copies of stdin and stdout; fd 0 becomes /dev/null and fd 1 a
  // copy of stderr, so nothing else in this process or a helper it starts (the spawner) can
  // read a request or write a stray byte into the protocol stream.
  int in = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  int out = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (in < 0 || out < 0) {
    return refuse(fmt::format("fcntl F_DUPFD_CLOEXEC stdin/stdout: {}", errno_name(errno)));
  }
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null < 0 || ::dup2(null, STDIN_FILENO) < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    return refuse(fmt::format("redirect stdin/stdout: {}", errno_name(errno)));
  }
  ::close(null);
  o.in_fd = in;
  o.out_fd = out;
  return run_mcp_server(o);
}

int daemon_command(int argc, char** argv) {
  ServerArgs a;
  if (auto code = parse_server_args(argc, argv, "daemon", true, a)) {
    return *code;
  }
  DaemonOptions o;
  if (auto code = engine_options(a, "daemon", o.engine)) {
    return *code;
  }
  o.socket_path = a.socket ? absolute_path(*a.socket) : "";
  o.allowed_uids = a.allow_uids;
  return run_daemon(o);
}

// `cordon start|status|wait|output|kill|write|list|rm`: one tool call each through a running
// `cordon serve`. Human output by default, --json for scripts. Exit codes: 0 done, 1 the tool
// refused or failed (its message on stderr), 2 usage, 3 the daemon could not be reached.
int client_command(const std::string& cmd, int argc, char** argv) {
  std::string socket = default_state_dir() + "/daemon.sock";
  std::string session = "default";
  bool as_json = false, follow = false, raw = false;
  json args = json::object();
  std::vector<std::string> positional;
  auto usage = [&](const std::string& why) {
    return refuse(fmt::format("{}: {} (see docs/cli.md)", cmd, why), 2);
  };
  int i = 2;
  for (; i < argc; ++i) {
    std::string opt = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) {
        return std::nullopt;
      }
      return std::string(argv[++i]);
    };
    // What a value that is there but does not parse is: said by the check below.
    std::optional<std::string> invalid;
    auto number = [&](const char* key) -> bool {
      auto v = value();
      auto n = v ? parse_uint(*v) : std::nullopt;
      if (!n) {
        if (v) {
          invalid = *v;
        }
        return false;
      }
      args[key] = *n;
      return true;
    };
    auto text = [&](const char* key) -> bool {
      auto v = value();
      if (!v) {
        return false;
      }
      args[key] = *v;
      return true;
    };
    bool ok = true;
    if (opt == "--") {
      ++i;
      break;
    } else if (opt == "--socket") {
      auto v = value();
      ok = v.has_value();
      socket = v.value_or("");
    } else if (opt == "--session") {
      auto v = value();
      ok = v.has_value();
      session = v.value_or("");
    } else if (opt == "--json") {
      as_json = true;
    } else if (opt == "-f" || opt == "--follow") {
      follow = true;
    } else if (opt == "--raw") {
      raw = true;
    } else if (opt == "--all") {
      args["mode"] = "all";
    } else if (opt == "--pty") {
      args["pty"] = true;
    } else if (opt == "--eof") {
      args["eof"] = true;
    } else if (opt == "--submit") {
      args["submit"] = true;
    } else if (opt == "--key") {
      auto v = value();
      ok = v.has_value();
      args["keys"].push_back(v.value_or(""));
    } else if (opt == "--cwd" || opt == "--label" || opt == "--stdin" || opt == "--stream" ||
               opt == "--unit" || opt == "--state" || opt == "--data" || opt == "--signal") {
      ok = text(opt.c_str() + 2);
    } else if (opt == "--timeout-ms" || opt == "--wait-ms" || opt == "--offset" ||
               opt == "--limit" || opt == "--cols" || opt == "--rows") {
      static const std::map<std::string, const char*> kKeys = {
          {"--timeout-ms", "timeoutMs"}, {"--wait-ms", "waitMs"}, {"--offset", "offset"},
          {"--limit", "limit"},          {"--cols", "cols"},      {"--rows", "rows"}};
      ok = number(kKeys.at(opt));
    } else if (!opt.empty() && opt[0] == '-') {
      return usage(fmt::format("unknown option `{}`", opt));
    } else {
      positional.push_back(opt);
    }
    if (!ok && invalid) {
      static const std::map<std::string, const char*> kUnits = {{"--offset", "units"},
                                                                {"--limit", "units"},
                                                                {"--cols", "characters"},
                                                                {"--rows", "lines"}};
      auto unit = kUnits.find(opt);
      return usage(fmt::format("{}: `{}` is not a valid value (a whole number of {} is)", opt,
                               *invalid, unit == kUnits.end() ? "ms" : unit->second));
    }
    if (!ok) {
      return usage(fmt::format("{} needs a value", opt));
    }
  }
  for (; i < argc; ++i) {
    positional.emplace_back(argv[i]);
  }
  if (!valid_session(session)) {
    return usage(fmt::format("--session `{}` is no session name: {}", session, kSessionNameRule));
  }
  std::string tool;
  if (cmd == "start") {
    tool = "run_command_bg";
    if (positional.empty()) {
      return usage("give the program after `--`, e.g. `cordon start -- /usr/bin/make test`");
    }
    if ((args.contains("cols") || args.contains("rows")) && !args.contains("pty")) {
      return usage("--cols and --rows size a terminal: give --pty as well");
    }
    args["argv"] = positional;
  } else {
    static const std::map<std::string, std::string> kTools = {
        {"status", "command_status"}, {"wait", "command_wait"},    {"output", "command_output"},
        {"kill", "command_kill"},     {"write", "command_write"},  {"list", "command_list"},
        {"rm", "command_remove"},     {"resize", "command_resize"}};
    tool = kTools.at(cmd);
    if (cmd == "list") {
      if (!positional.empty()) {
        return usage("takes no task id");
      }
    } else if (cmd == "wait") {
      if (positional.empty()) {
        return usage("give one or more task ids");
      }
      args["taskIds"] = positional;
      if (!args.contains("timeoutMs")) {
        args["timeoutMs"] = 30000;
      }
    } else {
      if (positional.size() != 1) {
        return usage("give exactly one task id");
      }
      if (cmd == "resize" && (!args.contains("cols") || !args.contains("rows"))) {
        return usage("give the new size: `cordon resize TASK --cols N --rows N`");
      }
      args["taskId"] = positional[0];
    }
  }
  // Refused before connecting, as a refusal (1), not as a daemon out of reach (3).
  if (auto text = check_text_arguments(args); !text) {
    say("", text.error().message());
    return 1;
  }
  auto call = [&](const std::string& name, const json& a) -> std::optional<json> {
    auto r = call_daemon_tool(socket, session, name, a);
    if (!r) {
      say("", r.error().message());
      return std::nullopt;
    }
    return *r;
  };
  // Everything below reads the daemon's replies: peer data, read with its types checked.
  namespace jf = json_fields;
  auto failed = [](const json& r) {
    if (!jf::boolean(r, "isError")) {
      return false;
    }
    std::string msg;
    for (const auto& c : jf::array(r, "content")) {
      msg += jf::str(c, "text");
    }
    msg = jf::str(jf::object(jf::object(r, "structuredContent"), "error"), "message", msg);
    say("", msg);
    return true;
  };
  auto r = call(tool, args);
  if (!r) {
    return 3;
  }
  if (failed(*r)) {
    return 1;
  }
  json sc = jf::object(*r, "structuredContent");
  // `list` shows every job: command_list answers a page at a time, so read on while there
  // is a next page (one that does not move forward ends it: a daemon's reply, not trusted).
  // A page that answers the offset asked for (0 when none was) and ends past it; a review
  // (session 39): compared with the page's own `offset`, a daemon answering {offset 0,
  // nextOffset 10} to every call kept the loops below going for ever.
  auto moves_on = [&args](const json& page) {
    const json* next = jf::find(page, "nextOffset");
    const uint64_t asked = jf::u64(args, "offset");
    return next != nullptr && next->is_number_unsigned() && jf::u64(page, "offset") == asked &&
           next->get<uint64_t>() > asked;
  };
  if (cmd == "list") {
    json all = jf::array(sc, "jobs");
    while (moves_on(sc)) {
      const json* next = jf::find(sc, "nextOffset");
      args["offset"] = next->get<uint64_t>();
      args["limit"] = 500;
      auto more = call(tool, args);
      if (!more || failed(*more)) {
        return more ? 1 : 3;
      }
      sc = jf::object(*more, "structuredContent");
      for (const auto& j : jf::array(sc, "jobs")) {
        all.push_back(j);
      }
    }
    sc = {{"count", all.size()}, {"total", jf::u64(sc, "total")}, {"offset", 0}, {"jobs", all}};
  }
  // A page's bytes: `--unit bytes` pages come base64-encoded (JSON carries only text) and
  // are written decoded, as the command printed them.
  auto page_bytes = [](const json& page) -> std::optional<std::string> {
    std::string content = jf::str(page, "content");
    if (jf::str(page, "encoding") != "base64") {
      return content;
    }
    return base64_decode(content);
  };
  // The command's output on the operator's terminal is escaped as the status tail is (an OSC
  // 52 it printed would write the clipboard, a CSI forge lines); a CR before LF stays the line
  // end of a pty. To a pipe or a file, or with --raw, the bytes go as printed. Failure fixed (a
  // review, session 35): the terminal got them raw.
  // Pages are escaped as one text: a CR that ends a page and the first bytes of a UTF-8
  // character a page boundary cut wait for the next page (`carry`).
  const bool escape = !raw && ::isatty(STDOUT_FILENO) == 1;
  std::string carry;
  auto emit = [escape, &carry](const std::string& content, bool last) {
    if (!escape) {
      std::fwrite(content.data(), 1, content.size(), stdout);
      return;
    }
    std::string text = std::exchange(carry, {}) + content;
    size_t keep = last ? 0 : continued_tail(text);
    carry = text.substr(text.size() - keep);
    text.resize(text.size() - keep);
    std::string shown = for_terminal(text);
    std::fwrite(shown.data(), 1, shown.size(), stdout);
  };
  if (cmd == "output" && follow) {
    // Like tail -f: print what is there, then keep paging until the job settles.
    for (;;) {
      auto content = page_bytes(sc);
      if (!content) {
        std::fprintf(stderr, "cordon: output: the daemon sent a page that is not base64\n");
        return 3;
      }
      emit(*content, false);
      std::fflush(stdout);
      args["offset"] = jf::u64(sc, "nextOffset");
      if (!jf::boolean(sc, "hasMore")) {
        auto st = call("command_status", {{"taskId", args["taskId"]}, {"waitMs", 500}});
        if (!st || failed(*st)) {
          return st ? 1 : 3;
        }
        bool settled = jf::boolean(jf::object(*st, "structuredContent"), "settled");
        auto page = call(tool, args);
        if (!page || failed(*page)) {
          return page ? 1 : 3;
        }
        sc = jf::object(*page, "structuredContent");
        if (settled && !jf::boolean(sc, "hasMore") && jf::str(sc, "content").empty()) {
          emit("", true);
          return 0;
        }
        continue;
      }
      auto page = call(tool, args);
      if (!page || failed(*page)) {
        return page ? 1 : 3;
      }
      sc = jf::object(*page, "structuredContent");
    }
  }
  if (as_json) {
    std::printf("%s\n", sc.dump(2).c_str());
  } else if (cmd == "resize") {
    std::printf("%s  %llux%llu\n", jf::str(sc, "taskId").c_str(),
                static_cast<unsigned long long>(jf::u64(sc, "cols")),
                static_cast<unsigned long long>(jf::u64(sc, "rows")));
  } else if (cmd == "output") {
    // Without --limit, every page there is now, like cat: `cordon output T > log` printed the
    // first 50000 units alone and said nothing of the rest (a red-team review, session 39).
    // With --limit, the one page asked for, and stderr says where the next one starts.
    const bool one_page = args.contains("limit");
    for (;;) {
      auto content = page_bytes(sc);
      if (!content) {
        std::fprintf(stderr, "cordon: output: the daemon sent a page that is not base64\n");
        return 3;
      }
      const bool more = jf::boolean(sc, "hasMore");
      emit(*content, one_page || !more);
      if (!more) {
        break;
      }
      if (one_page) {
        std::fflush(stdout);
        std::fprintf(stderr, "cordon: output: more follows: --offset %llu\n",
                     static_cast<unsigned long long>(jf::u64(sc, "nextOffset")));
        break;
      }
      if (!moves_on(sc)) {
        // A daemon's reply, not trusted: a page that is not the one asked for, or does not
        // move forward, would be asked for again for ever.
        std::fprintf(stderr,
                     "cordon: output: the daemon's page for offset %llu does not move "
                     "forward; stopped there\n",
                     static_cast<unsigned long long>(jf::u64(args, "offset")));
        return 3;
      }
      args["offset"] = jf::u64(sc, "nextOffset");
      auto page = call(tool, args);
      if (!page || failed(*page)) {
        return page ? 1 : 3;
      }
      sc = jf::object(*page, "structuredContent");
    }
  } else {
    auto line = [](const json& j) {
      std::string out = jf::str(j, "taskId");
      out += "  " + jf::str(j, "state");
      if (const json* c = jf::find(j, "exitCode"); c != nullptr && c->is_number_integer()) {
        out += fmt::format(" (exit {})", c->get<int64_t>());
      }
      if (const json* s = jf::find(j, "signal"); s != nullptr && s->is_string()) {
        out += " (" + s->get<std::string>() + ")";
      }
      // The agent's argv on the operator's terminal: escaped, newlines and tabs too, so an
      // argv cannot set the title, clear the screen or forge lines of the listing (a review,
      // session 34: it was printed raw, while the tail below was escaped).
      for (const auto& a : jf::array(j, "argv")) {
        out += " " + escape_controls(a.is_string() ? a.get<std::string>() : a.dump(), "");
      }
      if (const json* n = jf::find(j, "argvOmitted"); n != nullptr && n->is_number_integer()) {
        out += fmt::format(" … ({} more)", n->get<int64_t>());
      }
      return out;
    };
    if (sc.contains("jobs")) {
      for (const auto& j : jf::array(sc, "jobs")) {
        std::printf("%s\n", line(j).c_str());
      }
    } else if (sc.contains("taskId")) {
      std::printf("%s\n", line(sc).c_str());
      // Failure fixed (session 13, a review): this read `tailPreview`, a field the tool does not
      // have, so the tail docs/cli.md promises never printed. It is the command's own output on
      // the operator's terminal: escaped, so an OSC 52 (clipboard) or title sequence the command
      // printed is shown, not obeyed.
      if (std::string tail = jf::str(sc, "tail"); !tail.empty() && cmd != "start") {
        // A pty's lines end in CRLF: the CR before each LF is the line end, not a control to
        // show (it printed `\x0d` at the end of every line of a pty job).
        tail = for_terminal(tail);
        std::printf("%s%s", tail.c_str(), tail.back() == '\n' ? "" : "\n");
      }
    }
  }
  // Failure fixed (a review, session 11): a wait that timed out exited 0, as if done.
  if (cmd == "wait" && !jf::boolean(sc, "done")) {
    return kExitWaitTimedOut;
  }
  return 0;
}

}  // namespace

int cli_main(int argc, char** argv) {
  // A standard descriptor the caller closed (`cordon run … >&-`) would be taken by cordon's
  // first open: the host-wide uid lease under /run, or --json-status, and the command's output
  // written into it (a review, session 35: 50 MB into the lease file; stderr over the status
  // JSON). Each closed one is /dev/null instead: what goes there is dropped, as the caller
  // asked by closing it.
  if (!sys::fill_closed_std_fds()) {
    return kExitRefused;  // no /dev/null: nothing safe to put there, and nowhere to say so
  }
  // The supervisor must see EPIPE on a closed stdout, not die of SIGPIPE mid-run.
  ::signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "run") {
    return parse_run(argc, argv);
  }
  if (cmd == "mcp" || cmd == "serve" || cmd == "daemon") {
    // A job's log past the file-size limit cordon was started under (`ulimit -f`) is a failed
    // write of that job (EFBIG, in its status), not SIGXFSZ for the engine and every job with
    // it (a review, session 35). Every sandbox's child sets every signal back to its default.
    ::signal(SIGXFSZ, SIG_IGN);
    return cmd == "mcp" ? mcp_command(argc, argv) : daemon_command(argc, argv);
  }
  if (cmd == "start" || cmd == "status" || cmd == "wait" || cmd == "output" || cmd == "kill" ||
      cmd == "write" || cmd == "list" || cmd == "rm" || cmd == "resize") {
    return client_command(cmd, argc, argv);
  }
  if (cmd == "doctor") {
    std::optional<std::string> state_dir;
    for (int i = 2; i < argc; ++i) {
      if (std::string(argv[i]) == "--state-dir" && i + 1 < argc) {
        state_dir = argv[++i];
      } else if (std::string(argv[i]) == "--json") {
        // handled by doctor_main
      } else {
        return refuse(fmt::format("doctor: unknown argument `{}`", argv[i]), 2);
      }
    }
    bool as_json = false;
    for (int i = 2; i < argc; ++i) {
      as_json = as_json || std::string(argv[i]) == "--json";
    }
    std::string bin_dir = exe_dir();
    std::string seccomp = first_existing(
        {bin_dir + "/seccomp/default.json", bin_dir + "/../share/cordon/seccomp/default.json"});
    return doctor_main(state_dir.value_or(default_state_dir()), seccomp, as_json);
  }
  if (cmd == "--version" || cmd == "version") {
    std::puts("cordon 0.1.0");
    return 0;
  }
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "cordon: unknown command `%s`\n%s", cmd.c_str(), kUsage);
  return 2;
}

}  // namespace cordon::api
