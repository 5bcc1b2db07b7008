#define BOOST_TEST_MODULE engine_policy
#include <sys/stat.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <set>

#include "helpers/engine_fixture.hpp"

// The policy as Engine::start applies it: every refusal in its documented order, no job and
// no file for a refused start; a missing allowlisted executable settles as `failed`; the
// command's environment is built fresh.

using namespace cordon;
using namespace cordon::test;
using namespace std::chrono_literals;

namespace {

size_t job_dirs(const EngineEnv& env) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(env.state_dir + "/jobs")) {
    (void)e;
    ++n;
  }
  return n;
}

// Start must refuse (kRefused) with a message containing every piece, and leave nothing.
void expect_refusal(Engine& e, const EngineEnv& env, const StartOptions& o,
                    const std::vector<std::string>& pieces) {
  auto r = e.start("s", o);
  BOOST_REQUIRE_MESSAGE(!r.has_value(), "started: " << (r ? r->task_id : ""));
  BOOST_TEST((r.error().code() == ErrorCode::kRefused), r.error().message());
  for (const auto& p : pieces) {
    BOOST_TEST(r.error().message().find(p) != std::string::npos,
               "`" << p << "` not in: " << r.error().message());
  }
  BOOST_TEST(job_dirs(env) == 0u);
  BOOST_TEST(e.known_ids("s").value().empty());
  BOOST_TEST(e.counters("s").running == 0u);
}

// Starts `o` in session "s", waits for it to settle and returns what it wrote to stderr.
std::string settled_stderr(Engine& e, const EngineEnv& env, const StartOptions& o) {
  auto s = e.start("s", o);
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e.status("s", s->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_REQUIRE(st->settled());
  BOOST_REQUIRE(st->stderr_artifact.has_value());
  return read_file(env.artifact_path(st->stderr_artifact->artifact_id));
}

}  // namespace

BOOST_AUTO_TEST_CASE(without_a_policy_every_start_is_refused_with_how_to_set_one) {
  EngineEnv env;
  EngineOptions o = env.options();
  o.policy_path.clear();
  auto e = Engine::open(o);
  BOOST_REQUIRE_MESSAGE(e.has_value(), describe(e));
  expect_refusal(**e, env, {.argv = {"/bin/true"}}, {"no policy", "--policy"});
}

