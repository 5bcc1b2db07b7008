#pragma once

// cordon's policy: the contract every command start is checked against before anything is
// spawned. The file format, defaults and bounds are documented in docs/policy.md and mirrored
// by docs/policy.schema.json; parse_policy() is the authority, the schema its twin for editors.
//
// Split by what touches the host: parse_policy() is pure (text → Policy); bind_policy()
// opens cwdRoot once, resolves it and the read-only paths and checks them with HostPathGuard;
// check_start() resolves a request's cwd beneath that root fd and re-verifies the executable
// on every start. The refusals are guidance with exact messages; the sandbox is the boundary.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"
#include "policy/host_paths.hpp"
#include "sandbox/spec.hpp"

namespace cordon::policy {

struct AllowedExecutable {
  std::string path;                   // absolute, normalised; matched exactly against argv[0]
  std::optional<std::string> sha256;  // lower-case hex pin of the file's content
};

/// A refusal for agents, NOT a security boundary: `git -C . push` slips past a prefix rule.
struct Rule {
  std::vector<std::string> argv_prefix;      // set for argvPrefix rules (non-empty)
  std::optional<std::string> argv_contains;  // set for argvContains rules: a whole element
  std::string refuse;                        // the whole refusal message, verbatim
};

struct Limits {
  uint64_t memory_bytes = 2ULL << 30;
  uint64_t pids = 1024;
  double cpus = 1.0;
};

struct EnvPolicy {
  std::map<std::string, std::string> set;  // fixed values; a request may not change them
  std::vector<std::string> pass;           // copied from the engine's environment when set
  // The names a request may set, exactly or by a trailing `*` (`CARGO_*`); unset: any name
  // but the refused ones (build_env). The refused ones stay refused either way.
  std::optional<std::vector<std::string>> request;
};

struct Concurrency {
  uint32_t per_session = 8;
  uint32_t total = 64;
  // Running jobs of one owner (a daemon's peer uid, all its sessions); 0: no bound but total.
  uint32_t per_uid = 0;
};

struct Quotas {
  uint64_t max_jobs = 10000;
  uint64_t max_disk_bytes = 10ULL << 30;
  // The same over all sessions of one owner (a daemon's peer uid); 0: only the engine-wide one.
  uint64_t max_jobs_per_uid = 0;
  uint64_t max_disk_bytes_per_uid = 0;
};

struct Retention {
  std::optional<uint64_t> max_jobs;
  std::optional<uint64_t> max_age_seconds;
  std::optional<uint64_t> max_disk_bytes;
};

// Read by `cordon serve` only: who may connect and how long a connection may sit idle.
struct DaemonPolicy {
  std::vector<uid_t> allowed_uids;     // besides root and the daemon's own uid
  uint64_t idle_timeout_ms = 3600000;  // no request and no call in flight; 0: never
  uint64_t stall_timeout_ms = 30000;   // a request line started and not finished
  uint32_t max_connections = 256;
  // One uid other than root and the daemon's own may hold at most this many (and the others
  // together never the last slot, kept for root): one user cannot lock the rest out.
  uint32_t max_connections_per_uid = 64;
  // Requests in flight over every connection of one such uid (each holds a thread and builds
  // its reply whole): one uid cannot take the daemon's memory or CPU.
  uint32_t max_calls_per_uid = 64;
};

/// The optional `git` section: the read-only git tools' repository and their bounds. The git
/// tools run under their own private policy derived from it (git_job_policy()), never under
/// the main one, so enabling them allows nothing new to run_command.
struct GitPolicy {
  std::string repo_root;  // as written (absolute, normalised)
  std::string binary = "/usr/bin/git";
  uint64_t timeout_ms = 30000;
  uint64_t max_output_bytes = 16ULL << 20;  // per stream
  uint64_t preview_chars = 4000;

  // Filled by bind_policy(): repoRoot opened once (O_PATH directory) and its resolved path.
  std::shared_ptr<const UniqueFd> root_fd;
  std::string root;
};

struct Policy {
  std::vector<AllowedExecutable> allowed_executables;
  std::string cwd_root;  // as written (absolute, normalised)
  // Each session works in cwdRoot/<session> (created on its first start): one session's job
  // cannot leave a Makefile or a hook that another session's job runs.
  bool root_per_session = false;
  uint64_t default_timeout_ms = 120000;
  uint64_t max_timeout_ms = 3600000;
  uint64_t kill_grace_ms = 5000;
  uint64_t max_output_bytes = 10ULL << 20;  // per stream
  Limits limits;
  sandbox::NetworkMode network = sandbox::NetworkMode::kNone;
  // NETLINK_ROUTE sockets (sandbox::SeccompOptions::allow_netlink_route); off by default.
  bool allow_netlink_route = false;
  std::vector<std::string> read_only_paths;  // as written; resolved by bind_policy()
  std::vector<std::string> mask_paths;       // under /etc
  EnvPolicy env;
  std::optional<std::string> seccomp_profile;  // unset: the shipped default profile
  uid_t run_as_uid = 1000;
  Concurrency concurrency;
  Quotas quotas;
  Retention retention;
  DaemonPolicy daemon;
  std::vector<Rule> rules;
  std::optional<GitPolicy> git;
  // Bind the working root read-only (mount flag and Landlock). Never set by a policy file:
  // only the private policy of the git tools has it.
  bool root_read_only = false;
  // Reads only beneath the system's program trees, the working root and the device nodes
  // (sandbox::SandboxSpec). Never set by a policy file: only the git tools' policy has it.
  bool reads_root_and_system_only = false;

