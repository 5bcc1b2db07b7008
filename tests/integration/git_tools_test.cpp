#define BOOST_TEST_MODULE git_tools
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <set>
#include <thread>

#include "api/schema.hpp"
#include "api/tools.hpp"
#include "git/git.hpp"
#include "helpers/engine_fixture.hpp"
#include "helpers/git_fixture.hpp"
#include "helpers/mcp_client.hpp"

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kGitTools = {"git_log",   "git_show",       "git_diff",
                                            "git_blame", "git_merge_base", "git_ls_files"};

// An engine whose policy has a git section on a fixture repository inside the working root.
struct GitEnv {
  EngineEnv env;
  GitRepo repo;
  std::unique_ptr<Engine> engine;

  explicit GitEnv(json git_extra = json::object(), bool enable = true,
                  json policy_extra = json::object())
      : repo(env.box.root + "/repo", env.box.base + "/home") {
    for (auto& [k, v] : policy_extra.items()) env.policy[k] = v;
    if (enable) {
      json git = {{"repoRoot", repo.dir}};
      for (auto& [k, v] : git_extra.items()) git[k] = v;
      env.policy["git"] = git;
      env.write_policy();
    }
    engine = open_engine(env);
  }

  api::ToolResult call(const std::string& tool, const json& args,
                       const std::string& session = "s1") {
    const api::Tool* t = api::find_tool(tool);
    BOOST_REQUIRE_MESSAGE(t != nullptr, "no tool " << tool);
    auto r = api::call_tool(*engine, *t, session, args);
    auto issues = api::validate_schema(t->output_schema, r.structured);
    BOOST_TEST(issues.empty(), tool << " result does not validate: " << api::describe_issues(issues)
                                    << "\n"
                                    << r.structured.dump());
    return r;
  }
  // A successful call's structured result (fails the test on an error).
  json ok(const std::string& tool, const json& args) {
    auto r = call(tool, args);
    BOOST_REQUIRE_MESSAGE(!r.is_error, tool << " " << args.dump() << ": " << r.text);
    BOOST_TEST(r.structured["ok"].get<bool>(), r.structured.dump());
    return r.structured;
  }
  // A refused call's message (fails the test unless it is a refusal).
  std::string refused(const std::string& tool, const json& args) {
    auto r = call(tool, args);
    BOOST_REQUIRE_MESSAGE(
        r.is_error, tool << " " << args.dump() << " was not refused: " << r.structured.dump());
    BOOST_TEST(r.structured["error"]["code"] == "refused", r.structured.dump());
    return r.text;
  }
  json ok_page(const json& artifact_id) {
    auto r = call("retrieve_context", {{"artifactId", artifact_id}});
    BOOST_REQUIRE_MESSAGE(!r.is_error, r.text);
    return r.structured;
  }
  size_t job_count(const std::string& session = "s1") {
    auto l = engine->list(session, std::nullopt);
    BOOST_REQUIRE(l.has_value());
    return l->size();
  }
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ls_files_lists_the_tracked_files) {
  GitEnv g;
  json r = g.ok("git_ls_files", json::object());
  BOOST_TEST(r["preview"] == "README.md\nsrc/lib.c\n");
  BOOST_TEST(r["exitCode"] == 0);
  BOOST_TEST(r["state"] == "exited");
  BOOST_TEST(r["stderrPreview"] == "");
  BOOST_TEST(contains(r["command"].get<std::string>(), "ls-files"));
  json sub = g.ok("git_ls_files", {{"path", "src"}});
  BOOST_TEST(sub["preview"] == "src/lib.c\n");
  // The full output is an artifact that retrieve_context reads back.
  const json& art = r["output"];
  BOOST_REQUIRE(art.is_object());
  BOOST_TEST(!art["readBackHint"].get<std::string>().empty());
  json page = g.ok_page(art["artifactId"]);
  BOOST_TEST(page["content"] == "README.md\nsrc/lib.c\n");
}

