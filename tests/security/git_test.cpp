#define BOOST_TEST_MODULE security_git
#include <boost/test/unit_test.hpp>

// A hostile repository cannot turn the read-only git tools into a program run or a write.
//
// The repository's config arms every config-driven execution path measured on git 2.39
// (fsmonitor, textconv, a diff driver command, diff.external from an included file outside
// the repository, clean/smudge filters, log.showSignature + gpg.program, a pager, an alias, a
// hook, a submodule's own diff driver that diff.submodule=diff reaches). Each program is a script
// inside the repository (so it is visible, and executable, inside the sandbox) that announces
// itself on stderr and appends to a marker file outside the sandbox. The walls and their controls:
//   - the git tools: every tool answers, no program announces itself, no marker appears;
//   - control 1: the same sandbox and policy, the same git commands WITHOUT cordon's hardened
//     flags: the programs do run (so the flags, not the sandbox, stop them);
//   - control 2: plain git outside cordon runs every program (so the repository is armed);
//   - the read-only repository: a write that slipped past the flags fails with EROFS in the
//     git policy's sandbox, and succeeds with the same argv under the main policy;
//   - a .git file or alternates leading outside repoRoot are refused by name (control: plain
//     git follows them);
//   - enabling git does not let run_command_bg run git.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include "api/schema.hpp"
#include "api/tools.hpp"
#include "git/git.hpp"
#include "helpers/engine_fixture.hpp"
#include "helpers/git_fixture.hpp"
#include "policy/host_paths.hpp"
#include "policy/policy.hpp"

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The programs the hostile config names, each a script in <repo>/.git/hostile-bin.
const std::vector<std::string> kPrograms = {"fsmonitor", "textconv", "drivercmd", "extdiff",
                                            "clean",     "smudge",   "gpg",       "pager",
                                            "alias",     "hook",     "subdiff",   "transport"};

struct HostileEnv {
  EngineEnv env;
  GitRepo repo;
  std::string bin, markers, outside_cfg;
  std::string third, signed_commit;
  std::string sub_before, sub_after;  // branch withsub: a submodule added, then moved
  std::unique_ptr<Engine> engine;

  explicit HostileEnv(json policy_extra = json::object())
      : env(policy_extra), repo(env.box.root + "/repo", env.box.base + "/home") {
    bin = repo.dir + "/.git/hostile-bin";
    markers = env.box.base + "/markers";
    outside_cfg = env.box.base + "/outside.cfg";
    std::filesystem::create_directories(bin);
    std::filesystem::create_directories(markers);
    ::chmod(markers.c_str(), 0777);  // the sandbox user could write here, were it visible
    // A third commit that changes a file with the hostile diff driver (src/lib.c) and one
    // without (README.md, for diff.external), and a commit with a PGP signature header.
    repo.write("README.md", "# fixture, third\n");
    repo.write("src/lib.c", "int one(void) { return 1; }\nint three(void) { return 3; }\n");
    repo.git({"commit", "-q", "-a", "-m", "third: change both"});
    third = repo.head();
    std::string tree = repo.git({"rev-parse", "HEAD^{tree}"});
    tree = tree.substr(0, tree.find('\n'));
    std::string body = "tree " + tree + "\nparent " + third +
                       "\nauthor Ada Lovelace <ada@example.com> 1709290000 +0000\n"
                       "committer Ada Lovelace <ada@example.com> 1709290000 +0000\n"
                       "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n"
                       " -----END PGP SIGNATURE-----\n\nsigned: a signed commit\n";
    std::string obj_file = env.box.base + "/signed.commit";
    std::ofstream(obj_file) << body;
    std::string oid = repo.git({"hash-object", "-t", "commit", "-w", obj_file});
    signed_commit = oid.substr(0, oid.find('\n'));
    repo.git({"update-ref", "refs/heads/signed", signed_commit});
    // A submodule (its gitdir in .git/modules/sub, inside the repository), moved between two
    // commits of branch withsub; main stays as it was.
    GitRepo sub_src(env.box.base + "/subsrc", env.box.base + "/home");
    repo.git({"checkout", "-q", "-b", "withsub"});
    repo.git({"-c", "protocol.file.allow=always", "submodule", "add", "-q", sub_src.dir, "sub"});
    repo.git({"commit", "-q", "-m", "withsub: add the submodule"});
    sub_before = repo.head();
    repo.git({"-C", "sub", "checkout", "-q", sub_src.first});
    repo.git({"add", "sub"});
    repo.git({"commit", "-q", "-m", "withsub: move the submodule"});
    sub_after = repo.head();
    repo.git({"checkout", "-q", "main"});
    arm();
    env.policy["git"] = {{"repoRoot", repo.dir}};
    env.write_policy();
    engine = open_engine(env);
  }