  // Filled by bind_policy(): the root opened once (O_PATH directory) and the kernel's paths.
  // Shared so a Policy stays copyable; the fd is only ever read.
  std::shared_ptr<const UniqueFd> root_fd;
  std::string root;                                   // resolved cwdRoot
  std::vector<std::string> resolved_read_only_paths;  // resolved readOnlyPaths, same order
  // cwdRoot whole (resolved, as written, its fd), also in a rootPerSession copy, whose `root`
  // is its session's directory: what any job can write, for the checks of paths in it.
  std::string whole_root, whole_cwd_root;
  std::shared_ptr<const UniqueFd> whole_root_fd;
  // Of each readOnlyPaths entry, the device and inode bound when it lies inside the working
  // root, else {0, 0} (sandbox::SandboxSpec::read_only_ids): every start checks the path
  // still names them (a job can rename a directory above it), and the spawner binds only them.
  std::vector<std::pair<uint64_t, uint64_t>> read_only_ids;
};

/// The top-level keys parse_policy() accepts (the schema test compares against these).
const std::vector<std::string>& policy_keys();

/// Parses and validates policy JSON, filling defaults; touches no file. Errors are kInvalid
/// and read "policy: /limits/pids: expected a non-negative integer, got string".
[[nodiscard]] Result<Policy> parse_policy(std::string_view json_text);

/// Opens cwdRoot (O_PATH, no magic links) and keeps the fd in `policy`; resolves it and the
/// readOnlyPaths and refuses any of them that `guard` forbids. Errors name the path.
[[nodiscard]] Result<void> bind_policy(Policy& policy, const HostPathGuard& guard);

/// Reads `path`, parses it and binds it. The policy file itself is added to the guard's
/// protected paths: a working root containing it would let a job rewrite its own policy.
[[nodiscard]] Result<Policy> load_policy(const std::string& path, const HostPathGuard& guard);

/// What an operator should know of this policy on a host whose kernel gives `pid_max` pids and
/// `threads_max` tasks in all: jobs that each fork to limits.pids, concurrency.total of them,
/// could take three quarters or more of the host's pids (kernel.pid_max is 32768 on many
/// hosts; 64 jobs × 1024 is 65536), and then no host process could fork. Empty when nothing.
std::vector<std::string> host_warnings(const Policy& policy, uint64_t pid_max,
                                       uint64_t threads_max);
/// host_warnings() with this host's kernel.pid_max and kernel.threads-max (an unreadable one
/// is left out).
std::vector<std::string> host_warnings(const Policy& policy);

/// The private one-executable policy the git tools' jobs run under, derived from `main`'s git
/// section: only the git binary, repoRoot as the working root bound read-only, no network, a
/// fixed hardened environment (no config from the system or a home, no prompts, no optional
/// locks, no replace objects), the git timeout and output cap, and no rules. Limits, uid,
/// seccomp profile and masked paths are the main policy's. `main` must be bound and have a
/// git section (kInvalid otherwise).
[[nodiscard]] Result<Policy> git_job_policy(const Policy& main);

struct StartRequest {
  std::vector<std::string> argv;
  std::optional<std::string> cwd;  // absolute, or relative to cwdRoot; default cwdRoot
  std::optional<uint64_t> timeout_ms;
  std::map<std::string, std::string> env;
};

/// What the engine needs to build a sandbox::SandboxSpec, everything resolved and checked.
struct CheckedStart {
  std::vector<std::string> argv;
  std::string root;  // resolved cwdRoot
  bool root_read_only = false;
  bool reads_root_and_system_only = false;
  std::string cwd;    // resolved, inside root
  dev_t cwd_dev = 0;  // identity of the cwd that passed the check
  ino_t cwd_ino = 0;
  std::vector<std::string> env;  // NAME=VALUE, sorted by name
  uint64_t timeout_ms = 0;
  uint64_t kill_grace_ms = 0;
  uint64_t max_output_bytes = 0;
  Limits limits;
  sandbox::NetworkMode network = sandbox::NetworkMode::kNone;
  bool allow_netlink_route = false;
  std::vector<std::string> read_only_paths;  // resolved
  // Each one's (device, inode) as bound when the policy loaded, {0, 0} for one outside cwdRoot
  // (the spawner binds only that inode; policy.cpp, check_read_only_paths_in_root).
  std::vector<std::pair<uint64_t, uint64_t>> read_only_ids;
  std::vector<std::string> mask_paths;
  std::optional<std::string> seccomp_profile;
  uid_t run_as_uid = 1000;
  // The executable that passed the identity check: an O_PATH fd on it (pin this one; a
  // re-open by path could find a different file) and its identity.
  std::shared_ptr<const UniqueFd> executable_fd;
  dev_t executable_dev = 0;
  ino_t executable_ino = 0;
  std::optional<std::string> executable_sha256;  // set when the policy pins it
};

/// Checks one start against `policy` (nullptr: no policy, every start refused). Refusals are
/// kRefused with a message that says what to do instead; an allowlisted executable missing
/// from the host is kNotFound (the engine settles that start as `failed`).
[[nodiscard]] Result<CheckedStart> check_start(const Policy* policy, const StartRequest& request);

/// The SandboxSpec for a checked start (argv, env, root, cwd, paths, network, uid).
sandbox::SandboxSpec to_sandbox_spec(const CheckedStart& start);

}  // namespace cordon::policy