BOOST_AUTO_TEST_CASE(log_shows_both_subjects_and_follows_refs_paths_and_formats) {
  GitEnv g;
  std::string log = g.ok("git_log", json::object())["preview"];
  BOOST_TEST(contains(log, "first: add the library"));
  BOOST_TEST(contains(log, "second: add two()"));
  BOOST_TEST(contains(log, "Ada Lovelace"));
  BOOST_TEST(!contains(log, "feature: document it"));
  BOOST_TEST(log.find("second") < log.find("first"));  // newest first

  std::string feat = g.ok("git_log", {{"ref", "feature"}, {"path", "docs"}})["preview"];
  BOOST_TEST(contains(feat, "feature: document it"));
  BOOST_TEST(!contains(feat, "first: add the library"));

  std::string one = g.ok("git_log", {{"maxCount", 1}})["preview"];
  BOOST_TEST(contains(one, "second"));
  BOOST_TEST(!contains(one, "first"));

  std::string names = g.ok("git_log", {{"format", "name-only"}, {"maxCount", 1}})["preview"];
  BOOST_TEST(contains(names, "src/lib.c"));
  std::string stat = g.ok("git_log", {{"format", "stat"}, {"maxCount", 1}})["preview"];
  BOOST_TEST(contains(stat, "1 file changed"));
  std::string full = g.ok("git_log", {{"format", "full"}, {"maxCount", 1}})["preview"];
  BOOST_TEST(contains(full, "CommitDate:"));

  BOOST_TEST(contains(g.ok("git_log", {{"since", "2024-02-01"}})["preview"], "second"));
  BOOST_TEST(g.ok("git_log", {{"since", "2024-06-01"}})["preview"] == "");
  BOOST_TEST(g.ok("git_log", {{"since", "3 days ago"}})["preview"] == "");
}

BOOST_AUTO_TEST_CASE(show_gives_a_commit_with_its_patch_or_a_file_at_a_revision) {
  GitEnv g;
  std::string commit = g.ok("git_show", {{"ref", "main"}})["preview"];
  BOOST_TEST(contains(commit, g.repo.second));
  BOOST_TEST(contains(commit, "second: add two()"));
  BOOST_TEST(contains(commit, "+int two(void) { return 2; }"));
  json file = g.ok("git_show", {{"ref", g.repo.first}, {"path", "src/lib.c"}});
  BOOST_TEST(file["preview"] == "int one(void) { return 1; }\n");
  // A path that does not exist at that revision: git says so, not ok.
  auto missing = g.call("git_show", {{"ref", g.repo.first}, {"path", "docs/feature.md"}});
  BOOST_TEST(!missing.is_error);
  BOOST_TEST(!missing.structured["ok"].get<bool>());
  BOOST_TEST(contains(missing.structured["stderrPreview"], "does not exist"));
}

BOOST_AUTO_TEST_CASE(diff_is_tree_to_tree_and_needs_a_base) {
  GitEnv g;
  json names = g.ok("git_diff", {{"base", g.repo.first}, {"head", "main"}, {"nameOnly", true}});
  BOOST_TEST(names["preview"] == "src/lib.c\n");
  std::string patch = g.ok("git_diff", {{"base", "main~1"}, {"unified", 0}})["preview"];
  BOOST_TEST(contains(patch, "+int two(void) { return 2; }"));
  BOOST_TEST(!contains(patch, "\n int one(void)"));  // no context lines with unified 0
  // The worktree is never read: an uncommitted change does not show.
  g.repo.write("src/lib.c", "changed in the worktree\n");
  BOOST_TEST(g.ok("git_diff", {{"base", "main"}, {"nameOnly", true}})["preview"] == "");
  BOOST_TEST(contains(g.refused("git_diff", {{"head", "main"}}), "git_diff needs a base"));
}

BOOST_AUTO_TEST_CASE(merge_base_is_the_first_commit) {
  GitEnv g;
  json r = g.ok("git_merge_base", {{"base", "main"}, {"head", "feature"}});
  BOOST_TEST(r["preview"] == g.repo.first + "\n");
}

BOOST_AUTO_TEST_CASE(blame_names_the_author_of_each_line) {
  GitEnv g;
  std::string all = g.ok("git_blame", {{"path", "src/lib.c"}})["preview"];
  BOOST_TEST(contains(all, "Ada Lovelace"));
  BOOST_TEST(contains(all, "int one(void)"));
  BOOST_TEST(contains(all, "int two(void)"));
  std::string two =
      g.ok("git_blame", {{"path", "src/lib.c"}, {"lineStart", 2}, {"lineEnd", 2}})["preview"];
  BOOST_TEST(contains(two, "int two(void)"));
  BOOST_TEST(!contains(two, "int one(void)"));
  BOOST_TEST(contains(two, g.repo.second.substr(0, 8)));
  BOOST_TEST(
      contains(g.refused("git_blame", {{"path", "src/lib.c"}, {"lineStart", 3}, {"lineEnd", 2}}),
               "line range"));
}