  void script(const std::string& name, const std::string& tail) const {
    std::string path = bin + "/" + name;
    std::ofstream(path) << "#!/bin/sh\necho \"HOSTILE-" << name << " ran\" >&2\necho ran >> '"
                        << markers << "/" << name << "' 2>/dev/null\n"
                        << tail << "\n";
    ::chmod(path.c_str(), 0755);
  }

  void arm() const {
    script("fsmonitor", "exit 1");
    script("textconv", "cat \"$1\"");
    script("drivercmd", "exit 0");
    script("extdiff", "exit 0");
    script("clean", "cat");
    script("smudge", "cat");
    script("gpg", "exit 1");
    script("pager", "cat");
    script("alias", "exit 0");
    script("hook", "exit 0");
    script("subdiff", "exit 0");
    script("transport", "exit 1");  // an ext:: remote's command (a_promisor_remote_…)
    std::filesystem::create_directories(repo.dir + "/.git/hooks");
    std::filesystem::copy_file(bin + "/hook", repo.dir + "/.git/hooks/post-index-change",
                               std::filesystem::copy_options::overwrite_existing);
    ::chmod((repo.dir + "/.git/hooks/post-index-change").c_str(), 0755);
    std::ofstream(repo.dir + "/.git/info/attributes") << "*.c diff=hostile filter=hostile\n";
    // From outside the repository (and outside the sandbox): the external diff.
    std::ofstream(outside_cfg) << "[diff]\n\texternal = " << bin << "/extdiff\n";
    std::ofstream(repo.dir + "/.git/config", std::ios::app)
        << "[core]\n\tfsmonitor = " << bin << "/fsmonitor\n\tpager = " << bin << "/pager\n"
        << "[diff \"hostile\"]\n\ttextconv = " << bin << "/textconv\n\tcommand = " << bin
        << "/drivercmd\n"
        << "[filter \"hostile\"]\n\tclean = " << bin << "/clean\n\tsmudge = " << bin << "/smudge\n"
        << "[log]\n\tshowSignature = true\n"
        << "[gpg]\n\tprogram = " << bin << "/gpg\n"
        << "[alias]\n\thostile = !" << bin << "/alias\n"
        << "[include]\n\tpath = " << outside_cfg
        << "\n"
        // A changed submodule's diff made by a `git diff` run inside it, which reads the
        // submodule's own config and attributes: its diff driver runs a program.
        << "[diff]\n\tsubmodule = diff\n";
    std::string subgit = repo.dir + "/.git/modules/sub";
    std::ofstream(subgit + "/config", std::ios::app)
        << "[diff \"hostilesub\"]\n\tcommand = " << bin << "/subdiff\n";
    std::filesystem::create_directories(subgit + "/info");
    std::ofstream(subgit + "/info/attributes") << "* diff=hostilesub\n";
  }

  std::set<std::string> markers_present() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(markers)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }
  void clear_markers() const {
    for (const auto& e : std::filesystem::directory_iterator(markers)) {
      std::filesystem::remove(e.path());
    }
  }

  api::ToolResult call(const std::string& tool, const json& args) {
    const api::Tool* t = api::find_tool(tool);
    BOOST_REQUIRE(t != nullptr);
    return api::call_tool(*engine, *t, "s1", args);
  }

  // A job under the git tools' private policy with this argv (no hardening flags added) and
  // the environment the git tools give it; returns its settled status.
  JobStatus git_job(const std::vector<std::string>& args, JobPolicy policy = JobPolicy::kGit) {
    StartOptions o;
    o.policy = policy;
    o.argv = {kGitBin};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.cwd = repo.dir;
    if (policy == JobPolicy::kGit) {
      o.env["GIT_DIR"] = repo.dir + "/.git";
    }
    auto s = engine->start("s1", o);
    BOOST_REQUIRE_MESSAGE(s.has_value(), (s ? std::string() : s.error().message()));
    auto done = engine->status("s1", s->task_id, 60s);
    BOOST_REQUIRE(done.has_value());
    BOOST_REQUIRE_MESSAGE(done->settled(), "git job did not settle");
    return *done;
  }
  std::string stream(const JobStatus& s, const std::string& name) {
    return read_all_bytes(*engine, "s1", s.task_id, name);
  }
};