BOOST_AUTO_TEST_CASE(every_refusal_in_the_documented_order) {
  EngineEnv env(nlohmann::json{
      {"maxTimeoutMs", 60000},
      {"defaultTimeoutMs", 30000},
      {"env", {{"set", {{"FIXED", "1"}}}}},
      {"rules",
       {{{"argvPrefix", {"/usr/bin/git", "push"}},
         {"refuse", "pushing is not allowed here; commit locally and report the branch"}},
        {{"argvContains", "--force"}, {"refuse", "no --force: say why you need it"}}}}});
  std::filesystem::create_directory(env.box.root + "/sub");
  std::filesystem::create_directory(env.box.root + "-evil");  // a sibling sharing the prefix
  std::filesystem::create_directory_symlink("/etc", env.box.root + "/out");
  env.box.write("file", "x");
  auto e = open_engine(env);
  const std::string root = env.box.root;

  // 2. argv shape.
  expect_refusal(*e, env, {.argv = {}}, {"argv is empty", "/usr/bin/make"});
  expect_refusal(*e, env, {.argv = {"/bin/echo", std::string("a\0b", 3)}}, {"argv[1]", "NUL"});
  expect_refusal(*e, env, {.argv = {""}}, {"argv[0] is empty"});
  // 3. No shell.
  expect_refusal(*e, env, {.argv = {"/bin/echo hi; rm -rf /"}}, {"NO shell", "argv array"});
  expect_refusal(*e, env, {.argv = {"git status"}}, {"NO shell", "[\"git\", \"status\"]"});
  expect_refusal(*e, env, {.argv = {"$(id)"}}, {"NO shell"});
  // 4. Allowlist, exactly: no basename, no PATH, no other directory.
  expect_refusal(*e, env, {.argv = {"sh"}},
                 {"Executable \"sh\" is not allowed", "did you mean", "/bin/sh", "/usr/bin/cat"});
  expect_refusal(*e, env, {.argv = {"/tmp/evil/sh"}}, {"is not allowed"});
  expect_refusal(*e, env, {.argv = {"/usr/bin/wget"}}, {"\"/usr/bin/wget\" is not allowed"});
  expect_refusal(*e, env, {.argv = {"/bin/../bin/sh"}}, {"is not allowed"});
  // 5. cwd inside the root.
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .cwd = root + "-evil"},
                 {"outside the working root", root});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .cwd = "out"}, {"outside the working root"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .cwd = "../"}, {"outside the working root"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .cwd = "/etc"}, {"outside the working root"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .cwd = "missing"}, {"does not exist"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .cwd = "file"}, {"not a directory"});
  // 6. Rules: the first match's text is the whole refusal, verbatim.
  {
    auto r = e->start("s", {.argv = {"/usr/bin/git", "push", "origin"}});
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST(r.error().message() ==
               "pushing is not allowed here; commit locally and report the branch");
    auto f = e->start("s", {.argv = {"/bin/echo", "--force"}});
    BOOST_REQUIRE(!f.has_value());
    BOOST_TEST(f.error().message() == "no --force: say why you need it");
    BOOST_TEST(job_dirs(env) == 0u);
  }
  // 7. Timeout.
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .timeout_ms = 0}, {"timeoutMs 0"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .timeout_ms = 60001},
                 {"timeoutMs 60001", "60000"});
  // 8. env.
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .env = {{"LD_PRELOAD", "/x.so"}}}, {"LD_"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .env = {{"FIXED", "2"}}}, {"fixed by"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .env = {{"1BAD", "x"}}}, {"not a variable"});

  // The order: with several faults, the earliest check answers.
  expect_refusal(*e, env, {.argv = {"wget -q", "--force"}, .cwd = "/etc", .timeout_ms = 0},
                 {"NO shell"});
  expect_refusal(*e, env, {.argv = {"/usr/bin/wget", "--force"}, .cwd = "/etc"},
                 {"is not allowed"});
  expect_refusal(*e, env, {.argv = {"/bin/echo", "--force"}, .cwd = "/etc", .timeout_ms = 0},
                 {"outside the working root"});
  expect_refusal(*e, env, {.argv = {"/bin/echo", "--force"}, .timeout_ms = 0}, {"no --force"});
  expect_refusal(*e, env, {.argv = {"/bin/true"}, .timeout_ms = 0, .env = {{"LD_X", "1"}}},
                 {"timeoutMs 0"});

  // A clean start still works on the same engine, and a relative cwd is taken from the root.
  auto ok = e->start("s", {.argv = {"/bin/sh", "-c", "pwd"}, .cwd = "sub"});
  BOOST_REQUIRE_MESSAGE(ok.has_value(), describe(ok));
  auto st = e->status("s", ok->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited");
  BOOST_TEST(st->cwd == root + "/sub");
}