BOOST_AUTO_TEST_CASE(an_unknown_revision_is_refused_by_name) {
  GitEnv g;
  BOOST_TEST(g.refused("git_log", {{"ref", "no-such-branch"}}) ==
             "ref \"no-such-branch\" is not a valid git revision (no commit by that name in "
             "the repository); pass a branch, tag, commit id or an expression such as HEAD~1");
  // A blob is not a commit: ^{commit} refuses it.
  BOOST_TEST(
      contains(g.refused("git_show", {{"ref", "main:README.md"}}), "not a valid git revision"));
}

// Failure fixed (a review, session 33): a revision git could not read for another reason (a
// broken config, a corrupt packed-refs) was refused as "no commit by that name", git's own
// answer hidden in a job the agent had to find. And `:/text` (the youngest commit whose message
// matches) was refused: the `^{commit}` suffix became part of the text.
BOOST_AUTO_TEST_CASE(a_revision_git_cannot_read_says_what_git_said_and_text_search_resolves) {
  GitEnv g;
  const std::string config = g.repo.dir + "/.git/config";
  const std::string before = read_file(config);
  std::ofstream(config, std::ios::app) << "[broken\n";
  std::string said = g.refused("git_log", {{"ref", "main"}});
  BOOST_TEST(contains(said, "could not resolve ref \"main\": git said "), said);
  BOOST_TEST(contains(said, "bad config line"), said);
  BOOST_TEST(contains(said, "read its stderr with command_output"), said);
  std::ofstream(config, std::ios::trunc) << before;
  std::string second = g.ok("git_log", {{"ref", ":/second"}, {"maxCount", 1}})["preview"];
  BOOST_TEST(contains(second, "second: add two()"), second);
  BOOST_TEST(!contains(second, "first: add the library"), second);
}

BOOST_AUTO_TEST_CASE(injection_attempts_are_refused_and_write_nothing) {
  GitEnv g;
  std::string target = g.env.box.root + "/pwned";
  std::string in_repo = g.repo.dir + "/.git/pwned";
  size_t jobs = g.job_count();
  const std::string kDash = "must not start with \"-\"";
  // A flag as a ref or a base.
  BOOST_TEST(contains(g.refused("git_log", {{"ref", "--output=" + target}}), kDash));
  BOOST_TEST(contains(g.refused("git_diff", {{"base", "--output=" + in_repo}}), kDash));
  BOOST_TEST(
      contains(g.refused("git_diff", {{"base", "main"}, {"head", "--output=" + target}}), kDash));
  BOOST_TEST(contains(g.refused("git_show", {{"ref", "--output=" + target}}), kDash));
  BOOST_TEST(contains(
      g.refused("git_merge_base", {{"base", "--output=" + target}, {"head", "main"}}), kDash));
  // A flag split across two fields: its name in one, its value in the next.
  BOOST_TEST(contains(g.refused("git_diff", {{"base", "--output"}, {"head", target}}), kDash));
  BOOST_TEST(
      contains(g.refused("git_blame", {{"ref", "--contents"}, {"path", "src/lib.c"}}), kDash));
  // Paths outside the repository, relative and absolute; a flag as a path; pathspec magic.
  const std::string kOutside = "is outside the repository root";
  BOOST_TEST(contains(g.refused("git_log", {{"path", "../../etc/passwd"}}), kOutside));
  BOOST_TEST(contains(g.refused("git_show", {{"ref", "main"}, {"path", "/etc/passwd"}}), kOutside));
  BOOST_TEST(contains(g.refused("git_blame", {{"path", "src/../../../etc/shadow"}}), kOutside));
  BOOST_TEST(contains(g.refused("git_ls_files", {{"path", g.env.box.root}}), kOutside));
  BOOST_TEST(contains(g.refused("git_ls_files", {{"path", "-x"}}), kDash));
  BOOST_TEST(contains(g.refused("git_log", {{"path", "--output=" + target}}), kDash));
  BOOST_TEST(contains(g.refused("git_ls_files", {{"path", ":(exclude)src"}}), "pathspec magic"));
  BOOST_TEST(contains(g.refused("git_ls_files", {{"path", ":/"}}), "pathspec magic"));
  BOOST_TEST(contains(g.refused("git_log", {{"since", "--all"}}), kDash));
  BOOST_TEST(contains(g.refused("git_log", {{"since", "yesterday; touch x"}}), "is not a date"));
  BOOST_TEST(contains(g.refused("git_log", {{"ref", "main --output=x"}}), "whitespace"));
  // None of these ran anything.
  BOOST_TEST(g.job_count() == jobs);

  // `;` in a ref means nothing without a shell: it is resolved inside the sandbox and is
  // simply no revision.
  BOOST_TEST(contains(g.refused("git_log", {{"ref", "main;touch${IFS}" + target}}),
                      "not a valid git revision"));
  BOOST_TEST(contains(g.refused("git_log", {{"ref", "main;id"}}), "not a valid git revision"));
  // Bounded integers: the schema refuses them before the handler.
  auto big = g.call("git_log", {{"maxCount", 501}});
  BOOST_TEST(big.is_error);
  BOOST_TEST(big.structured["error"]["code"] == "invalid-arguments");
  auto ctx = g.call("git_diff", {{"base", "main~1"}, {"unified", 51}});
  BOOST_TEST(ctx.structured["error"]["code"] == "invalid-arguments");

  for (const auto& p : {target, in_repo, g.repo.dir + "/pwned", std::string("/pwned")}) {
    BOOST_TEST(::access(p.c_str(), F_OK) != 0, p << " was written");
  }
}