std::string announced(const std::string& text) {
  std::string out;
  for (const auto& p : kPrograms) {
    if (contains(text, "HOSTILE-" + p + " ran")) out += p + " ";
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(no_hostile_program_runs_through_any_git_tool) {
  HostileEnv h;
  const std::vector<std::pair<std::string, json>> calls = {
      {"git_ls_files", json::object()},
      {"git_log", json::object()},
      {"git_log", {{"ref", "signed"}, {"format", "full"}}},
      {"git_log", {{"format", "stat"}}},
      {"git_log", {{"format", "name-only"}, {"path", "src/lib.c"}}},
      {"git_show", {{"ref", "signed"}}},
      {"git_show", {{"ref", h.third}}},
      {"git_show", {{"ref", h.third}, {"path", "src/lib.c"}}},
      {"git_diff", {{"base", h.repo.first}, {"head", h.third}}},
      {"git_diff", {{"base", h.repo.first}, {"head", h.third}, {"nameOnly", true}}},
      {"git_blame", {{"path", "src/lib.c"}}},
      {"git_blame", {{"path", "README.md"}, {"ref", h.third}}},
      {"git_merge_base", {{"base", "main"}, {"head", "feature"}}},
      {"git_diff", {{"base", h.sub_before}, {"head", h.sub_after}}},
      {"git_show", {{"ref", h.sub_after}}},
      {"git_log", {{"ref", "withsub"}, {"format", "stat"}}},
  };
  for (const auto& [tool, args] : calls) {
    auto r = h.call(tool, args);
    std::string what = tool + " " + args.dump();
    BOOST_REQUIRE_MESSAGE(!r.is_error, what << ": " << r.text);
    BOOST_TEST(r.structured["ok"].get<bool>(), what << ": " << r.structured.dump());
    std::string out = read_all_bytes(*h.engine, "s1", r.structured["taskId"], "stdout");
    std::string err = read_all_bytes(*h.engine, "s1", r.structured["taskId"], "stderr");
    BOOST_TEST(announced(out + err) == "", what << " ran a hostile program");
    BOOST_TEST(!contains(err, "cannot run"), what << ": " << err);
    BOOST_TEST(!contains(err, "error:"), what << ": " << err);
  }
  // The tools still answered the questions: the signed commit's log, the diff of both files.
  auto log = h.call("git_log", {{"ref", "signed"}});
  BOOST_TEST(contains(log.structured["preview"], "signed: a signed commit"));
  auto diff = h.call("git_diff", {{"base", h.repo.first}, {"head", h.third}});
  BOOST_TEST(contains(diff.structured["preview"], "+int three(void) { return 3; }"));
  BOOST_TEST(contains(diff.structured["preview"], "+# fixture, third"));
  // The submodule's move is shown as its two commit ids.
  auto moved = h.call("git_diff", {{"base", h.sub_before}, {"head", h.sub_after}});
  BOOST_TEST(contains(moved.structured["preview"], "+Subproject commit "), moved.structured.dump());
  BOOST_TEST(h.markers_present().empty());
}

BOOST_AUTO_TEST_CASE(control_the_same_sandbox_without_the_flags_runs_the_programs) {
  HostileEnv h;
  // The git policy's sandbox, the repository's config, none of cordon's hardening flags.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"fsmonitor", {"ls-files"}},
      {"textconv", {"show", h.third}},
      {"drivercmd", {"diff", h.repo.first, h.third}},
      {"smudge", {"blame", h.third, "--", "src/lib.c"}},
      {"clean", {"blame", "src/lib.c"}},
      {"gpg", {"log", "-1", "signed"}},
      {"alias", {"hostile"}},
      // --no-ext-diff and --no-textconv do not reach the git run inside the submodule.
      {"subdiff", {"diff", "--no-ext-diff", "--no-textconv", h.sub_before, h.sub_after}},
  };
  for (const auto& [program, args] : cases) {
    JobStatus s = h.git_job(args);
    // git shows a signature program's output on stdout (log --show-signature).
    std::string err = h.stream(s, "stdout") + h.stream(s, "stderr");
    BOOST_TEST(contains(err, "HOSTILE-" + program + " ran"),
               program << " did not run without the flags: " << err);
  }
  // Outside the sandbox the marker would land; inside, the marker directory is not there.
  BOOST_TEST(h.markers_present().empty());
}

// blame.ignoreRevsFile names a file git blame reads and, where a line is no commit, quotes in
// its error: a repository config pointing it outside repoRoot showed the first line of any file
// the git sandbox sees (/etc/os-release, /proc/self/environ), found by a review (session 29).
// git_blame passes --no-ignore-revs-file. Control: the same job without it quotes the file.
BOOST_AUTO_TEST_CASE(blame_reads_no_file_the_repository_config_names) {
  HostileEnv h;
  h.repo.git({"config", "blame.ignoreRevsFile", "/etc/os-release"});
  auto r = h.call("git_blame", {{"path", "src/lib.c"}});
  BOOST_REQUIRE_MESSAGE(!r.is_error, r.text);
  BOOST_TEST(r.structured["ok"].get<bool>(), r.structured.dump());
  std::string err = read_all_bytes(*h.engine, "s1", r.structured["taskId"], "stderr");
  BOOST_TEST(!contains(err + r.structured.dump(), "PRETTY_NAME"), err);
  JobStatus ctl = h.git_job({"blame", "src/lib.c"});
  BOOST_TEST(contains(h.stream(ctl, "stderr"), "PRETTY_NAME"), h.stream(ctl, "stderr"));
}

BOOST_AUTO_TEST_CASE(control_plain_git_outside_cordon_runs_every_program) {
  HostileEnv h;
  auto ran = [&](const std::string& program, const std::vector<std::string>& args) {
    h.clear_markers();
    auto r = h.repo.run(args);
    std::set<std::string> m = h.markers_present();
    BOOST_TEST(m.count(program) == 1u,
               program << " did not run under plain git; stderr: " << r.err);
    BOOST_TEST(contains(r.out + r.err, "HOSTILE-" + program + " ran"), program);
  };
  ran("fsmonitor", {"ls-files"});
  ran("textconv", {"show", h.third});
  ran("drivercmd", {"diff", h.repo.first, h.third});
  ran("extdiff", {"diff", h.repo.first, h.third});  // diff.external from the included file
  ran("smudge", {"blame", h.third, "--", "src/lib.c"});
  ran("clean", {"blame", "src/lib.c"});
  ran("gpg", {"log", "-1", "signed"});
  ran("alias", {"hostile"});
  ran("subdiff", {"diff", "--no-ext-diff", "--no-textconv", h.sub_before, h.sub_after});
  // The hook: a stat-dirty index is refreshed and written, which runs post-index-change.
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  ::utimensat(AT_FDCWD, (h.repo.dir + "/src/lib.c").c_str(), times, 0);
  ::utimensat(AT_FDCWD, (h.repo.dir + "/README.md").c_str(), times, 0);
  ran("hook", {"status"});

  // The pager runs when stdout is a terminal.
  h.clear_markers();
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  BOOST_REQUIRE(master >= 0);
  BOOST_REQUIRE(::grantpt(master) == 0 && ::unlockpt(master) == 0);
  int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  BOOST_REQUIRE(slave >= 0);
  ProcessOptions o;
  o.env = plain_git_env(h.repo.home);
  o.stdin_fd = slave;
  o.stdout_fd = slave;
  auto r = run_process({kGitBin, "-C", h.repo.dir, "log", "-1", "--no-show-signature"}, o);
  ::close(slave);
  ::close(master);
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(h.markers_present().count("pager") == 1u);
}

// A partial clone fetches a missing object from its promisor remote, and an `ext::` remote's
// transport is a command: a repository that names one and allows ext
// (protocol.ext.allow=always, which outranks the command line's protocol.allow=never) ran it on
// a show of the missing blob wherever GIT_NO_LAZY_FETCH was not known (git before 2.45 without
// the backport), found by a review (session 33). Two walls of the git policy's env stop it, each
// alone: GIT_NO_LAZY_FETCH and GIT_ALLOW_PROTOCOL. Control: without both the command runs.
BOOST_AUTO_TEST_CASE(a_promisor_remote_runs_no_transport_by_either_wall) {
  HostileEnv h;
  h.repo.write("lazy.txt", "fetched lazily\n");
  h.repo.git({"add", "lazy.txt"});
  h.repo.git({"commit", "-q", "-m", "lazy: a blob to lose"});
  std::string blob = h.repo.git({"rev-parse", "HEAD:lazy.txt"});
  blob = blob.substr(0, blob.find('\n'));
  BOOST_REQUIRE(std::filesystem::remove(h.repo.dir + "/.git/objects/" + blob.substr(0, 2) + "/" +
                                        blob.substr(2)));
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"core.repositoryformatversion", "1"},
           {"extensions.partialClone", "origin"},
           {"remote.origin.url", "ext::" + h.bin + "/transport"},
           {"remote.origin.promisor", "true"},
           {"protocol.ext.allow", "always"}}) {
    h.repo.git({"config", key, value});
  }
  h.clear_markers();  // the setup's own git calls ran the armed fsmonitor and hook

  auto r = h.call("git_show", {{"ref", "HEAD"}, {"path", "lazy.txt"}});
  BOOST_REQUIRE_MESSAGE(!r.is_error, r.text);
  std::string err = read_all_bytes(*h.engine, "s1", r.structured["taskId"], "stderr");
  BOOST_TEST(announced(err) == "", "the git tool ran a transport: " << err);
  BOOST_TEST((contains(err, "lazy fetching disabled") || contains(err, "not allowed")), err);
  BOOST_TEST(h.markers_present().empty());

  // Each wall alone: the host git with cordon's hardened argv and the git policy's very env,
  // one or both of the two left out.
  auto main = policy::parse_policy(h.env.policy.dump());
  BOOST_REQUIRE_MESSAGE(main.has_value(), describe(main));
  auto bound = policy::bind_policy(*main, policy::HostPathGuard::from_system({}));
  BOOST_REQUIRE_MESSAGE(bound.has_value(), describe(bound));
  auto git_policy = policy::git_job_policy(*main);
  BOOST_REQUIRE_MESSAGE(git_policy.has_value(), describe(git_policy));
  BOOST_REQUIRE(git_policy->env.set.count("GIT_NO_LAZY_FETCH") == 1);
  BOOST_REQUIRE(git_policy->env.set.count("GIT_ALLOW_PROTOCOL") == 1);
  auto show_without = [&](const std::set<std::string>& left_out) {
    ProcessOptions o;
    o.env = std::vector<std::string>{"PATH=/usr/bin:/bin", "GIT_DIR=" + h.repo.dir + "/.git"};
    for (const auto& [name, value] : git_policy->env.set) {
      if (left_out.count(name) == 0) o.env->push_back(name + "=" + value);
    }
    std::vector<std::string> argv = {kGitBin};
    argv.insert(argv.end(), git::hardened_prefix().begin(), git::hardened_prefix().end());
    argv.insert(argv.end(), {"show", "--no-textconv", "HEAD:lazy.txt"});
    h.clear_markers();
    return run_process(argv, o);
  };
  auto only_allow_list = show_without({"GIT_NO_LAZY_FETCH"});
  BOOST_TEST(announced(only_allow_list.err) == "", only_allow_list.err);
  BOOST_TEST(contains(only_allow_list.err, "transport 'ext' not allowed"), only_allow_list.err);
  BOOST_TEST(h.markers_present().empty());
  auto only_no_lazy = show_without({"GIT_ALLOW_PROTOCOL"});
  BOOST_TEST(announced(only_no_lazy.err) == "", only_no_lazy.err);
  BOOST_TEST(contains(only_no_lazy.err, "lazy fetching disabled"), only_no_lazy.err);
  BOOST_TEST(h.markers_present().empty());
  auto neither = show_without({"GIT_NO_LAZY_FETCH", "GIT_ALLOW_PROTOCOL"});
  BOOST_TEST(announced(neither.err) == "transport ", neither.err);
  BOOST_TEST(h.markers_present().count("transport") == 1u);
}

