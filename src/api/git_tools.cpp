#include "api/git_tools.hpp"

#include <optional>
#include <string>

#include <fmt/format.h>

#include "git/git.hpp"

namespace cordon::api {
namespace {

json str(const std::string& description) {
  return {{"type", "string"}, {"description", description}};
}
json boolean(const std::string& description) {
  return {{"type", "boolean"}, {"description", description}};
}
json integer(const std::string& description, uint64_t min, uint64_t max) {
  return {{"type", "integer"}, {"description", description}, {"minimum", min}, {"maximum", max}};
}
json input(json properties, std::vector<std::string> required) {
  return {{"type", "object"},
          {"properties", std::move(properties)},
          {"required", required},
          {"additionalProperties", false}};
}

const char* const kRefHelp =
    "A revision: branch, tag, commit id or expression (HEAD~2, main^). Resolved to a commit "
    "id first; never an option (nothing starting with \"-\").";
const char* const kPathHelp =
    "A path relative to the repository root (or absolute inside it). A plain path: no "
    "pathspec magic, globs are literal. A deleted path is fine.";

json result_properties() {
  return {
      {"command", str("The git command as it ran (revisions resolved to commit ids).")},
      {"taskId", str("The job that ran it (command_status / command_output work on it too).")},
      {"ok", boolean("True when git exited 0.")},
      {"exitCode", {{"type", {"integer", "null"}}, {"description", "git's exit code, or null."}}},
      {"state", str("The job's final state: exited, timeout, output-limit, killed, failed...")},
      {"preview", str("The start of git's output (bounded; ends in \"…\" when cut; empty when "
                      "git printed nothing).")},
      {"stderrPreview", str("The start of git's stderr (bounded, \"…\" when cut).")},
      {"output", artifact_ref_schema()},
      {"message", str("Why it ended when that is not a plain exit (timeout, output cap), else "
                      "empty.")},
  };
}
const std::vector<std::string> kResultRequired = {
    "command", "ok", "exitCode", "state", "preview", "stderrPreview", "output"};

json artifact_json(const std::optional<ArtifactRef>& a) {
  if (!a) {
    return nullptr;
  }
  return {{"artifactId", a->artifact_id},     {"taskId", a->task_id}, {"stream", a->stream},
          {"sizeBytes", a->size_bytes},       {"sha256", a->sha256},  {"preview", a->preview},
          {"readBackHint", a->read_back_hint}};
}

json result_json(const Result<git::GitResult>& r) {
  if (!r) {
    return {{"error", error_json(r.error())}};
  }
  return {{"command", r->command},
          {"taskId", r->task_id},
          {"ok", r->ok},
          {"exitCode", r->exit_code ? json(*r->exit_code) : json(nullptr)},
          {"state", r->state},
          {"preview", r->preview},
          {"stderrPreview", r->stderr_preview},
          {"output", artifact_json(r->output)},
          {"message", r->message}};
}

std::optional<std::string> opt_str(const json& args, const char* key) {
  auto it = args.find(key);
  if (it == args.end() || !it->is_string()) {
    return std::nullopt;
  }
  return it->get<std::string>();
}
std::optional<uint64_t> opt_u64(const json& args, const char* key) {
  auto it = args.find(key);
  // The schema has checked it is a non-negative integer; a JSON built in-process holds a
  // positive int as signed, a parsed one as unsigned.
  if (it == args.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return std::nullopt;
  }
  return it->get<uint64_t>();
}

// Runs `fn(runner)` when the git tools are enabled; every result goes through result_json.
template <class Fn>
json with_runner(Engine& engine, const std::string& session, const CallContext& ctx, Fn&& fn) {
  auto settings = engine.git_settings();
  if (!settings) {
    return {{"error", error_json(git::not_enabled())}};
  }
  git::Runner runner(engine, session, *settings, [&ctx] { return ctx.is_cancelled(); });
  return result_json(fn(runner));
}

json git_log(Engine& engine, const std::string& session, const json& args, const CallContext& ctx) {
  git::LogRequest req;
  req.ref = opt_str(args, "ref");
  req.path = opt_str(args, "path");
  req.since = opt_str(args, "since");
  req.max_count = opt_u64(args, "maxCount").value_or(git::kDefaultLogCount);
  std::string format = opt_str(args, "format").value_or("oneline");
  req.format = format == "full"        ? git::LogFormat::kFull
               : format == "stat"      ? git::LogFormat::kStat
               : format == "name-only" ? git::LogFormat::kNameOnly
                                       : git::LogFormat::kOneline;
  return with_runner(engine, session, ctx, [&](git::Runner& r) { return git::log(r, req); });
}

json git_show(Engine& engine, const std::string& session, const json& args,
              const CallContext& ctx) {
  git::ShowRequest req;
  req.ref = opt_str(args, "ref").value_or("");
  req.path = opt_str(args, "path");
  return with_runner(engine, session, ctx, [&](git::Runner& r) { return git::show(r, req); });
}

json git_diff(Engine& engine, const std::string& session, const json& args,
              const CallContext& ctx) {
  git::DiffRequest req;
  req.base = opt_str(args, "base");
  req.head = opt_str(args, "head").value_or("HEAD");
  req.path = opt_str(args, "path");
  req.name_only = args.value("nameOnly", false);
  req.unified = opt_u64(args, "unified").value_or(3);
  return with_runner(engine, session, ctx, [&](git::Runner& r) { return git::diff(r, req); });
}

json git_blame(Engine& engine, const std::string& session, const json& args,
               const CallContext& ctx) {
  git::BlameRequest req;
  req.path = opt_str(args, "path").value_or("");
  req.ref = opt_str(args, "ref").value_or("HEAD");
  req.line_start = opt_u64(args, "lineStart");
  req.line_end = opt_u64(args, "lineEnd");
  return with_runner(engine, session, ctx, [&](git::Runner& r) { return git::blame(r, req); });
}

json git_merge_base(Engine& engine, const std::string& session, const json& args,
                    const CallContext& ctx) {
  git::MergeBaseRequest req;
  req.base = opt_str(args, "base").value_or("");
  req.head = opt_str(args, "head").value_or("");
  return with_runner(engine, session, ctx, [&](git::Runner& r) { return git::merge_base(r, req); });
}

json git_ls_files(Engine& engine, const std::string& session, const json& args,
                  const CallContext& ctx) {
  git::LsFilesRequest req;
  req.path = opt_str(args, "path");
  return with_runner(engine, session, ctx, [&](git::Runner& r) { return git::ls_files(r, req); });
}

constexpr const char* kCommon =
    " Read-only: runs in the sandbox with the repository (the policy's git.repoRoot) mounted "
    "read-only, no network, and the repository's own config cannot run programs (no pager, "
    "hooks, textconv, external diff, filters, fsmonitor or signature programs). Returns ok, "
    "exitCode, a bounded preview, and `output`: the full output as an artifact (page it with "
    "retrieve_context {artifactId}).";

}  // namespace

void add_git_tools(std::vector<Tool>& t) {
  json ro = {{"readOnlyHint", true}, {"openWorldHint", false}};
  json out = result_schema(result_properties(), kResultRequired);
  t.push_back(
      {"git_log", "Git history",
       fmt::format("Lists commits reachable from ref (default HEAD), newest first: "
                   "maxCount (default {}, at most {}), optionally only those touching "
                   "path or newer than since (ISO date or \"N days ago\"). format: "
                   "oneline (default: id, date, author, subject), full (whole "
                   "messages), stat (with changed files), name-only.{}",
                   git::kDefaultLogCount, git::kMaxLogCount, kCommon),
       input({{"ref", str(kRefHelp)},
              {"path", str(kPathHelp)},
              {"maxCount", integer("How many commits at most (default 20).", 1, git::kMaxLogCount)},
              {"since", str("Only commits newer than this: an ISO date "
                            "(\"2024-05-01\") or \"N days|weeks|months ago\".")},
              {"format",
               {{"type", "string"},
                {"enum", {"oneline", "full", "stat", "name-only"}},
                {"description", "oneline (default), full, stat or name-only."}}}},
             {}),
       out, ro, git_log});
  t.push_back({"git_show", "Show a commit or a file at a revision",
               std::string("Without path: the commit (author, dates, message), its diffstat "
                           "and its patch. With path: that file's content at ref.") +
                   kCommon,
               input({{"ref", str(kRefHelp)}, {"path", str(kPathHelp)}}, {"ref"}), out, ro,
               git_show});
  t.push_back(
      {"git_diff", "Diff two revisions",
       fmt::format("The diff between two commits' trees: base (required) and head (default "
                   "HEAD), optionally limited to path; nameOnly lists the changed files only; "
                   "unified sets the context lines (0-{}, default 3). Never reads the worktree "
                   "(uncommitted changes are not shown).{}",
                   git::kMaxUnified, kCommon),
       input({{"base", str(std::string("The revision to compare from. ") + kRefHelp)},
              {"head", str("The revision to compare to (default HEAD).")},
              {"path", str(kPathHelp)},
              {"nameOnly", boolean("Only the names of the changed files.")},
              {"unified", integer("Context lines (default 3).", 0, git::kMaxUnified)}},
             {}),
       out, ro, git_diff});
  t.push_back({"git_blame", "Who last changed each line",
               std::string("Blames a file at a revision (ref, default HEAD; never the "
                           "worktree): for each line the commit, author and date that last "
                           "changed it. lineStart/lineEnd limit it to a range.") +
                   kCommon,
               input({{"path", str(kPathHelp)},
                      {"ref", str(kRefHelp)},
                      {"lineStart", integer("First line (from 1).", 1, git::kMaxLine)},
                      {"lineEnd", integer("Last line (at least lineStart).", 1, git::kMaxLine)}},
                     {"path"}),
               out, ro, git_blame});
  t.push_back({"git_merge_base", "Common ancestor of two revisions",
               std::string("The best common ancestor commit of base and head (where a branch "
                           "forked), as a commit id in preview.") +
                   kCommon,
               input({{"base", str(kRefHelp)}, {"head", str(kRefHelp)}}, {"base", "head"}), out, ro,
               git_merge_base});
  t.push_back({"git_ls_files", "Files tracked by git",
               std::string("Lists the files in the index (tracked files), optionally only "
                           "those under path.") +
                   kCommon,
               input({{"path", str(kPathHelp)}}, {}), out, ro, git_ls_files});
}

}  // namespace cordon::api