// The executable's identity is checked at every start: a pin refuses changed content, a file
// others can write is refused, and a fixed file is picked up without a restart.
BOOST_AUTO_TEST_CASE(executable_identity_is_checked_at_every_start) {
  EngineEnv env;
  std::string tool = env.box.base + "/tool";
  std::filesystem::copy_file("/usr/bin/true", tool);
  ::chmod(tool.c_str(), 0755);
  std::string wrong(64, '0');
  env.policy["allowedExecutables"] = {tool, {{"path", "/bin/echo"}, {"sha256", wrong}}};
  env.write_policy();
  auto e = open_engine(env);
  expect_refusal(*e, env, {.argv = {"/bin/echo", "x"}}, {"sha256 pin", wrong});
  ::chmod(tool.c_str(), 0757);
  expect_refusal(*e, env, {.argv = {tool}}, {"writable by group or others", "chmod go-w"});
  ::chmod(tool.c_str(), 0755);
  auto ok = e->start("s", {.argv = {tool}});
  BOOST_REQUIRE_MESSAGE(ok.has_value(), describe(ok));
  auto st = e->status("s", ok->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited", st->error);
  BOOST_TEST(st->exit_code.value_or(-1) == 0);
}

BOOST_AUTO_TEST_CASE(a_missing_allowlisted_executable_settles_as_failed) {
  EngineEnv env;
  const std::string missing = "/usr/bin/cordon-no-such-tool";
  env.policy["allowedExecutables"].push_back(missing);
  env.write_policy();
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {missing, "--flag"}, .label = "gone"});
  // Not a refusal: the request was fine, the host is not.
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  BOOST_TEST(!s->task_id.empty());
  auto st = e->status("s", s->task_id, 20s);
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "failed");
  BOOST_TEST(st->error.find(missing) != std::string::npos, st->error);
  BOOST_TEST(!st->ended_at.empty());
  BOOST_TEST(st->label == "gone");
  BOOST_TEST((st->argv == std::vector<std::string>{missing, "--flag"}));
  BOOST_TEST(st->tail_preview == "(the command printed nothing)");
  BOOST_TEST(e->counters("s").running == 0u);
  // It is a job like any other: listed, paged (empty), banked, removable.
  auto l = e->list("s", std::string("failed"));
  BOOST_REQUIRE(l.has_value());
  BOOST_TEST(l->size() == 1u);
  auto p = e->output("s", s->task_id, {});
  BOOST_REQUIRE_MESSAGE(p.has_value(), describe(p));
  BOOST_TEST(p->content.empty());
  BOOST_TEST(p->complete);
  BOOST_REQUIRE(st->stdout_artifact.has_value());
  auto a = e->retrieve(st->session, st->stdout_artifact->artifact_id, {});
  BOOST_TEST(a.has_value(), describe(a));
  BOOST_TEST(e->remove("s", s->task_id).has_value());
}