// Files of the git directory that git reads and quotes in its errors (info/grafts: "bad graft
// data: <line>"; packed-refs: "unexpected line"; shallow), made symlinks to files outside the
// repository that the git sandbox could see, showed them to the caller: /etc's files and the
// sandbox's /proc/self/mountinfo, found by a review (session 33). The git tools' jobs now read
// only the repository and the system's program trees (Landlock; /usr stays readable, so the
// links point at files that are /etc's own, not links into /usr as /etc/os-release is): every
// git job of the session,
// the tools' own rev-parse ones included, shows nothing of them. Control: the same git command
// under the main policy (which reads /etc and /proc) quotes them.
BOOST_AUTO_TEST_CASE(a_symlink_in_the_git_directory_shows_no_file_outside_the_repository) {
  HostileEnv h;
  const std::string git_dir = h.repo.dir + "/.git";
  auto link = [&](const std::string& target, const std::string& name) {
    std::filesystem::remove(git_dir + "/" + name);
    BOOST_REQUIRE_MESSAGE(::symlink(target.c_str(), (git_dir + "/" + name).c_str()) == 0, name);
  };
  std::set<std::string> controls;  // the main policy's jobs, which do quote the files
  auto everything_shown = [&](const api::ToolResult& r) {
    std::string all = r.text + r.structured.dump();
    auto jobs = h.engine->list("s1", std::nullopt);
    BOOST_REQUIRE(jobs.has_value());
    for (const auto& j : *jobs) {
      if (controls.count(j.task_id) != 0) continue;
      all += read_all_bytes(*h.engine, "s1", j.task_id, "stdout");
      all += read_all_bytes(*h.engine, "s1", j.task_id, "stderr");
    }
    return all;
  };
  for (const std::string name : {"info/grafts", "packed-refs", "shallow"}) {
    BOOST_TEST_CONTEXT(name) {
      link("/etc/passwd", name);
      for (const json& args : {json::object(), json{{"ref", "no-such-branch"}}}) {
        std::string shown = everything_shown(h.call("git_log", args));
        BOOST_TEST(!contains(shown, "root:x:0:0"), shown);
      }
      // Control: under the main policy git reads the file and quotes it.
      JobStatus quoted = h.git_job({"log", "-1", "--no-show-signature"}, JobPolicy::kMain);
      controls.insert(quoted.task_id);
      BOOST_TEST(contains(h.stream(quoted, "stderr"), "root:x:0:0"), h.stream(quoted, "stderr"));
      std::filesystem::remove(git_dir + "/" + name);
    }
  }
  link("/proc/self/mountinfo", "info/grafts");
  std::string shown = everything_shown(h.call("git_log", json::object()));
  BOOST_TEST(!contains(shown, "bad graft data"), shown);
  BOOST_TEST(!contains(shown, " - tmpfs "), shown);

  // Control: the main policy's sandbox reads it, and git quotes it.
  JobStatus mountinfo = h.git_job({"log", "-1", "--no-show-signature"}, JobPolicy::kMain);
  BOOST_TEST(contains(h.stream(mountinfo, "stderr"), "bad graft data"),
             h.stream(mountinfo, "stderr"));
}