BOOST_AUTO_TEST_CASE(the_preview_is_bounded_and_the_artifact_holds_everything) {
  GitEnv g(json::object({{"previewChars", 10}}));
  json r = g.ok("git_ls_files", json::object());
  BOOST_TEST(r["preview"] == "README.md\n\xE2\x80\xA6");  // 10 chars, then "…"
  BOOST_TEST(r["output"]["sizeBytes"] == std::string("README.md\nsrc/lib.c\n").size());
  BOOST_TEST(g.ok_page(r["output"]["artifactId"])["content"] == "README.md\nsrc/lib.c\n");
  // An empty answer is an empty preview, not an ellipsis.
  BOOST_TEST(g.ok("git_ls_files", {{"path", "nothing-here"}})["preview"] == "");
}

BOOST_AUTO_TEST_CASE(git_jobs_do_not_raise_the_finished_counter) {
  GitEnv g;
  auto r = g.call("git_log", json::object());
  BOOST_TEST(r.structured["finished"] == 0);
  BOOST_TEST(r.structured["running"] == 0);
}

// A read-only git call needs no slot of the session's own: it is not queued behind the
// agent's running commands. Failure fixed (a review, session 12): with perSession 1 and a
// build running, git_log waited in the queue until its timeout and answered "internal".
BOOST_AUTO_TEST_CASE(a_git_call_runs_while_the_sessions_slots_are_taken) {
  GitEnv g(json{{"timeoutMs", 5000}}, true, json{{"concurrency", {{"perSession", 1}}}});
  auto busy = g.engine->start("s1", {.argv = {"/bin/sleep", "60"}});
  BOOST_REQUIRE_MESSAGE(busy.has_value(), describe(busy));
  BOOST_REQUIRE(busy->state == "running");
  // The session's own commands still wait for its slot.
  auto queued = g.engine->start("s1", {.argv = {"/bin/true"}});
  BOOST_REQUIRE_MESSAGE(queued.has_value(), describe(queued));
  BOOST_TEST(queued->state == "queued");
  auto t0 = std::chrono::steady_clock::now();
  json log = g.ok("git_log", {});
  BOOST_TEST(contains(log["preview"].get<std::string>(), "second: add two()"), log.dump());
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)));
  BOOST_REQUIRE(g.engine->kill("s1", busy->task_id, SIGKILL).has_value());
}

