// argv/cwd/env/timeout validation (policy::check_start) on a real directory tree with the
// traps an agent (or a job that rewrote its tree) can set: symlinks out of the root, absolute
// symlinks back in, `..` chains, loops, files where a directory is expected. Invariants:
//  - a start is accepted only for an allowlisted argv[0] (exact), argv without NUL, a cwd that
//    is a real directory inside the resolved root whose (dev, ino) the result carries, a
//    timeout within the policy's maximum, and an env with no LD_* and the policy's fixed
//    values, sorted and unique;
//  - anything else is a refusal (kRefused, or kNotFound for a missing executable) with a
//    message; never kInternal, never an exception.

#include <fuzzer/FuzzedDataProvider.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "fuzz/fuzz_check.hpp"
#include "policy/host_paths.hpp"
#include "policy/policy.hpp"

namespace {

using cordon::fuzz::show;
namespace pol = cordon::policy;

pol::Policy* g_policy = nullptr;
std::string g_root;

const char* kArgv0[] = {"/usr/bin/true",
                        "/usr/bin/env",
                        "/usr/bin/nonexistent-tool",
                        "true",
                        "/usr/bin/true ",
                        "/usr/bin/../bin/true",
                        "/usr/bin//true",
                        "",
                        "/usr/bin/true x",
                        "/bin/true"};
const char* kCwds[] = {".",        "a",           "a/b",           "/",
                       "..",       "out",         "out/etc",       "abs_in",
                       "abs_in/b", "rel_up",      "rel_up/tmp",    "loop",
                       "f",        "a/../..",     "./a//b/",       "a/b/../../..",
                       "dangling", "d sp",        "a/b/up2",       "a/b/up2/a",
                       "self",     "self/self/a", "/proc/self/cwd"};
const char* kEnvNames[] = {"FOO", "LD_PRELOAD", "FIXED", "PATH", "1BAD", "A=B", "", "ld_x", "_ok"};

void mkdir_or_die(const std::string& p) {
  FUZZ_CHECK(::mkdir(p.c_str(), 0755) == 0, "mkdir {}", p);
}
void symlink_or_die(const std::string& target, const std::string& p) {
  FUZZ_CHECK(::symlink(target.c_str(), p.c_str()) == 0, "symlink {}", p);
}

std::string realpath_of(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Under $TMPDIR: tools/fuzz.sh gives each run its own and removes it afterwards.
  const char* tmp = ::getenv("TMPDIR");
  std::string dir =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/cordon-start-fuzz.XXXXXX";
  FUZZ_CHECK(::mkdtemp(dir.data()) != nullptr, "mkdtemp under {}", dir);
  g_root = dir + "/root";
  mkdir_or_die(g_root);
  mkdir_or_die(g_root + "/a");
  mkdir_or_die(g_root + "/a/b");
  mkdir_or_die(g_root + "/d sp");
  FILE* f = std::fopen((g_root + "/f").c_str(), "w");
  FUZZ_CHECK(f != nullptr, "create f");
  std::fclose(f);
  symlink_or_die("/", g_root + "/out");
  symlink_or_die(g_root + "/a", g_root + "/abs_in");
  symlink_or_die("../..", g_root + "/rel_up");
  symlink_or_die("loop", g_root + "/loop");
  symlink_or_die("missing", g_root + "/dangling");
  symlink_or_die("../..", g_root + "/a/b/up2");
  symlink_or_die(".", g_root + "/self");
  std::string text = R"({"allowedExecutables": ["/usr/bin/true", "/usr/bin/env",
      "/usr/bin/nonexistent-tool"], "cwdRoot": ")" +
                     g_root + R"(", "maxTimeoutMs": 5000, "defaultTimeoutMs": 1000,
      "env": {"set": {"FIXED": "1"}},
      "rules": [{"argvPrefix": ["/usr/bin/env", "bad"], "refuse": "no bad"}]})";
  auto p = pol::parse_policy(text);
  FUZZ_CHECK(p.has_value(), "policy: {}", p ? "" : p.error().message());
  g_policy = new pol::Policy(std::move(*p));
  auto bound = pol::bind_policy(*g_policy, pol::HostPathGuard{});
  FUZZ_CHECK(bound.has_value(), "bind: {}", bound ? "" : bound.error().message());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  pol::StartRequest req;
  size_t n = fdp.ConsumeIntegralInRange<size_t>(0, 4);
  for (size_t i = 0; i < n; ++i) {
    req.argv.push_back(fdp.ConsumeBool() ? std::string(fdp.PickValueInArray(kArgv0))
                                         : fdp.ConsumeRandomLengthString(24));
  }
  switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      break;
    case 1:
      req.cwd = fdp.PickValueInArray(kCwds);
      break;
    case 2:
      req.cwd = g_root + "/" + fdp.PickValueInArray(kCwds);
      break;
    default:
      req.cwd = fdp.ConsumeRandomLengthString(40);
  }
  if (fdp.ConsumeBool()) {
    req.timeout_ms = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint64_t>(0, 6000)
                                       : fdp.ConsumeIntegral<uint64_t>();
  }
  size_t envs = fdp.ConsumeIntegralInRange<size_t>(0, 3);
  for (size_t i = 0; i < envs; ++i) {
    std::string name = fdp.ConsumeBool() ? std::string(fdp.PickValueInArray(kEnvNames))
                                         : fdp.ConsumeRandomLengthString(8);
    req.env[name] = fdp.ConsumeRandomLengthString(8);
  }

  auto r = pol::check_start(g_policy, req);
  if (!r) {
    auto code = r.error().code();
    FUZZ_CHECK(code == cordon::ErrorCode::kRefused || code == cordon::ErrorCode::kNotFound,
               "a refusal of kind {}: {}", static_cast<int>(code), r.error().message());
    FUZZ_CHECK(!r.error().message().empty(), "a refusal without a message");
    return 0;
  }
  const pol::CheckedStart& s = *r;
  FUZZ_CHECK(!req.argv.empty() && s.argv == req.argv, "argv changed or empty");
  FUZZ_CHECK(s.argv[0] == "/usr/bin/true" || s.argv[0] == "/usr/bin/env", "argv[0] `{}` accepted",
             show(s.argv[0]));
  for (const auto& a : s.argv) {
    FUZZ_CHECK(a.find('\0') == std::string::npos, "an argument with NUL accepted");
  }
  if (s.argv.size() >= 2 && s.argv[0] == "/usr/bin/env" && s.argv[1] == "bad") {
    FUZZ_CHECK(false, "the rule's prefix was accepted");
  }
  // The cwd: a real directory inside the root, symlink-free, the one the identity names.
  FUZZ_CHECK(s.root == g_root, "root `{}`", s.root);
  FUZZ_CHECK(s.cwd == g_root || s.cwd.rfind(g_root + "/", 0) == 0, "cwd `{}` outside `{}` for {}",
             show(s.cwd), g_root, show(req.cwd.value_or("(none)")));
  FUZZ_CHECK(realpath_of(s.cwd) == s.cwd, "cwd `{}` is not its own real path", show(s.cwd));
  struct stat st {};
  FUZZ_CHECK(::stat(s.cwd.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "cwd `{}` not a directory",
             show(s.cwd));
  FUZZ_CHECK(st.st_dev == s.cwd_dev && st.st_ino == s.cwd_ino, "cwd identity differs");
  if (!req.cwd) {
    FUZZ_CHECK(s.cwd == g_root, "no cwd asked, got `{}`", s.cwd);
  }
  // Timeout.
  FUZZ_CHECK(s.timeout_ms >= 1 && s.timeout_ms <= 5000, "timeout {}", s.timeout_ms);
  FUZZ_CHECK(s.timeout_ms == req.timeout_ms.value_or(1000), "timeout {} for {}", s.timeout_ms,
             req.timeout_ms.value_or(0));
  // Env.
  bool fixed = false;
  std::string prev;
  for (const auto& kv : s.env) {
    size_t eq = kv.find('=');
    FUZZ_CHECK(eq != std::string::npos && eq > 0, "env entry `{}`", show(kv));
    std::string name = kv.substr(0, eq);
    FUZZ_CHECK(name.rfind("LD_", 0) != 0, "env `{}` accepted", show(name));
    FUZZ_CHECK(prev.empty() || prev < name, "env not sorted or repeated at `{}`", show(name));
    prev = name;
    if (name == "FIXED") {
      FUZZ_CHECK(kv == "FIXED=1", "fixed env overridden: `{}`", show(kv));
      fixed = true;
    }
  }
  FUZZ_CHECK(fixed, "the policy's fixed env is missing");
  for (const auto& [k, v] : req.env) {
    std::string want = k + "=" + v;
    bool found = false;
    for (const auto& kv : s.env) {
      found = found || kv == want;
    }
    FUZZ_CHECK(found, "asked env `{}` is not in the result", show(want));
  }
  return 0;
}