BOOST_AUTO_TEST_CASE(the_repository_stays_read_only_even_if_a_flag_slipped_through) {
  HostileEnv h;
  std::string target = h.repo.dir + "/.git/pwned";
  std::string config_before = read_file(h.repo.dir + "/.git/config");
  // Under the git tools' policy, argv built by hand (as if validation had let a flag through).
  JobStatus out = h.git_job(
      {"-c", "core.fsmonitor=false", "log", "-1", "--no-show-signature", "--output=" + target});
  BOOST_TEST(out.exit_code.value_or(0) != 0);
  BOOST_TEST(contains(h.stream(out, "stderr"), "Read-only file system"), h.stream(out, "stderr"));
  BOOST_TEST(::access(target.c_str(), F_OK) != 0);
  JobStatus cfg = h.git_job({"config", "--file", h.repo.dir + "/.git/config", "core.pwned", "1"});
  BOOST_TEST(cfg.exit_code.value_or(0) != 0);
  BOOST_TEST(contains(h.stream(cfg, "stderr"), "Read-only file system"), h.stream(cfg, "stderr"));
  BOOST_TEST(read_file(h.repo.dir + "/.git/config") == config_before);

  // Control: the same argv under the main policy (which allows git and binds its working
  // root, which holds the repository, read-write) writes the file.
  JobStatus ctl = h.git_job(
      {"-c", "core.fsmonitor=false", "log", "-1", "--no-show-signature", "--output=" + target},
      JobPolicy::kMain);
  BOOST_TEST(ctl.exit_code.value_or(-1) == 0, h.stream(ctl, "stderr"));
  BOOST_TEST(::access(target.c_str(), F_OK) == 0);
}