BOOST_AUTO_TEST_CASE(the_environment_is_replaced_by_the_policys_variables) {
  ::setenv("CORDON_TEST_LEAK", "leaked", 1);
  ::setenv("CORDON_TEST_PASS", "passed", 1);
  EngineEnv env(nlohmann::json{
      {"env", {{"set", {{"FIXED", "from-policy"}}}, {"pass", {"CORDON_TEST_PASS"}}}}});
  auto e = open_engine(env);
  auto s = e->start("s", {.argv = {"/usr/bin/env"}, .env = {{"ASKED", "from-request"}}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto st = e->status("s", s->task_id, 20s);
  BOOST_REQUIRE(st.has_value());
  BOOST_REQUIRE(st->state == "exited");
  std::string text = read_file(env.artifact_path(st->stdout_artifact->artifact_id));
  std::map<std::string, std::string> got;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    BOOST_REQUIRE(eq != std::string::npos);
    got[line.substr(0, eq)] = line.substr(eq + 1);
  }
  std::set<std::string> names;
  for (auto& [k, v] : got) names.insert(k);
  BOOST_TEST((names == std::set<std::string>{"ASKED", "CORDON_TEST_PASS", "FIXED", "HOME", "LANG",
                                             "PATH", "TERM"}),
             text);
  BOOST_TEST(got["PATH"] == "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin");
  BOOST_TEST(got["HOME"] == "/tmp/home");
  BOOST_TEST(got["LANG"] == "C.UTF-8");
  BOOST_TEST(got["FIXED"] == "from-policy");
  BOOST_TEST(got["ASKED"] == "from-request");
  BOOST_TEST(got["CORDON_TEST_PASS"] == "passed");
  ::unsetenv("CORDON_TEST_LEAK");
  ::unsetenv("CORDON_TEST_PASS");
}

// A seccomp profile libseccomp cannot compile as written (a masked compare with bits outside
// its mask) fails Engine::open with the reason, not every start after it; the same policy
// with the rule fixed opens and runs.
BOOST_AUTO_TEST_CASE(a_seccomp_profile_the_compiler_refuses_fails_open_not_the_first_start) {
  EngineEnv env;
  auto write_profile = [&](uint64_t value_two) {
    nlohmann::json prof = nlohmann::json::parse(read_file(build_dir() + "/seccomp/default.json"));
    prof["syscalls"].push_back({{"names", {"mbind"}},
                                {"action", "SCMP_ACT_ERRNO"},
                                {"args",
                                 {{{"index", 1},
                                   {"op", "SCMP_CMP_MASKED_EQ"},
                                   {"value", 0xff},
                                   {"valueTwo", value_two}}}}});
    std::ofstream(env.box.base + "/profile.json") << prof.dump();
  };
  env.policy["seccompProfile"] = env.box.base + "/profile.json";
  env.write_policy();
  write_profile(0x100);
  auto refused = env.open();
  BOOST_REQUIRE(!refused.has_value());
  const std::string msg = refused.error().message();
  BOOST_TEST(msg.find("seccompProfile") != std::string::npos, msg);
  BOOST_TEST(msg.find("bits outside the mask") != std::string::npos, msg);
  BOOST_TEST(msg.find("profile.json") != std::string::npos, msg);

  write_profile(0x10);  // inside the mask: compiles
  auto e = env.open();
  BOOST_REQUIRE_MESSAGE(e.has_value(), describe(e));
  auto s = (*e)->start("s", {.argv = {"/bin/echo", "ok"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  auto w = (*e)->wait("s", {s->task_id}, std::chrono::seconds(20), true);
  BOOST_REQUIRE_MESSAGE(w.has_value(), describe(w));
  auto st = (*e)->status("s", s->task_id);
  BOOST_REQUIRE(st.has_value());
  BOOST_TEST(st->state == "exited");
  BOOST_TEST(st->exit_code.value_or(-1) == 0);
}

// allowNetlinkRoute reaches the engine's sandboxes, pooled or not: without it a netlink socket
// is EAFNOSUPPORT (its queued replies are charged to no memory cgroup), with it NETLINK_ROUTE
// opens. Three starts each: the later ones may be served by the warm pool, whose entries are
// made with the policy's options (which of them it served is not asserted here; pool_test's
// a_pooled_job_is_confined_like_an_unpooled_one compares the filters).
BOOST_AUTO_TEST_CASE(netlink_route_only_where_the_policy_allows_it) {
  const std::string script =
      "import socket\n"
      "try:\n"
      "    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print('opened')\n"
      "except OSError as e:\n"
      "    print(e.errno)\n";
  for (bool allowed : {false, true}) {
    EngineEnv env(nlohmann::json{{"allowNetlinkRoute", allowed}});
    auto e = open_engine(env);
    for (int i = 0; i < 3; ++i) {
      auto s = e->start("s", {.argv = {"/usr/bin/python3", "-c", script}});
      BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
      auto st = e->status("s", s->task_id, 20s);
      BOOST_REQUIRE(st.has_value());
      BOOST_REQUIRE(st->state == "exited");
      BOOST_TEST(read_file(env.artifact_path(st->stdout_artifact->artifact_id)) ==
                     (allowed ? "opened\n" : std::to_string(EAFNOSUPPORT) + "\n"),
                 "allowed " << allowed << " start " << i);
    }
  }
}

// OPENSSL_CONF names a configuration that loads an "engine", a shared object, into every
// program linked with libcrypto: an allowlisted /usr/bin/openssl (or curl, git, python) ran
// a shared object from the working root, code the allowlist never approved (a review, session
// 34). A request's OPENSSL_CONF is refused; the control fixes the same value with env.set (an
// operator's choice) and shows the object's constructor runs in the sandbox.
BOOST_AUTO_TEST_CASE(a_request_cannot_make_an_allowlisted_program_load_a_shared_object) {
  const std::string marker = "loaded-from-the-root";
  auto setup = [&](EngineEnv& env) {
    env.box.write("evil.c",
                  "#include <unistd.h>\n"
                  "__attribute__((constructor)) static void f(void) {\n"
                  "  write(2, \"" +
                      marker + "\\n\", " + std::to_string(marker.size() + 1) + ");\n}\n");
    auto cc = run_process({"/usr/bin/cc", "-shared", "-fPIC", "-o", env.box.root + "/evil.so",
                           env.box.root + "/evil.c"});
    BOOST_REQUIRE_MESSAGE(cc.exit_code() == 0, cc.err);
    ::chmod((env.box.root + "/evil.so").c_str(), 0755);
    env.box.write("evil.cnf",
                  "openssl_conf = init\n[init]\nengines = engines\n"
                  "[engines]\nevil = evil\n[evil]\ndynamic_path = " +
                      env.box.root + "/evil.so\n");
  };
  const std::string conf_path = "OPENSSL_CONF";
  {
    EngineEnv env;
    env.policy["allowedExecutables"].push_back("/usr/bin/openssl");
    env.write_policy();
    setup(env);
    auto e = open_engine(env);
    expect_refusal(
        *e, env,
        {.argv = {"/usr/bin/openssl", "version"}, .env = {{conf_path, env.box.root + "/evil.cnf"}}},
        {"env OPENSSL_CONF is refused: OpenSSL loads", "leave it out"});
  }
  // Control: the same value through env.set reaches the program, which loads the object.
  EngineEnv env;
  env.policy["allowedExecutables"].push_back("/usr/bin/openssl");
  env.policy["env"] = {{"set", {{conf_path, env.box.root + "/evil.cnf"}}}};
  env.write_policy();
  setup(env);
  auto e = open_engine(env);
  std::string err = settled_stderr(*e, env, {.argv = {"/usr/bin/openssl", "version"}});
  BOOST_TEST(err.find(marker) != std::string::npos, err);
}

// An allowlisted python imports its standard library from bytecode the request planted in the
// root: PYTHONPYCACHEPREFIX moves where python looks for its cached .pyc files, and one
// compiled with an unchecked hash is loaded without a look at its source. Failure fixed (a
// review, session 35): the variable passed, and `python3 -c "import json"` ran the root's code.
BOOST_AUTO_TEST_CASE(a_request_cannot_make_an_allowlisted_python_load_bytecode_from_the_root) {
  const std::string marker = "bytecode-from-the-root";
  auto setup = [&](EngineEnv& env) {
    env.box.write("evil.py", "import sys\nsys.stderr.write('" + marker + "\\n')\n");
    auto c = run_process({"/usr/bin/python3", "-c",
                          "import importlib.util, json, os, py_compile, sys\n"
                          "sys.pycache_prefix = sys.argv[1] + '/pfx'\n"
                          "pyc = importlib.util.cache_from_source(json.__file__)\n"
                          "os.makedirs(os.path.dirname(pyc), exist_ok=True)\n"
                          "py_compile.compile(sys.argv[1] + '/evil.py', cfile=pyc, doraise=True,\n"
                          "  invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n",
                          env.box.root});
    BOOST_REQUIRE_MESSAGE(c.exit_code() == 0, c.err);
  };
  const std::vector<std::string> argv = {"/usr/bin/python3", "-c", "import json"};
  const std::string prefix = "PYTHONPYCACHEPREFIX";
  {
    EngineEnv env;  // the fixture allowlists /usr/bin/python3
    env.write_policy();
    setup(env);
    auto e = open_engine(env);
    expect_refusal(*e, env, {.argv = argv, .env = {{prefix, env.box.root + "/pfx"}}},
                   {"env PYTHONPYCACHEPREFIX is refused: the interpreter loads", "leave it out"});
  }
  // Control: the same value through env.set reaches python, which runs the planted bytecode.
  EngineEnv env;
  env.policy["env"] = {{"set", {{prefix, env.box.root + "/pfx"}}}};
  env.write_policy();
  setup(env);
  auto e = open_engine(env);
  std::string err = settled_stderr(*e, env, {.argv = argv});
  BOOST_TEST(err.find(marker) != std::string::npos, err);
}