// A git call that never gets a slot (concurrency.total taken by the agent's commands) is
// refused with why and what to do, after its timeout, and its queued job is gone; it was
// `internal` "did not settle within its timeout" before session 29 (found by a review).
BOOST_AUTO_TEST_CASE(a_git_call_that_never_gets_a_slot_is_refused_with_why) {
  GitEnv g(json{{"timeoutMs", 1000}}, true,
           json{{"concurrency", {{"total", 1}, {"perSession", 1}}}});
  auto busy = g.engine->start("s1", {.argv = {"/bin/sleep", "60"}});
  BOOST_REQUIRE_MESSAGE(busy.has_value(), describe(busy));
  BOOST_REQUIRE(busy->state == "running");
  std::string why = g.refused("git_log", {});
  BOOST_TEST(contains(why, "the git call waited 6000 ms and never started"), why);
  BOOST_TEST(contains(why, "concurrency.total"), why);
  BOOST_REQUIRE(g.engine->kill("s1", busy->task_id, SIGKILL).has_value());
  BOOST_TEST(!g.ok("git_log", {}).empty());  // with the slot free, the same call runs
}

BOOST_AUTO_TEST_CASE(a_cancelled_git_call_does_not_raise_the_finished_counter) {
  GitEnv g;
  auto settings = g.engine->git_settings();
  BOOST_REQUIRE(settings.has_value());
  git::Runner runner(*g.engine, "s1", *settings, [] { return true; });
  auto r = runner.run({"log", "--oneline"});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(contains(r.error().message(), "the git call was cancelled"), r.error().message());
  // The killed job settles; nothing but the runner has read it.
  for (int i = 0; i < 500 && g.engine->counters("s1").running > 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  BOOST_REQUIRE(g.engine->counters("s1").running == 0u);
  BOOST_TEST(g.engine->counters("s1").finished == 0u);
}

BOOST_AUTO_TEST_CASE(without_a_git_section_the_tools_say_how_to_enable_them) {
  GitEnv g(json::object(), /*enable=*/false);
  for (const auto& tool : kGitTools) {
    json args = tool == "git_show"         ? json{{"ref", "main"}}
                : tool == "git_blame"      ? json{{"path", "src/lib.c"}}
                : tool == "git_merge_base" ? json{{"base", "main"}, {"head", "feature"}}
                                           : json::object();
    BOOST_TEST(contains(g.refused(tool, args),
                        "the git tools are not enabled: add \"git\": {\"repoRoot\": "),
               tool);
  }
}

BOOST_AUTO_TEST_CASE(the_git_tools_are_listed_and_callable_over_mcp) {
  GitEnv g;
  g.engine.reset();  // one engine per state dir: the server opens its own
  McpProcess proc({cordon_bin(), "mcp", "--policy", g.env.policy_path, "--state-dir",
                   g.env.box.state, "--session", "default"},
                  g.env.box.base + "/mcp.stderr");
  BOOST_REQUIRE(proc.started());
  auto init =
      proc.request("initialize", {{"protocolVersion", "2025-11-25"},
                                  {"capabilities", json::object()},
                                  {"clientInfo", {{"name", "git_test"}, {"version", "1"}}}});
  BOOST_REQUIRE(init.has_value());
  proc.send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  auto tools = proc.request("tools/list");
  BOOST_REQUIRE(tools.has_value());
  std::map<std::string, json> listed;
  for (const auto& t : (*tools)["result"]["tools"]) listed[t["name"]] = t;
  for (const auto& name : kGitTools) {
    BOOST_REQUIRE_MESSAGE(listed.count(name) == 1, name << " is not in tools/list");
    BOOST_TEST(listed[name]["annotations"]["readOnlyHint"] == true);
    BOOST_TEST(!listed[name]["description"].get<std::string>().empty());
  }
  auto call = proc.request(
      "tools/call",
      {{"name", "git_merge_base"}, {"arguments", {{"base", "main"}, {"head", "feature"}}}}, 60s);
  BOOST_REQUIRE(call.has_value());
  const json& res = (*call)["result"];
  BOOST_TEST(!res.value("isError", false), res.dump());
  auto issues =
      api::validate_schema(listed["git_merge_base"]["outputSchema"], res["structuredContent"]);
  BOOST_TEST(issues.empty(), api::describe_issues(issues));
  BOOST_TEST(res["structuredContent"]["preview"] == g.repo.first + "\n");
}