BOOST_AUTO_TEST_CASE(a_git_file_or_alternates_leading_outside_the_root_are_refused) {
  HostileEnv h;
  // Another repository outside repoRoot, with its own armed config.
  GitRepo other(h.env.box.base + "/other", h.env.box.base + "/home2");
  other.write("other-only.txt", "a commit the hostile repository does not have\n");
  other.git({"add", "."});
  other.git({"commit", "-q", "-m", "other only"});
  std::string other_only = other.head();
  std::string dotgit = h.repo.dir + "/.git";
  std::string real = h.repo.dir + "/.git-real";
  std::ofstream(other.dir + "/.git/config", std::ios::app)
      << "[core]\n\tfsmonitor = " << real << "/hostile-bin/fsmonitor\n";

  BOOST_REQUIRE(::rename(dotgit.c_str(), real.c_str()) == 0);
  std::ofstream(dotgit) << "gitdir: " << other.dir << "/.git\n";
  auto r = h.call("git_ls_files", json::object());
  BOOST_TEST(r.is_error);
  BOOST_TEST(contains(r.text, "is a file pointing to \"" + other.dir +
                                  "/.git\", outside the "
                                  "repository root"),
             r.text);
  // Control: plain git follows the link and runs the other repository's program.
  h.clear_markers();
  h.repo.run({"ls-files"});
  BOOST_TEST(h.markers_present().count("fsmonitor") == 1u);
  // A .git file pointing inside the root is followed.
  std::ofstream(dotgit) << "gitdir: .git-real\n";
  auto inside = h.call("git_ls_files", json::object());
  BOOST_TEST(!inside.is_error, inside.text);
  BOOST_TEST(contains(inside.structured["preview"], "src/lib.c"), inside.structured.dump());
  // A .git file naming a path inside the root that is a symlink to the other repository:
  // refused by where it resolves, not by its text. Control: plain git follows it.
  std::string inner = h.repo.dir + "/inner";
  BOOST_REQUIRE(::symlink((other.dir + "/.git").c_str(), inner.c_str()) == 0);
  std::ofstream(dotgit) << "gitdir: inner\n";
  auto via = h.call("git_ls_files", json::object());
  BOOST_TEST(via.is_error);
  BOOST_TEST(contains(via.text, "git directory `" + inner + "` leads outside the repository root"),
             via.text);
  h.clear_markers();
  h.repo.run({"ls-files"});
  BOOST_TEST(h.markers_present().count("fsmonitor") == 1u);
  ::unlink(inner.c_str());
  // A symlinked .git is refused.
  ::unlink(dotgit.c_str());
  BOOST_REQUIRE(::symlink(real.c_str(), dotgit.c_str()) == 0);
  BOOST_TEST(contains(h.call("git_ls_files", json::object()).text, "is a symlink"));
  ::unlink(dotgit.c_str());
  BOOST_REQUIRE(::rename(real.c_str(), dotgit.c_str()) == 0);

  // Alternates outside the root: refused. Control: plain git reads objects through them.
  std::string alternates = dotgit + "/objects/info/alternates";
  std::filesystem::create_directories(dotgit + "/objects/info");
  std::ofstream(alternates) << other.dir << "/.git/objects\n";
  auto alt = h.call("git_log", json::object());
  BOOST_TEST(alt.is_error);
  BOOST_TEST(contains(alt.text, "borrows objects from \"" + other.dir + "/.git/objects\""),
             alt.text);
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);
  ::unlink(alternates.c_str());
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() != 0);
  BOOST_TEST(!h.call("git_log", json::object()).is_error);

  // Three more forms that reached outside, found by a review (session 33), each refused; the
  // control, plain git, reads the other repository's objects through each. Nested: an
  // alternate inside the root whose own alternates lead out.
  const std::string store = h.repo.dir + "/store";
  std::filesystem::create_directories(store + "/objects/info");
  std::ofstream(store + "/objects/info/alternates") << other.dir << "/.git/objects\n";
  std::ofstream(alternates) << store << "/objects\n";
  auto nested = h.call("git_log", json::object());
  BOOST_TEST(nested.is_error);
  BOOST_TEST(contains(nested.text, "borrows objects from \"" + other.dir + "/.git/objects\""),
             nested.text);
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);
  // C-quoted: git unquotes the entry; its text is no path.
  std::ofstream(alternates) << "\"" << other.dir << "/.git/objects\"\n";
  auto quoted_entry = h.call("git_log", json::object());
  BOOST_TEST(quoted_entry.is_error);
  BOOST_TEST(contains(quoted_entry.text, "has a quoted entry"), quoted_entry.text);
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);
  // Through a symlink inside the root: refused by where it resolves.
  const std::string outlink = h.repo.dir + "/outlink";
  BOOST_REQUIRE(::symlink((other.dir + "/.git").c_str(), outlink.c_str()) == 0);
  std::ofstream(alternates) << outlink << "/objects\n";
  auto through = h.call("git_log", json::object());
  BOOST_TEST(through.is_error);
  BOOST_TEST(contains(through.text, "alternate object directory `" + outlink +
                                        "/objects` leads outside the repository root"),
             through.text);
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);
  ::unlink(outlink.c_str());
  // Found by the review of that fix: a `..` after a symlink, which git's realpath takes after
  // the link and a textual normalisation before it (l -> the repository root, so
  // objects/l/../../other/.git/objects is the other repository's store, not one inside);
  // and an entry git takes whole while a trimmed one named something else (`l2 ` with its
  // trailing space, a link out, checked as the missing `l2`).
  const std::string store_dir = dotgit + "/objects";
  const std::string up = store_dir + "/l", spaced = store_dir + "/l2 ";
  BOOST_REQUIRE(::symlink(h.repo.dir.c_str(), up.c_str()) == 0);
  BOOST_REQUIRE(::symlink((other.dir + "/.git/objects").c_str(), spaced.c_str()) == 0);
  const std::string via_up =
      "l/../../" + std::filesystem::path(other.dir).filename().string() + "/.git/objects";
  BOOST_REQUIRE_MESSAGE(
      std::filesystem::equivalent(store_dir + "/" + via_up, other.dir + "/.git/objects"), via_up);
  for (const std::string& entry : {via_up, std::string("l2 ")}) {
    BOOST_TEST_CONTEXT(entry) {
      std::ofstream(alternates) << entry << "\n";
      auto refused = h.call("git_log", json::object());
      BOOST_TEST(refused.is_error);
      BOOST_TEST(contains(refused.text, "leads outside the repository root"), refused.text);
      BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);
    }
  }
  ::unlink(up.c_str());
  ::unlink(spaced.c_str());
  ::unlink(alternates.c_str());
  std::filesystem::remove_all(store);
  BOOST_TEST(!h.call("git_log", json::object()).is_error);
  // A .git file is read as git reads it, its path the rest of the file: a second line is part
  // of it, which a first-line reading checked as a missing `x` inside the root.
  BOOST_REQUIRE(::rename(dotgit.c_str(), real.c_str()) == 0);
  std::filesystem::create_directories(h.repo.dir + "/x\n");
  std::ofstream(dotgit) << "gitdir: x\n/../../../"
                        << std::filesystem::path(other.dir).filename().string() << "/.git\n";
  auto two_lines = h.call("git_ls_files", json::object());
  BOOST_TEST(two_lines.is_error);
  BOOST_TEST(contains(two_lines.text, "outside the repository root"), two_lines.text);
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);  // plain git follows
  ::unlink(dotgit.c_str());
  std::filesystem::remove_all(h.repo.dir + "/x\n");
  BOOST_REQUIRE(::rename(real.c_str(), dotgit.c_str()) == 0);
  BOOST_TEST(!h.call("git_log", json::object()).is_error);

  // An objects directory that is a symlink to the other repository's: refused. Control: plain
  // git reads the other repository's objects through it.
  std::string objects = dotgit + "/objects", kept = dotgit + "/objects-kept";
  BOOST_REQUIRE(::rename(objects.c_str(), kept.c_str()) == 0);
  BOOST_REQUIRE(::symlink((other.dir + "/.git/objects").c_str(), objects.c_str()) == 0);
  auto linked = h.call("git_log", json::object());
  BOOST_TEST(linked.is_error);
  BOOST_TEST(contains(linked.text, "object directory `" + objects + "` leads outside"),
             linked.text);
  BOOST_TEST(h.repo.run({"cat-file", "-e", other_only}).exit_code() == 0);
  ::unlink(objects.c_str());
  BOOST_REQUIRE(::rename(kept.c_str(), objects.c_str()) == 0);
  BOOST_TEST(!h.call("git_log", json::object()).is_error);
}

