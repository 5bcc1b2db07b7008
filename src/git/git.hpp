#pragma once

// The read-only git toolset on the engine: git_log, git_show, git_diff, git_blame,
// git_merge_base, git_ls_files (docs/git.md).
//
// Three layers of defence, none trusting the others:
//   1. values, never flags: every value is checked here (nothing starting with "-", refs
//      resolved to object ids inside the sandbox, paths normalised and kept inside repoRoot,
//      literal pathspecs), and each tool assembles a fixed argv with --end-of-options;
//   2. every call is hardened against the repository's own config (hardened_prefix(): no
//      pager, no external diff, textconv, fsmonitor, hooks, signature programs, protocols) in
//      a replaced environment (policy::git_job_policy);
//   3. every call is an engine job under the git tools' private policy: only the git
//      binary, the repository bound read-only, no network.
// Nothing is cached between calls: repoRoot may be an agent's working root, so its .git may
// change between two calls, and each call inspects and hardens afresh.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cordon/engine.hpp"
#include "cordon/error.hpp"

namespace cordon::git {

inline constexpr uint64_t kDefaultLogCount = 20;
inline constexpr uint64_t kMaxLogCount = 500;
inline constexpr uint64_t kMaxUnified = 50;
inline constexpr uint64_t kMaxLine = 10000000;
inline constexpr size_t kMaxValueChars = 4096;
inline constexpr uint64_t kStderrPreviewChars = 2000;

/// What a git tool returns: the call as run, how it ended, bounded previews, and the full
/// output as an artifact (retrieve_context pages it).
struct GitResult {
  std::string command;  // the argv as run, for people (space-joined)
  std::string task_id;
  bool ok = false;  // exited 0
  std::optional<int> exit_code;
  std::string state;
  std::string preview;         // the first previewChars of stdout, "…" appended when cut
  std::string stderr_preview;  // likewise for stderr
  std::optional<ArtifactRef> output;
  std::string message;  // why it ended when that is not a plain exit
};

/// The fixed options every git call starts with (after the binary): the config-driven
/// execution paths closed on the command line, which outranks every config file.
const std::vector<std::string>& hardened_prefix();

// ---- value checks (pure; exposed for the unit tests) ----------------------------------------

/// A revision as the caller wrote it: non-empty, no control characters or whitespace, and
/// not starting with "-". `field` names the argument in the refusal.
[[nodiscard]] Result<void> check_ref(const std::string& field, const std::string& ref);
/// A path relative to the repository root (or absolute inside it), normalised lexically;
/// returns it relative to the root ("." for the root itself). Refuses "-" first, pathspec
/// magic (a leading ":"), and anything outside the root.
[[nodiscard]] Result<std::string> check_path(const GitSettings& settings, const std::string& field,
                                             const std::string& path);
/// An ISO date (2024-05-01, 2024-05-01T10:00[:00][Z|±hh:mm]) or "N days|weeks|months|years
/// ago" (singular too).
[[nodiscard]] Result<void> check_since(const std::string& since);

// ---- the repository -------------------------------------------------------------------------

/// Inspects repoRoot on the host for this call: the git directory to use (`.git`, a `.git`
/// file's target inside repoRoot, or repoRoot itself when bare). A `.git` file, commondir or
/// alternates entry leading outside repoRoot is refused: only repoRoot is bound into the
/// sandbox, and what lies outside it is not the caller's to read.
[[nodiscard]] Result<std::string> git_dir_for(const GitSettings& settings);

// ---- running ----------------------------------------------------------------------------------

/// Runs git calls for one session as engine jobs under the git policy and waits for each.
class Runner {
 public:
  Runner(Engine& engine, std::string session, GitSettings settings,
         std::function<bool()> cancelled = {});

  /// Resolves `ref` with `rev-parse --verify --end-of-options <ref>^{commit}` inside the
  /// sandbox; the object id it prints is what later commands get.
  [[nodiscard]] Result<std::string> resolve(const std::string& field, const std::string& ref);
  /// Runs `git <hardened prefix> <args>` and waits for it (bounded by the git timeout).
  [[nodiscard]] Result<GitResult> run(const std::vector<std::string>& args);

  const GitSettings& settings() const { return settings_; }

 private:
  [[nodiscard]] Result<JobStatus> run_job(const std::vector<std::string>& args);
  void kill_and_read(const std::string& task_id);

  Engine& engine_;
  std::string session_;
  GitSettings settings_;
  std::function<bool()> cancelled_;
  std::string git_dir_;
};

// ---- the tools --------------------------------------------------------------------------------

enum class LogFormat { kOneline, kFull, kStat, kNameOnly };

struct LogRequest {
  std::optional<std::string> ref, path, since;
  uint64_t max_count = kDefaultLogCount;
  LogFormat format = LogFormat::kOneline;
};
struct ShowRequest {
  std::string ref;
  std::optional<std::string> path;
};
struct DiffRequest {
  std::optional<std::string> base;  // required; absent is refused with what to pass
  std::string head = "HEAD";
  std::optional<std::string> path;
  bool name_only = false;
  uint64_t unified = 3;
};
struct BlameRequest {
  std::string path;
  std::string ref = "HEAD";
  std::optional<uint64_t> line_start, line_end;
};
struct MergeBaseRequest {
  std::string base, head;
};
struct LsFilesRequest {
  std::optional<std::string> path;
};

// Each validates every value first (no job runs for a refused call), then resolves the refs,
// then runs one fixed argv. Refusals are kRefused with a message that says what to pass.
[[nodiscard]] Result<GitResult> log(Runner& runner, const LogRequest& request);
[[nodiscard]] Result<GitResult> show(Runner& runner, const ShowRequest& request);
[[nodiscard]] Result<GitResult> diff(Runner& runner, const DiffRequest& request);
[[nodiscard]] Result<GitResult> blame(Runner& runner, const BlameRequest& request);
[[nodiscard]] Result<GitResult> merge_base(Runner& runner, const MergeBaseRequest& request);
[[nodiscard]] Result<GitResult> ls_files(Runner& runner, const LsFilesRequest& request);

/// The refusal for a git tool called without a git section in the policy.
[[nodiscard]] Error not_enabled();

}  // namespace cordon::git