// What the checks of a repository cost the host is bounded, and a link out is answered without
// a look where it leads (a red-team review, session 40). The alternates: `.` 15 times made the
// check follow 15^5 entries on the host (84 s of cordon's CPU, outside any job, its timeout and
// a cancel); each object directory is now read once, and at most 256 entries are followed in
// all. A link out: the answer said whether its target existed (a refusal for one that does, a
// git error for one that does not); now both are the same refusal.
BOOST_AUTO_TEST_CASE(the_checks_of_a_hostile_repository_are_bounded_and_look_at_nothing_outside) {
  HostileEnv h;
  const std::string alternates = h.repo.dir + "/.git/objects/info/alternates";
  std::filesystem::create_directories(h.repo.dir + "/.git/objects/info");
  {
    std::ofstream out(alternates);
    for (int i = 0; i < 200; ++i) out << ".\n";
  }
  auto self = h.call("git_log", json::object());
  BOOST_TEST(!self.is_error, self.text);
  {
    std::ofstream out(alternates);
    for (int i = 0; i < 300; ++i) {
      const std::string d = h.repo.dir + "/stores/s" + std::to_string(i);
      std::filesystem::create_directories(d);
      out << d << "\n";
    }
  }
  auto many = h.call("git_log", json::object());
  BOOST_TEST(many.is_error);
  BOOST_TEST(contains(many.text, "name more than 256 object directories"), many.text);
  ::unlink(alternates.c_str());
  std::filesystem::remove_all(h.repo.dir + "/stores");

  const std::string outside = h.env.box.base + "/outside";
  std::filesystem::create_directories(outside + "/there");
  std::map<std::string, std::string> answers;
  for (const std::string target : {outside + "/there", outside + "/missing"}) {
    const std::string link = h.repo.dir + "/out";
    BOOST_REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
    std::ofstream(alternates) << link << "\n";
    auto r = h.call("git_log", json::object());
    BOOST_TEST(r.is_error, target);
    answers[target] = r.text;
    ::unlink(link.c_str());
  }
  BOOST_TEST(answers[outside + "/there"] == answers[outside + "/missing"]);
  BOOST_TEST(contains(answers[outside + "/missing"],
                      "alternate object directory `" + h.repo.dir + "/out` leads outside"),
             answers[outside + "/missing"]);
  ::unlink(alternates.c_str());
  BOOST_TEST(!h.call("git_log", json::object()).is_error);
}

BOOST_AUTO_TEST_CASE(enabling_git_never_lets_run_command_run_git) {
  // The main policy does not allow git; the git section is set.
  HostileEnv h(json::object({{"allowedExecutables", {"/bin/sh", "/usr/bin/true"}}}));
  const api::Tool* bg = api::find_tool("run_command_bg");
  BOOST_REQUIRE(bg != nullptr);
  auto r = api::call_tool(*h.engine, *bg, "s1", {{"argv", {kGitBin, "log"}}});
  BOOST_TEST(r.is_error);
  BOOST_TEST(contains(r.text, "Executable \"/usr/bin/git\" is not allowed"), r.text);
  // The engine refuses it too when asked for the main policy directly.
  StartOptions o;
  o.argv = {kGitBin, "log"};
  auto s = h.engine->start("s1", o);
  BOOST_TEST(!s.has_value());
  // And the git policy allows nothing but git: not even an executable the main policy allows.
  StartOptions sh;
  sh.policy = JobPolicy::kGit;
  sh.argv = {"/bin/sh", "-c", "true"};
  auto shr = h.engine->start("s1", sh);
  BOOST_TEST(!shr.has_value());
  BOOST_TEST(contains(shr.error().message(),
                      "Allowed executables, matched exactly as argv[0]: "
                      "/usr/bin/git"),
             shr.error().message());
  // Meanwhile the git tools work.
  BOOST_TEST(!h.call("git_ls_files", json::object()).is_error);
}
