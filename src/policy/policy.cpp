#include "policy/policy.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "base/json_fields.hpp"
#include "policy/json_pointer.hpp"
#include "base/sha256.hpp"
#include "base/strings.hpp"
#include "policy/seccomp_profile.hpp"
#include "sys/fs.hpp"

namespace cordon::policy {
namespace {

using nlohmann::json;

// Bounds. Generous enough for any real deployment, tight enough that a typo (an extra three
// zeros, seconds written as milliseconds) is caught at load time rather than at 3 a.m.
constexpr uint64_t kMaxTimeoutBoundMs = 7ULL * 24 * 3600 * 1000;  // a week
constexpr uint64_t kMaxKillGraceMs = 10ULL * 60 * 1000;
constexpr uint64_t kMaxOutputBytesBound = 1ULL << 40;
constexpr uint64_t kMinMemoryBytes = 16ULL << 20;
constexpr uint64_t kMaxMemoryBytes = 1ULL << 50;
constexpr uint64_t kMaxPids = 4194304;  // the kernel's PID_MAX_LIMIT
constexpr double kMaxCpus = 4096;
constexpr uint64_t kMaxUid = 65534;
constexpr uint64_t kMaxPerSession = 1024;
constexpr uint64_t kMaxTotal = 65536;
constexpr uint64_t kMinDiskBytes = 1ULL << 20;
constexpr uint64_t kBig = 1ULL << 62;

// argv[0] may hold none of these: each would mean something only to a shell, and there is none.
constexpr const char* kShellChars = " \t\n\r\v\f;&|<>()$`\\\"'*?[]{}~!#";

constexpr const char* kDefaultPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

const std::vector<std::string> kTopKeys = {
    "$schema",
    "allowedExecutables",
    "cwdRoot",
    "defaultTimeoutMs",
    "maxTimeoutMs",
    "killGraceMs",
    "maxOutputBytes",
    "limits",
    "network",
    "allowNetlinkRoute",
    "readOnlyPaths",
    "maskPaths",
    "env",
    "seccompProfile",
    "runAsUid",
    "concurrency",
    "quotas",
    "retention",
    "rules",
    "rootPerSession",
    "daemon",
    "git",
};

// The git section's bounds. The timeout and cap are for one git call; a tool waits for it.
constexpr uint64_t kMaxGitTimeoutMs = 10ULL * 60 * 1000;
constexpr uint64_t kMaxGitPreviewChars = 100000;

template <class... Args>
std::unexpected<Error> bad(const std::string& pointer, fmt::format_string<Args...> f,
                           Args&&... args) {
  return json_error("policy", pointer, f, std::forward<Args>(args)...);
}

std::string pointer_key(const std::string& base, const std::string& key) {
  return json_pointer_key(base, key);
}

std::string pointer_index(const std::string& base, size_t i) {
  return base + "/" + std::to_string(i);
}

// A first pass over the text: nlohmann keeps the last of duplicate keys silently, so a policy
// could say one thing to a reviewer (or a schema validator) and another to cordon. It also
// gives parse errors with a line and column, which the non-throwing DOM parse does not.
class StrictnessCheck : public nlohmann::json_sax<json> {
 public:
  std::string error;

  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t) override { return scalar(); }
  bool number_unsigned(number_unsigned_t) override { return scalar(); }
  bool number_float(number_float_t, const string_t&) override { return scalar(); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override {
    stack_.push_back(Frame{false, child_pointer(), 0, {}, {}});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    if (!f.keys.insert(k).second) {
      error =
          fmt::format("policy: {}: duplicate key; write each key once", pointer_key(f.pointer, k));
      return false;
    }
    f.key = k;
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    stack_.push_back(Frame{true, child_pointer(), 0, {}, {}});
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    error = fmt::format("policy: not valid JSON: {}", ex.what());
    return false;
  }

 private:
  struct Frame {
    bool array;
    std::string pointer;
    size_t index;
    std::set<std::string> keys;
    std::string key;
  };
  bool scalar() {
    child_pointer();
    return true;
  }
  std::string child_pointer() {
    if (stack_.empty()) {
      return "";
    }
    Frame& f = stack_.back();
    return f.array ? pointer_index(f.pointer, f.index++) : pointer_key(f.pointer, f.key);
  }
  std::vector<Frame> stack_;
};

std::string type_name(const json& j) {
  if (j.is_number_unsigned()) {
    return "non-negative integer";
  }
  if (j.is_number_integer()) {
    return "negative integer";
  }
  if (j.is_number_float()) {
    return "fractional number";
  }
  return j.type_name();
}

Result<void> expect_object(const json& j, const std::string& ptr,
                           std::initializer_list<const char*> allowed) {
  if (!j.is_object()) {
    return bad(ptr, "expected an object, got {}", type_name(j));
  }
  for (const auto& [k, v] : j.items()) {
    bool known = std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; });
    if (!known) {
      std::string list;
      for (const char* a : allowed) {
        list += list.empty() ? a : std::string(", ") + a;
      }
      return bad(pointer_key(ptr, k), "unknown key; allowed here: {}", list);
    }
  }
  return {};
}

Result<void> expect_array(const json& j, const std::string& ptr) {
  if (!j.is_array()) {
    return bad(ptr, "expected an array, got {}", type_name(j));
  }
  return {};
}

Result<std::string> get_string(const json& j, const std::string& ptr) {
  if (!j.is_string()) {
    return bad(ptr, "expected a string, got {}", type_name(j));
  }
  std::string s = j.get<std::string>();
  if (s.find('\0') != std::string::npos) {
    return bad(ptr, "contains a NUL byte");
  }
  return s;
}

Result<uint64_t> get_uint(const json& j, const std::string& ptr, uint64_t min, uint64_t max) {
  if (!j.is_number_unsigned()) {
    return bad(ptr, "expected a non-negative integer, got {}", type_name(j));
  }
  uint64_t v = j.get<uint64_t>();
  if (v < min || v > max) {
    return bad(ptr, "{} is out of range [{}, {}]", v, min, max);
  }
  return v;
}

// Absolute and already normal: a path in a policy is compared as written, so "/usr/bin/../bin"
// would never match what it seems to say.
Result<std::string> get_abs_path(const json& j, const std::string& ptr) {
  CORDON_TRY(s, get_string(j, ptr));
  if (s.empty() || s[0] != '/') {
    return bad(ptr, "\"{}\" is not an absolute path", s);
  }
  std::string n = normalize_path(s);
  if (n != s) {
    return bad(ptr, "\"{}\" is not in normal form; write it as \"{}\"", s, n);
  }
  return s;
}

bool valid_env_name(std::string_view n) {
  if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) {
    return false;
  }
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c));
         });
}

Result<std::vector<AllowedExecutable>> parse_allowed(const json& j, const std::string& ptr) {
  CORDON_CHECK(expect_array(j, ptr));
  std::vector<AllowedExecutable> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string p = pointer_index(ptr, i);
    AllowedExecutable e;
    if (j[i].is_object()) {
      CORDON_CHECK(expect_object(j[i], p, {"path", "sha256"}));
      if (!j[i].contains("path")) {
        return bad(p + "/path", "required: the executable's absolute path");
      }
      CORDON_TRY(path, get_abs_path(j[i]["path"], p + "/path"));
      e.path = path;
      if (j[i].contains("sha256")) {
        CORDON_TRY(hex, get_string(j[i]["sha256"], p + "/sha256"));
        if (!is_hex64(hex)) {
          return bad(p + "/sha256", "expected 64 hex digits (a SHA-256 of the file)");
        }
        std::transform(hex.begin(), hex.end(), hex.begin(),
                       [](char c) { return static_cast<char>(std::tolower(c)); });
        e.sha256 = hex;
      }
    } else if (j[i].is_string()) {
      CORDON_TRY(path, get_abs_path(j[i], p));
      e.path = path;
    } else {
      return bad(p, "expected an absolute path or {{\"path\", \"sha256\"}}, got {}",
                 type_name(j[i]));
    }
    if (!seen.insert(e.path).second) {
      return bad(p, "\"{}\" is listed twice", e.path);
    }
    // check_start refuses such an argv[0] at every start (no shell): an entry no start can use
    // (a review, session 34: it loaded, and each start was told to split the path).
    if (e.path.find_first_of(kShellChars) != std::string::npos) {
      return bad(p,
                 "\"{}\" contains whitespace or a shell metacharacter, which argv[0] never may "
                 "(commands run with no shell): link it from a path without them and allow that",
                 e.path);
    }
    out.push_back(std::move(e));
  }
  return out;
}

Result<std::vector<std::string>> parse_path_list(const json& j, const std::string& ptr,
                                                 bool under_etc) {
  CORDON_CHECK(expect_array(j, ptr));
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string p = pointer_index(ptr, i);
    CORDON_TRY(path, get_abs_path(j[i], p));
    if (under_etc && (path == "/etc" || !path_within(path, "/etc"))) {
      return bad(p, "\"{}\" is not a path under /etc (only /etc is masked)", path);
    }
    out.push_back(path);
  }
  return out;
}

Result<Limits> parse_limits(const json& j, const std::string& ptr) {
  CORDON_CHECK(expect_object(j, ptr, {"memoryBytes", "pids", "cpus"}));
  Limits l;
  if (j.contains("memoryBytes")) {
    CORDON_TRY(v,
               get_uint(j["memoryBytes"], ptr + "/memoryBytes", kMinMemoryBytes, kMaxMemoryBytes));
    l.memory_bytes = v;
  }
  if (j.contains("pids")) {
    // Two at least: cordon-init (PID 1) and the command.
    CORDON_TRY(v, get_uint(j["pids"], ptr + "/pids", 2, kMaxPids));
    l.pids = v;
  }
  if (j.contains("cpus")) {
    const json& c = j["cpus"];
    if (!c.is_number()) {
      return bad(ptr + "/cpus", "expected a number, got {}", type_name(c));
    }
    double v = c.get<double>();
    if (!(v >= 0.01 && v <= kMaxCpus)) {
      return bad(ptr + "/cpus", "{} is out of range [0.01, {}]", v, kMaxCpus);
    }
    l.cpus = v;
  }
  return l;
}

Result<EnvPolicy> parse_env(const json& j, const std::string& ptr) {
  CORDON_CHECK(expect_object(j, ptr, {"set", "pass", "request"}));
  EnvPolicy e;
  if (j.contains("set")) {
    std::string p = ptr + "/set";
    if (!j["set"].is_object()) {
      return bad(p, "expected an object of NAME: VALUE, got {}", type_name(j["set"]));
    }
    for (const auto& [k, v] : j["set"].items()) {
      std::string kp = pointer_key(p, k);
      if (!valid_env_name(k)) {
        return bad(kp,
                   "\"{}\" is not a variable name (letters, digits, _; not starting with "
                   "a digit)",
                   k);
      }
      CORDON_TRY(val, get_string(v, kp));
      e.set[k] = val;
    }
  }
  if (j.contains("pass")) {
    std::string p = ptr + "/pass";
    CORDON_CHECK(expect_array(j["pass"], p));
    for (size_t i = 0; i < j["pass"].size(); ++i) {
      CORDON_TRY(name, get_string(j["pass"][i], pointer_index(p, i)));
      if (!valid_env_name(name)) {
        return bad(pointer_index(p, i), "\"{}\" is not a variable name", name);
      }
      if (e.set.count(name) != 0) {
        return bad(pointer_index(p, i), "\"{}\" is also in /env/set; list it in one place", name);
      }
      e.pass.push_back(name);
    }
  }
  if (j.contains("request")) {
    std::string p = ptr + "/request";
    CORDON_CHECK(expect_array(j["request"], p));
    std::vector<std::string> names;
    for (size_t i = 0; i < j["request"].size(); ++i) {
      CORDON_TRY(name, get_string(j["request"][i], pointer_index(p, i)));
      std::string_view stem(name);
      if (stem.ends_with('*')) {
        stem.remove_suffix(1);
      }
      if (!valid_env_name(stem)) {
        return bad(pointer_index(p, i),
                   "\"{}\" is not a variable name or a name's beginning followed by * (e.g. "
                   "\"CARGO_*\")",
                   name);
      }
      names.push_back(name);
    }
    e.request = std::move(names);
  }
  return e;
}

Result<std::vector<Rule>> parse_rules(const json& j, const std::string& ptr) {
  CORDON_CHECK(expect_array(j, ptr));
  std::vector<Rule> out;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string p = pointer_index(ptr, i);
    const json& r = j[i];
    CORDON_CHECK(expect_object(r, p, {"argvPrefix", "argvContains", "refuse"}));
    bool prefix = r.contains("argvPrefix");
    bool contains = r.contains("argvContains");
    if (prefix == contains) {
      return bad(p, "a rule has exactly one of argvPrefix or argvContains");
    }
    if (!r.contains("refuse")) {
      return bad(p + "/refuse", "required: the message an agent gets instead of running it");
    }
    Rule rule;
    CORDON_TRY(msg, get_string(r["refuse"], p + "/refuse"));
    if (msg.empty()) {
      return bad(p + "/refuse", "is empty; say why and what to do instead");
    }
    rule.refuse = msg;
    if (prefix) {
      std::string pp = p + "/argvPrefix";
      CORDON_CHECK(expect_array(r["argvPrefix"], pp));
      if (r["argvPrefix"].empty()) {
        return bad(pp, "is empty; it would refuse every command");
      }
      for (size_t k = 0; k < r["argvPrefix"].size(); ++k) {
        CORDON_TRY(s, get_string(r["argvPrefix"][k], pointer_index(pp, k)));
        rule.argv_prefix.push_back(s);
      }
    } else {
      CORDON_TRY(s, get_string(r["argvContains"], p + "/argvContains"));
      rule.argv_contains = s;
    }
    out.push_back(std::move(rule));
  }
  return out;
}

Result<GitPolicy> parse_git(const json& j, const std::string& ptr) {
  CORDON_CHECK(
      expect_object(j, ptr, {"repoRoot", "binary", "timeoutMs", "maxOutputBytes", "previewChars"}));
  GitPolicy g;
  if (!j.contains("repoRoot")) {
    return bad(ptr + "/repoRoot", "required: the checkout the git tools read");
  }
  CORDON_TRY(root, get_abs_path(j["repoRoot"], ptr + "/repoRoot"));
  g.repo_root = root;
  if (j.contains("binary")) {
    CORDON_TRY(bin, get_abs_path(j["binary"], ptr + "/binary"));
    g.binary = bin;
  }
  if (j.contains("timeoutMs")) {
    CORDON_TRY(v, get_uint(j["timeoutMs"], ptr + "/timeoutMs", 1, kMaxGitTimeoutMs));
    g.timeout_ms = v;
  }
  if (j.contains("maxOutputBytes")) {
    CORDON_TRY(v, get_uint(j["maxOutputBytes"], ptr + "/maxOutputBytes", 1, kMaxOutputBytesBound));
    g.max_output_bytes = v;
  }
  if (j.contains("previewChars")) {
    CORDON_TRY(v, get_uint(j["previewChars"], ptr + "/previewChars", 1, kMaxGitPreviewChars));
    g.preview_chars = v;
  }
  return g;
}

// Resolves `path` on the host (symlinks followed, magic links refused) to the kernel's path.
Result<std::string> resolve_host_path(const std::string& path, uint64_t flags) {
  CORDON_TRY(fd, sys::openat2_fd(AT_FDCWD, path, O_PATH | flags, RESOLVE_NO_MAGICLINKS));
  return sys::fd_path(fd.get());
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) {
    out += out.empty() ? s : sep + s;
  }
  return out;
}

// A string as a JSON literal, for messages an agent will copy into its next request.
std::string quoted(const std::string& s) { return json_fields::dump(json(s)); }

std::string json_array(const std::vector<std::string>& v) {
  std::string out = "[";
  for (const auto& s : v) {
    out += (out.size() > 1 ? ", " : "") + quoted(s);
  }
  return out + "]";
}

// MAX_ARG_STRLEN: 32 pages (4 KiB here; larger pages give more, and this stays a bound).
constexpr size_t kMaxArgBytes = 32 * 4096;

// What execve takes whole: the strings with their NULs and a pointer each, at most a quarter of
// the stack limit the command inherits (the kernel's bound; 2 MiB with 8 MiB of stack). A start
// over it failed at exec (E2BIG) after its job was made (found by a review, session 29).
Result<void> check_exec_size(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env) {
  size_t bytes = sizeof(char*) * (argv.size() + env.size() + 2);
  for (const auto* list : {&argv, &env}) {
    for (const auto& s : *list) {
      bytes += s.size() + 1;
    }
  }
  // Read once: the engine never changes its stack limit, and a start is a hot path.
  static const size_t limit = [] {
    struct rlimit stack {};
    size_t l = size_t{6} << 20;  // the kernel's cap: 3/4 of _STK_LIM
    if (::getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY) {
      l = std::min<size_t>(l, std::max<size_t>(stack.rlim_cur / 4, kMaxArgBytes));
    }
    return l;
  }();
  if (bytes > limit) {
    return refusal(
        "argv and the environment come to {} bytes; exec takes at most {} here. Pass fewer or "
        "shorter arguments (a long list can go in a file in the working root)",
        bytes, limit);
  }
  return {};
}

Result<void> check_argv(const Policy& p, const std::vector<std::string>& argv) {
  if (argv.empty()) {
    return refusal(
        "argv is empty: pass the program's absolute path and its arguments as an "
        "array, e.g. [\"/usr/bin/make\", \"test\"]");
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i].find('\0') != std::string::npos) {
      return refusal(
          "argv[{}] contains a NUL byte, which no program can receive; pass each "
          "argument as its own string without NUL",
          i);
    }
    // The kernel's MAX_ARG_STRLEN (32 pages, with the NUL): a longer one failed the start at
    // exec (E2BIG) after the job was made (found by a review, session 29).
    if (argv[i].size() >= kMaxArgBytes) {
      return refusal(
          "argv[{}] is {} bytes; the kernel takes at most {} per argument. Write the data to a "
          "file in the working root and pass its path",
          i, argv[i].size(), kMaxArgBytes - 1);
    }
  }
  const std::string& arg0 = argv[0];
  if (arg0.empty()) {
    return refusal(
        "argv[0] is empty: it must be the program's absolute path, e.g. "
        "[\"/usr/bin/make\", \"test\"]");
  }
  if (arg0.find_first_of(kShellChars) != std::string::npos) {
    // A command line pasted as argv[0]: show it split on whitespace when that is all it is.
    std::string example = "[\"/usr/bin/make\", \"test\"]";
    if (arg0.find_first_not_of(" \t\n\r\v\f") != std::string::npos &&
        std::string(arg0).find_first_of(";&|<>()$`\\\"'*?[]{}~!#") == std::string::npos) {
      std::string spaced = arg0;
      std::replace_if(
          spaced.begin(), spaced.end(),
          [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }, ' ');
      std::vector<std::string> words;
      for (auto& w : split(spaced, ' ')) {
        if (!w.empty()) {
          words.push_back(w);
        }
      }
      if (!words.empty()) {
        example = json_array(words);
      }
    }
    return refusal(
        "argv[0] {} contains whitespace or a shell metacharacter: commands run with "
        "NO shell. Pass an argv array with the program's absolute path first and "
        "each argument as its own element, e.g. {}",
        quoted(arg0), example);
  }
  bool allowed = std::any_of(p.allowed_executables.begin(), p.allowed_executables.end(),
                             [&](const AllowedExecutable& e) { return e.path == arg0; });
  if (!allowed) {
    if (p.allowed_executables.empty()) {
      return refusal(
          "Executable {} is not allowed: this policy allows no executables; ask "
          "the operator to add its absolute path to allowedExecutables",
          quoted(arg0));
    }
    std::vector<std::string> paths;
    std::string hint;
    std::string base = arg0.substr(arg0.rfind('/') + 1);
    for (const auto& e : p.allowed_executables) {
      paths.push_back(e.path);
      if (hint.empty() && e.path.substr(e.path.rfind('/') + 1) == base) {
        hint = fmt::format(" (did you mean {}?)", quoted(e.path));
      }
    }
    return refusal(
        "Executable {} is not allowed{}. Allowed executables, matched exactly as "
        "argv[0]: {}",
        quoted(arg0), hint, join(paths, ", "));
  }
  return {};
}

struct ResolvedCwd {
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
};

Result<ResolvedCwd> resolve_cwd(const Policy& p, const std::optional<std::string>& cwd) {
  if (!p.root_fd || !p.root_fd->valid()) {
    return std::unexpected(
        Error(ErrorCode::kInternal, 0, "policy: cwdRoot is not open; call bind_policy() first"));
  }
  std::string want;
  if (cwd && cwd->size() >= PATH_MAX) {
    // Not echoed: the refusal would be as long (an 8 MB cwd was echoed whole before session 29).
    return refusal("cwd is {} bytes; a path holds at most {}. Pass a shorter directory inside `{}`",
                   cwd->size(), PATH_MAX - 1, p.cwd_root);
  }
  if (!cwd) {
    want = p.root;
  } else if (cwd->empty() || cwd->find('\0') != std::string::npos) {
    return refusal("cwd {} is not a path; omit cwd to run in the working root `{}`", quoted(*cwd),
                   p.cwd_root);
  } else if ((*cwd)[0] == '/') {
    want = normalize_path(*cwd);
  } else {
    want = normalize_path(p.cwd_root + "/" + *cwd);
  }
  // Relative to the root fd. Both spellings of the root count: as written and as resolved.
  std::string rel;
  for (const std::string* r : {&p.root, &p.cwd_root}) {
    if (path_within(want, *r)) {
      rel = want.size() == r->size() ? "." : want.substr(r->size() + (*r == "/" ? 0 : 1));
      break;
    }
  }
  auto outside = [&](const std::string& resolved) {
    return refusal(
        "cwd {} resolves to `{}`, outside the working root `{}`; pass a directory "
        "inside `{}` (a relative cwd is taken from it)",
        quoted(cwd.value_or(want)), resolved, p.cwd_root, p.cwd_root);
  };
  if (rel.empty()) {
    return outside(want);
  }
  // Every component resolved beneath the root fd, an absolute symlink back inside followed: a
  // symlink (or "..") that leads out fails with EXDEV however a job changed the tree between
  // starts, and nothing it leads to outside is looked at (under the engine's lock: a link to a
  // dead FUSE mount held every call of the engine, a red-team review, session 40). The refusal
  // names the link and its text, which the job wrote, and nothing of the host.
  auto fd = sys::open_within(p.root_fd->get(), p.root, rel, O_DIRECTORY);
  if (!fd && fd.error().sys_errno() == EXDEV) {
    return refusal("cwd {} leads outside the working root `{}`: {}; pass a directory inside `{}`",
                   quoted(cwd.value_or(want)), p.cwd_root, fd.error().message(), p.cwd_root);
  }
  if (!fd) {
    int err = fd.error().sys_errno();
    if (err == ENOENT) {
      return refusal(
          "cwd {} (`{}`) does not exist inside the working root `{}`; create it "
          "first or pass an existing directory",
          quoted(cwd.value_or(want)), want, p.cwd_root);
    }
    if (err == ENOTDIR) {
      return refusal("cwd {} (`{}`) is not a directory; pass a directory inside `{}`",
                     quoted(cwd.value_or(want)), want, p.cwd_root);
    }
    if (err == ELOOP) {
      return refusal(
          "cwd {} (`{}`) has too many levels of symlinks or a magic link; pass "
          "the real directory inside `{}`",
          quoted(cwd.value_or(want)), want, p.cwd_root);
    }
    if (err == ENAMETOOLONG) {  // a name over 255 bytes (cordon's own failure before session 29)
      return refusal(
          "cwd {} has a name longer than {} bytes, which no directory has; pass a directory "
          "inside `{}`",
          quoted(cwd.value_or(want)), NAME_MAX, p.cwd_root);
    }
    return std::unexpected(std::move(fd.error()).wrap("resolve cwd"));
  }
  CORDON_TRY(resolved, sys::fd_path(fd->get()));
  if (!path_within(resolved, p.root)) {
    return outside(resolved);
  }
  CORDON_TRY(st, sys::fstat_fd(fd->get()));
  return ResolvedCwd{resolved, st.st_dev, st.st_ino};
}

const Rule* matching_rule(const Policy& p, const std::vector<std::string>& argv) {
  for (const auto& r : p.rules) {
    if (r.argv_contains) {
      if (std::find(argv.begin(), argv.end(), *r.argv_contains) != argv.end()) {
        return &r;
      }
    } else if (r.argv_prefix.size() <= argv.size() &&
               std::equal(r.argv_prefix.begin(), r.argv_prefix.end(), argv.begin())) {
      return &r;
    }
  }
  return nullptr;
}

Result<uint64_t> check_timeout(const Policy& p, std::optional<uint64_t> asked) {
  if (!asked) {
    return p.default_timeout_ms;
  }
  if (*asked == 0) {
    return refusal(
        "timeoutMs 0 is not a timeout; ask for 1 to {} ms, or omit it for the "
        "default of {} ms",
        p.max_timeout_ms, p.default_timeout_ms);
  }
  if (*asked > p.max_timeout_ms) {
    return refusal(
        "timeoutMs {} is above this policy's maximum of {} ms; ask for at most {} "
        "(a longer command can run in the background and be polled, or split)",
        *asked, p.max_timeout_ms, p.max_timeout_ms);
  }
  return *asked;
}

// Variables that make a program load code from a path, or run code, that the request names
// without the program's argv asking for it: the dynamic loader's and glibc's (into every
// program), OpenSSL's (into everything linked with libcrypto: curl, git, python), the shells'
// startup and trace hooks (into every script a program runs), and the interpreters' module
// paths and option variables (into every allowlisted script). Program-specific variables
// (GIT_*, PAGER, EDITOR) are like the program's options: an operator refuses those with
// env.request. Before session 34 only LD_* and GCONV_PATH were refused, and OPENSSL_CONF made
// an allowlisted curl run a shared object from the root (a review). Session 35:
// PYTHONPYCACHEPREFIX made an allowlisted python load its standard library's bytecode from the
// root (an unchecked-hash .pyc is loaded without its source), PYTHONINSPECT gave a script on a
// terminal an interactive prompt, and GIO_EXTRA_MODULES loads shared objects into every GLib
// program.
std::optional<std::string> code_loading_variable(std::string_view name) {
  struct Group {
    const char* why;
    std::initializer_list<std::string_view> names;
  };
  static const Group kGroups[] = {
      {"glibc loads shared objects or parses files from what it names into every program",
       {"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH"}},
      {"OpenSSL loads its configuration and engines or providers (shared objects) from it into "
       "every program linked with libcrypto",
       {"OPENSSL_CONF", "OPENSSL_CONF_INCLUDE", "OPENSSL_ENGINES", "OPENSSL_MODULES"}},
      {"a shell runs it (a startup file, or code in a trace prompt) in every script a program "
       "starts",
       {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "ZDOTDIR"}},
      {"programs read their startup code and configuration from the directory it names (Python "
       "runs the .pth files under ~/.local, git's config can name commands)",
       {"HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"}},
      {"a library loads plugins (shared objects) named by the configuration it points to",
       {"KRB5_CONFIG", "SASL_PATH"}},
      {"a library loads its modules (shared objects) from the directories it names, in every "
       "program linked with it (GLib's GIO, GStreamer, GTK, Qt, GObject introspection)",
       {"GIO_EXTRA_MODULES",
        "GIO_MODULE_DIR",
        "GST_PLUGIN_PATH",
        "GST_PLUGIN_PATH_1_0",
        "GST_PLUGIN_SYSTEM_PATH",
        "GST_PLUGIN_SYSTEM_PATH_1_0",
        "GTK_PATH",
        "GTK_MODULES",
        "GTK3_MODULES",
        "GTK_EXE_PREFIX",
        "QT_PLUGIN_PATH",
        "GI_TYPELIB_PATH",
        "GDK_PIXBUF_MODULE_FILE",
        "GDK_PIXBUF_MODULEDIR",
        "GTK_IM_MODULE_FILE",
        "QT_QPA_PLATFORM_PLUGIN_PATH",
        "LIBGL_DRIVERS_PATH",
        "LIBVA_DRIVERS_PATH",
        "VK_ICD_FILENAMES",
        "VK_DRIVER_FILES",
        "VK_ADD_DRIVER_FILES",
        "VK_LAYER_PATH",
        "VK_ADD_LAYER_PATH",
        "__EGL_VENDOR_LIBRARY_FILENAMES",
        "__EGL_VENDOR_LIBRARY_DIRS"}},
      {"a library runs it as a helper program (GStreamer's plugin scanner)",
       {"GST_PLUGIN_SCANNER", "GST_PLUGIN_SCANNER_1_0"}},
      {"a program runs it as a command", {"BROWSER"}},
      {"the interpreter loads modules or takes options from it in every script it runs",
       {"PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PERL5LIB",
        "PERLLIB",
        "PERL5OPT",
        "PERL5DB",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "NODE_PATH",
        "LUA_INIT",
        "LUA_PATH",
        "LUA_CPATH",
        "TCLLIBPATH",
        "PHPRC",
        "PHP_INI_SCAN_DIR",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "PYTHONWARNINGS",
        "PYTHONPYCACHEPREFIX",
        "PYTHONPLATLIBDIR",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
        "GEM_HOME",
        "GEM_PATH",
        "BUNDLE_GEMFILE",
        "DOTNET_STARTUP_HOOKS",
        "CORECLR_PROFILER_PATH",
        "ERL_AFLAGS",
        "ERL_ZFLAGS",
        "ERL_FLAGS"}},
  };
  if (name.starts_with("LD_")) {
    return "LD_* variables make the dynamic loader run code (LD_PRELOAD, LD_AUDIT, "
           "LD_LIBRARY_PATH) in every program";
  }
  for (const auto& g : kGroups) {
    for (std::string_view n : g.names) {
      if (n == name) {
        return std::string(g.why);
      }
    }
  }
  return std::nullopt;
}

// `name` matches an env.request entry: exactly, or by its beginning before a trailing `*`.
bool request_may_set(const std::vector<std::string>& allowed, std::string_view name) {
  return std::any_of(allowed.begin(), allowed.end(), [name](std::string_view a) {
    return a.ends_with('*') ? name.starts_with(a.substr(0, a.size() - 1)) : a == name;
  });
}

Result<std::vector<std::string>> build_env(const Policy& p,
                                           const std::map<std::string, std::string>& asked) {
  for (const auto& [name, value] : asked) {
    if (!valid_env_name(name)) {
      return refusal(
          "env name {} is not a variable name: use letters, digits and _, not "
          "starting with a digit",
          quoted(name));
    }
    if (value.find('\0') != std::string::npos) {
      return refusal("env {} contains a NUL byte; a value cannot carry one", name);
    }
    if (name.size() + 1 + value.size() >= kMaxArgBytes) {
      return refusal(
          "env {} is {} bytes with its name; the kernel takes at most {} per variable. Write "
          "the value to a file in the working root and pass its path",
          name, name.size() + 1 + value.size(), kMaxArgBytes - 1);
    }
    if (auto why = code_loading_variable(name)) {
      return refusal(
          "env {} is refused: {}, code the allowlist never approved; leave it out (an operator "
          "can fix a value with env.set)",
          name, *why);
    }
    if (p.env.request && !request_may_set(*p.env.request, name)) {
      return refusal(
          "env {} is not among the names this policy lets a request set ({}); leave it out, "
          "or ask the operator to add it to env.request",
          name, fmt::join(*p.env.request, ", "));
    }
    if (p.env.set.count(name) != 0) {
      return refusal("env {} is fixed by the policy (env.set); leave it out of the request", name);
    }
  }
  const char* term = ::getenv("TERM");
  std::map<std::string, std::string> env = {
      {"PATH", kDefaultPath},
      {"HOME", "/tmp/home"},
      {"LANG", "C.UTF-8"},
      {"TERM", term != nullptr && *term != '\0' ? term : "dumb"},
  };
  for (const auto& name : p.env.pass) {
    if (const char* v = ::getenv(name.c_str()); v != nullptr) {
      env[name] = v;
    }
  }
  for (const auto& [name, value] : asked) {
    env[name] = value;
  }
  for (const auto& [name, value] : p.env.set) {
    env[name] = value;
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [name, value] : env) {
    out.push_back(name + "=" + value);
  }
  return out;
}

struct CheckedExecutable {
  std::shared_ptr<const UniqueFd> fd;
  dev_t dev = 0;
  ino_t ino = 0;
};

Result<std::string> hash_file(int path_fd, const std::string& path, const struct stat& want) {
  // Re-open the very inode that passed the checks (an O_PATH fd cannot be read).
  std::string proc = fmt::format("/proc/self/fd/{}", path_fd);
  CORDON_TRY_CTX(fd, sys::open_fd(proc, O_RDONLY | O_NOCTTY | O_NONBLOCK), "open `{}` to hash it",
                 path);
  CORDON_TRY(st, sys::fstat_fd(fd.get()));
  if (st.st_dev != want.st_dev || st.st_ino != want.st_ino) {
    return refusal("`{}` changed while it was checked; try again", path);
  }
  Sha256 h;
  std::vector<char> buf(1 << 16);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("read `{}` to hash it", path);
    }
    if (n == 0) {
      break;
    }
    h.update(buf.data(), static_cast<size_t>(n));
  }
  return Sha256::hex(h.finish());
}

Result<CheckedExecutable> check_executable(const Policy& p, const AllowedExecutable& e) {
  // One in the working root is looked up beneath it: a job may have made it a link, and where
  // a link out leads is neither looked at (a dead mount there held the engine's lock) nor told
  // (the refusal said whether a host file existed, its mode and owner: a red-team review,
  // session 40).
  // The whole of cwdRoot: with rootPerSession another session's job can write its own part.
  std::optional<std::string> in_root;
  for (const std::string* r : {&p.whole_root, &p.whole_cwd_root}) {
    if (!in_root && p.whole_root_fd && !r->empty() && path_within(e.path, *r)) {
      in_root = p.whole_root + e.path.substr(r->size());
    }
  }
  auto fd = in_root ? sys::open_within(p.whole_root_fd->get(), p.whole_root, *in_root, 0)
                    : sys::openat2_fd(AT_FDCWD, e.path, O_PATH, RESOLVE_NO_MAGICLINKS);
  if (!fd && fd.error().sys_errno() == EXDEV) {
    return refusal(
        "allowed executable `{}` leads outside the working root: {}; a job may have replaced "
        "it, so ask the operator to check it",
        e.path, fd.error().message());
  }
  if (!fd) {
    int err = fd.error().sys_errno();
    if (err == ENOENT || err == ENOTDIR) {
      return std::unexpected(Error(
          ErrorCode::kNotFound, err,
          fmt::format("allowed executable `{}` does not exist on this host; install it or ask "
                      "the operator to fix allowedExecutables",
                      e.path)));
    }
    return std::unexpected(std::move(fd.error()).wrap("open allowed executable"));
  }
  CORDON_TRY(st, sys::fstat_fd(fd->get()));
  if (!S_ISREG(st.st_mode)) {
    return refusal(
        "allowed executable `{}` is not a regular file; ask the operator to fix "
        "allowedExecutables",
        e.path);
  }
  if ((st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) == 0) {
    return refusal(
        "allowed executable `{}` is not executable (mode {:04o}); ask the operator "
        "to fix its mode",
        e.path, st.st_mode & 07777);
  }
  // Whoever can write the file decides what the allowlist runs: only root and the uid cordon
  // itself runs as (who could change the policy anyway) may own it, and nobody else may write.
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    return refusal(
        "allowed executable `{}` is owned by uid {}, not root or cordon's uid {}: "
        "its owner could replace what the allowlist approves; ask the operator to "
        "chown it",
        e.path, st.st_uid, ::geteuid());
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return refusal(
        "allowed executable `{}` is writable by group or others (mode {:04o}): "
        "they could replace what the allowlist approves; ask the operator to "
        "`chmod go-w` it",
        e.path, st.st_mode & 07777);
  }
  if (e.sha256) {
    CORDON_TRY(got, hash_file(fd->get(), e.path, st));
    if (got != *e.sha256) {
      return refusal(
          "allowed executable `{}` does not match its sha256 pin (file {}, pinned "
          "{}): it changed since the policy was written; the operator must verify "
          "it and update the pin",
          e.path, got, *e.sha256);
    }
  }
  return CheckedExecutable{std::make_shared<const UniqueFd>(std::move(*fd)), st.st_dev, st.st_ino};
}

// A policy is a few KiB; the cap keeps a wrong path (a device, a huge log) from being slurped.
Result<std::string> read_all(int fd, const std::string& path) {
  constexpr size_t kMaxPolicyBytes = 1 << 20;
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("read `{}`", path);
    }
    if (n == 0) {
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxPolicyBytes) {
      return invalid("`{}` is larger than {} bytes; that is not a policy", path, kMaxPolicyBytes);
    }
  }
}

}  // namespace

const std::vector<std::string>& policy_keys() { return kTopKeys; }

Result<Policy> parse_policy(std::string_view json_text) {
  StrictnessCheck strict;
  if (!json::sax_parse(json_text, &strict)) {
    return invalid("{}", strict.error.empty() ? "policy: not valid JSON" : strict.error);
  }
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) {
    return invalid("policy: not valid JSON");
  }
  if (!j.is_object()) {
    return bad("", "expected an object, got {}", type_name(j));
  }
  for (const auto& [k, v] : j.items()) {
    if (std::find(kTopKeys.begin(), kTopKeys.end(), k) == kTopKeys.end()) {
      return bad(pointer_key("", k), "unknown key; allowed: {}", join(kTopKeys, ", "));
    }
  }

  Policy p;
  if (j.contains("$schema")) {
    CORDON_CHECK(get_string(j["$schema"], "/$schema"));
  }
  if (!j.contains("allowedExecutables")) {
    return bad("/allowedExecutables", "required: the absolute paths commands may run");
  }
  CORDON_TRY(allowed, parse_allowed(j["allowedExecutables"], "/allowedExecutables"));
  p.allowed_executables = std::move(allowed);
  if (!j.contains("cwdRoot")) {
    return bad("/cwdRoot", "required: the directory every command's cwd must be inside");
  }
  CORDON_TRY(root, get_abs_path(j["cwdRoot"], "/cwdRoot"));
  p.cwd_root = root;
  if (j.contains("rootPerSession")) {
    if (!j["rootPerSession"].is_boolean()) {
      return bad("/rootPerSession", "must be true or false");
    }
    p.root_per_session = j["rootPerSession"].get<bool>();
  }

  if (j.contains("maxTimeoutMs")) {
    CORDON_TRY(v, get_uint(j["maxTimeoutMs"], "/maxTimeoutMs", 1, kMaxTimeoutBoundMs));
    p.max_timeout_ms = v;
  }
  if (j.contains("defaultTimeoutMs")) {
    CORDON_TRY(v, get_uint(j["defaultTimeoutMs"], "/defaultTimeoutMs", 1, kMaxTimeoutBoundMs));
    p.default_timeout_ms = v;
  }
  if (p.default_timeout_ms > p.max_timeout_ms) {
    return bad(j.contains("defaultTimeoutMs") ? "/defaultTimeoutMs" : "/maxTimeoutMs",
               "defaultTimeoutMs {} is above maxTimeoutMs {}", p.default_timeout_ms,
               p.max_timeout_ms);
  }
  if (j.contains("killGraceMs")) {
    CORDON_TRY(v, get_uint(j["killGraceMs"], "/killGraceMs", 0, kMaxKillGraceMs));
    p.kill_grace_ms = v;
  }
  if (j.contains("maxOutputBytes")) {
    CORDON_TRY(v, get_uint(j["maxOutputBytes"], "/maxOutputBytes", 1, kMaxOutputBytesBound));
    p.max_output_bytes = v;
  }
  if (j.contains("limits")) {
    CORDON_TRY(l, parse_limits(j["limits"], "/limits"));
    p.limits = l;
  }
  if (j.contains("network")) {
    CORDON_TRY(n, get_string(j["network"], "/network"));
    if (n == "none") {
      p.network = sandbox::NetworkMode::kNone;
    } else if (n == "host") {
      p.network = sandbox::NetworkMode::kHost;
    } else {
      return bad("/network", "\"{}\" is not a network mode; use \"none\" or \"host\"", n);
    }
  }
  if (j.contains("allowNetlinkRoute")) {
    if (!j["allowNetlinkRoute"].is_boolean()) {
      return bad("/allowNetlinkRoute", "must be true or false");
    }
    p.allow_netlink_route = j["allowNetlinkRoute"].get<bool>();
  }
  if (j.contains("readOnlyPaths")) {
    CORDON_TRY(v, parse_path_list(j["readOnlyPaths"], "/readOnlyPaths", false));
    p.read_only_paths = std::move(v);
  }
  if (j.contains("maskPaths")) {
    CORDON_TRY(v, parse_path_list(j["maskPaths"], "/maskPaths", true));
    p.mask_paths = std::move(v);
  }
  if (j.contains("env")) {
    CORDON_TRY(e, parse_env(j["env"], "/env"));
    p.env = std::move(e);
  }
  if (j.contains("seccompProfile")) {
    CORDON_TRY(s, get_abs_path(j["seccompProfile"], "/seccompProfile"));
    p.seccomp_profile = s;
  }
  if (j.contains("runAsUid")) {
    // Never 0: root inside the user namespace still owns the namespace's files and keys.
    CORDON_TRY(v, get_uint(j["runAsUid"], "/runAsUid", 1, kMaxUid));
    p.run_as_uid = static_cast<uid_t>(v);
  }
  if (j.contains("concurrency")) {
    const json& c = j["concurrency"];
    CORDON_CHECK(expect_object(c, "/concurrency", {"perSession", "total", "perUid"}));
    if (c.contains("perSession")) {
      CORDON_TRY(v, get_uint(c["perSession"], "/concurrency/perSession", 1, kMaxPerSession));
      p.concurrency.per_session = static_cast<uint32_t>(v);
    }
    if (c.contains("total")) {
      CORDON_TRY(v, get_uint(c["total"], "/concurrency/total", 1, kMaxTotal));
      p.concurrency.total = static_cast<uint32_t>(v);
    }
    if (p.concurrency.per_session > p.concurrency.total) {
      return bad("/concurrency/perSession", "{} is above concurrency.total {}",
                 p.concurrency.per_session, p.concurrency.total);
    }
    if (c.contains("perUid")) {
      CORDON_TRY(v, get_uint(c["perUid"], "/concurrency/perUid", 1, kMaxTotal));
      if (v > p.concurrency.total) {
        return bad("/concurrency/perUid", "{} is above concurrency.total {}", v,
                   p.concurrency.total);
      }
      p.concurrency.per_uid = static_cast<uint32_t>(v);
    }
  }
  if (j.contains("quotas")) {
    const json& q = j["quotas"];
    CORDON_CHECK(expect_object(q, "/quotas",
                               {"maxJobs", "maxDiskBytes", "maxJobsPerUid", "maxDiskBytesPerUid"}));
    if (q.contains("maxJobs")) {
      CORDON_TRY(v, get_uint(q["maxJobs"], "/quotas/maxJobs", 1, kBig));
      p.quotas.max_jobs = v;
    }
    if (q.contains("maxDiskBytes")) {
      CORDON_TRY(v, get_uint(q["maxDiskBytes"], "/quotas/maxDiskBytes", kMinDiskBytes, kBig));
      p.quotas.max_disk_bytes = v;
    }
    if (q.contains("maxJobsPerUid")) {
      CORDON_TRY(v, get_uint(q["maxJobsPerUid"], "/quotas/maxJobsPerUid", 1, kBig));
      if (v > p.quotas.max_jobs) {
        return bad("/quotas/maxJobsPerUid", "{} is above quotas.maxJobs {}", v, p.quotas.max_jobs);
      }
      p.quotas.max_jobs_per_uid = v;
    }
    if (q.contains("maxDiskBytesPerUid")) {
      CORDON_TRY(
          v, get_uint(q["maxDiskBytesPerUid"], "/quotas/maxDiskBytesPerUid", kMinDiskBytes, kBig));
      if (v > p.quotas.max_disk_bytes) {
        return bad("/quotas/maxDiskBytesPerUid", "{} is above quotas.maxDiskBytes {}", v,
                   p.quotas.max_disk_bytes);
      }
      p.quotas.max_disk_bytes_per_uid = v;
    }
  }
  if (j.contains("retention")) {
    const json& r = j["retention"];
    CORDON_CHECK(expect_object(r, "/retention", {"maxJobs", "maxAgeSeconds", "maxDiskBytes"}));
    if (r.contains("maxJobs")) {
      CORDON_TRY(v, get_uint(r["maxJobs"], "/retention/maxJobs", 1, kBig));
      p.retention.max_jobs = v;
    }
    if (r.contains("maxAgeSeconds")) {
      CORDON_TRY(v, get_uint(r["maxAgeSeconds"], "/retention/maxAgeSeconds", 1, kBig));
      p.retention.max_age_seconds = v;
    }
    if (r.contains("maxDiskBytes")) {
      CORDON_TRY(v, get_uint(r["maxDiskBytes"], "/retention/maxDiskBytes", kMinDiskBytes, kBig));
      p.retention.max_disk_bytes = v;
    }
  }
  if (j.contains("daemon")) {
    const json& d = j["daemon"];
    CORDON_CHECK(expect_object(d, "/daemon",
                               {"allowedUids", "idleTimeoutMs", "stallTimeoutMs", "maxConnections",
                                "maxConnectionsPerUid", "maxCallsPerUid"}));
    if (d.contains("allowedUids")) {
      if (!d["allowedUids"].is_array()) {
        return invalid("policy: /daemon/allowedUids: expected an array of uids, got {}",
                       d["allowedUids"].type_name());
      }
      for (size_t i = 0; i < d["allowedUids"].size(); ++i) {
        CORDON_TRY(v, get_uint(d["allowedUids"][i], fmt::format("/daemon/allowedUids/{}", i), 0,
                               0xfffffffe));
        p.daemon.allowed_uids.push_back(static_cast<uid_t>(v));
      }
    }
    if (d.contains("idleTimeoutMs")) {
      CORDON_TRY(v, get_uint(d["idleTimeoutMs"], "/daemon/idleTimeoutMs", 0, 604800000));
      p.daemon.idle_timeout_ms = v;
    }
    if (d.contains("stallTimeoutMs")) {
      CORDON_TRY(v, get_uint(d["stallTimeoutMs"], "/daemon/stallTimeoutMs", 100, 3600000));
      p.daemon.stall_timeout_ms = v;
    }
    if (d.contains("maxConnections")) {
      CORDON_TRY(v, get_uint(d["maxConnections"], "/daemon/maxConnections", 1, 4096));
      p.daemon.max_connections = static_cast<uint32_t>(v);
    }
    if (d.contains("maxConnectionsPerUid")) {
      CORDON_TRY(v, get_uint(d["maxConnectionsPerUid"], "/daemon/maxConnectionsPerUid", 1, 4096));
      p.daemon.max_connections_per_uid = static_cast<uint32_t>(v);
    }
    if (d.contains("maxCallsPerUid")) {
      CORDON_TRY(v, get_uint(d["maxCallsPerUid"], "/daemon/maxCallsPerUid", 1, 4096));
      p.daemon.max_calls_per_uid = static_cast<uint32_t>(v);
    }
  }
  if (j.contains("rules")) {
    CORDON_TRY(r, parse_rules(j["rules"], "/rules"));
    p.rules = std::move(r);
  }
  if (j.contains("git")) {
    CORDON_TRY(g, parse_git(j["git"], "/git"));
    p.git = std::move(g);
  }
  return p;
}

Result<void> bind_policy(Policy& p, const HostPathGuard& guard) {
  CORDON_TRY_CTX(bound, open_bind_path(p.cwd_root, O_DIRECTORY, "cwdRoot"), "policy");
  const std::string root = bound.path;
  CORDON_CHECK_CTX(guard.check_writable(root, "cwdRoot"), "policy");
  std::vector<std::string> ro;
  std::vector<std::pair<uint64_t, uint64_t>> ro_ids;
  for (const auto& path : p.read_only_paths) {
    CORDON_TRY_CTX(r, open_bind_path(path, 0, "readOnlyPaths entry"), "policy");
    CORDON_CHECK_CTX(guard.check(r.path, "readOnlyPaths entry"), "policy");
    ro.push_back(r.path);
    ro_ids.emplace_back(0, 0);
    if (path_within(r.path, root)) {
      CORDON_TRY(st, sys::fstat_fd(r.fd.get()));
      ro_ids.back() = {st.st_dev, st.st_ino};
    }
  }
  if (p.seccomp_profile) {
    // Load it now so a broken profile fails the policy, not the first start.
    CORDON_CHECK_CTX(load_seccomp_profile(*p.seccomp_profile), "policy: seccompProfile");
  }
  if (p.git) {
    // The same guard as cwdRoot: the git jobs see all of repoRoot (read-only).
    CORDON_TRY_CTX(groot, open_bind_path(p.git->repo_root, O_DIRECTORY, "git.repoRoot"), "policy");
    CORDON_CHECK_CTX(guard.check(groot.path, "git.repoRoot"), "policy");
    p.git->root_fd = std::make_shared<const UniqueFd>(std::move(groot.fd));
    p.git->root = groot.path;
  }
  // A pin is checked when a start is checked, and an executable in the working root is exec'd
  // by its path, which any job can replace in between: a pin there cannot hold (a review,
  // session 34: 17 of 150 starts ran another program's content under the pin). Nor through
  // another way to the root's files: another mount of the root or of a directory in it (a
  // bind mount elsewhere), or a file system mounted under the root (the sandbox gets the
  // root's mounts with it). Compared where each lies on its file system (session 37).
  std::vector<sys::MountInfo> mounts;                 // read at the first pin
  std::optional<std::vector<sys::FsPlace>> writable;  // made then
  for (const auto& e : p.allowed_executables) {
    if (!e.sha256) {
      continue;
    }
    auto resolved = resolve_host_path(e.path, 0);
    for (const std::string& where : {e.path, resolved ? *resolved : e.path}) {
      if (path_within(where, root) || path_within(where, p.cwd_root)) {
        return invalid(
            "policy: allowedExecutables `{}` has a sha256 pin but lies in the working root "
            "`{}`, where any job can replace it between the check and the exec; keep pinned "
            "executables outside the root (and bind their directory with readOnlyPaths)",
            e.path, root);
      }
    }
    if (!resolved) {
      continue;  // a missing executable: refused at each start, and no path to compare
    }
    if (!writable) {
      CORDON_TRY_CTX(read, sys::read_mountinfo(), "policy: allowedExecutables `{}`", e.path);
      mounts = std::move(read);
      CORDON_TRY_CTX(root_place, sys::fs_place(root, mounts), "policy: cwdRoot");
      writable.emplace(1, root_place);
      // A read-only one stays so in the sandbox (the root's tree is cloned with its mounts'
      // flags, and a job can change no mount): the directory the error's advice binds.
      for (const sys::MountInfo& m : mounts) {
        if (path_within(m.mount_point, root) && !sys::read_only(m)) {
          writable->push_back(sys::mount_place(m));
        }
      }
    }
    CORDON_TRY_CTX(exe_place, sys::fs_place(*resolved, mounts), "policy: allowedExecutables `{}`",
                   e.path);
    for (const sys::FsPlace& w : *writable) {
      if (exe_place.dev == w.dev && path_within(exe_place.path, w.path)) {
        return invalid(
            "policy: allowedExecutables `{}` has a sha256 pin but the working root `{}` reaches "
            "the same file through another mount (`{}` on file system {}), where any job can "
            "replace it between the check and the exec; keep pinned executables outside the "
            "root (and bind their directory with readOnlyPaths)",
            e.path, root, exe_place.path, exe_place.dev);
      }
    }
  }
  p.root_fd = std::make_shared<const UniqueFd>(std::move(bound.fd));
  p.root = root;
  p.whole_root = root;
  p.whole_cwd_root = p.cwd_root;
  p.whole_root_fd = p.root_fd;
  p.resolved_read_only_paths = std::move(ro);
  p.read_only_ids = std::move(ro_ids);
  return {};
}

std::vector<std::string> host_warnings(const Policy& policy, uint64_t pid_max,
                                       uint64_t threads_max) {
  std::vector<std::string> out;
  uint64_t room = std::min(pid_max, threads_max);
  uint64_t jobs = static_cast<uint64_t>(policy.concurrency.total) * policy.limits.pids;
  // Failure found by a review (session 35): the defaults let 32 fork-bombing jobs take every
  // pid of a host with kernel.pid_max 32768; each stayed within its own pids limit.
  if (room > 0 && jobs >= room / 4 * 3) {
    out.push_back(fmt::format(
        "concurrency.total {} × limits.pids {} = {} tasks could run in jobs at once, {}% of the "
        "{} this host's kernel gives (kernel.pid_max {}, kernel.threads-max {}): jobs that fork "
        "to their limit could leave the host no pid to fork with; lower limits.pids or "
        "concurrency.total, or raise kernel.pid_max (up to 4194304)",
        policy.concurrency.total, policy.limits.pids, jobs, jobs * 100 / room, room, pid_max,
        threads_max));
  }
  return out;
}

std::vector<std::string> host_warnings(const Policy& policy) {
  auto read_number = [](const char* path) -> std::optional<uint64_t> {
    auto text = read_small_file(path);
    return text ? parse_uint(text->substr(0, text->find('\n'))) : std::nullopt;
  };
  auto pid_max = read_number("/proc/sys/kernel/pid_max");
  auto threads_max = read_number("/proc/sys/kernel/threads-max");
  if (!pid_max && !threads_max) {
    return {};
  }
  return host_warnings(policy, pid_max.value_or(UINT64_MAX), threads_max.value_or(UINT64_MAX));
}

Result<Policy> load_policy(const std::string& path, const HostPathGuard& guard) {
  CORDON_TRY_CTX(
      fd, sys::openat2_fd(AT_FDCWD, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, RESOLVE_NO_MAGICLINKS),
      "load policy");
  CORDON_TRY(st, sys::fstat_fd(fd.get()));
  if (!S_ISREG(st.st_mode)) {
    return invalid("load policy: `{}` is not a regular file", path);
  }
  CORDON_TRY(resolved, sys::fd_path(fd.get()));
  CORDON_TRY_CTX(text, read_all(fd.get(), path), "load policy");
  auto parsed = parse_policy(text);
  if (!parsed) {
    return std::unexpected(std::move(parsed.error()).wrap("`{}`", path));
  }
  // A job that can write its own policy (or seccomp profile) has no policy: each is protected
  // where it resolves and as written (a link in the root, the job could repoint it before the
  // next start: found by a review, session 29).
  HostPathGuard g = guard;
  g.protected_paths.push_back(resolved);
  g.protect(path);
  if (parsed->seccomp_profile) {
    g.protect(*parsed->seccomp_profile);
    if (auto sp = resolve_host_path(*parsed->seccomp_profile, 0)) {
      g.protected_paths.push_back(*sp);
    }
  }
  CORDON_CHECK_CTX(bind_policy(*parsed, g), "`{}`", path);
  return parsed;
}

Result<Policy> git_job_policy(const Policy& main) {
  if (!main.git || !main.git->root_fd) {
    return invalid("policy: no bound git section to derive the git tools' policy from");
  }
  const GitPolicy& g = *main.git;
  Policy p;
  p.allowed_executables = {AllowedExecutable{g.binary, std::nullopt}};
  p.cwd_root = g.repo_root;
  p.root = g.root;
  p.root_fd = g.root_fd;
  p.whole_root = g.root;
  p.whole_cwd_root = g.repo_root;
  p.whole_root_fd = g.root_fd;
  // The repository is bound read-only: a hostile config that still found a way to run a
  // program, or a flag that slipped through, cannot change it (EROFS, then Landlock).
  p.root_read_only = true;
  // Nor can a symlink in its git directory make git read (and quote in an error) a file
  // outside it: /etc's, /proc's (info/grafts, packed-refs, shallow; a review, session 33).
  p.reads_root_and_system_only = true;
  p.default_timeout_ms = g.timeout_ms;
  p.max_timeout_ms = g.timeout_ms;
  p.kill_grace_ms = std::min<uint64_t>(main.kill_grace_ms, 2000);
  p.max_output_bytes = g.max_output_bytes;
  p.limits = main.limits;
  p.network = sandbox::NetworkMode::kNone;  // whatever the main policy says
  p.allow_netlink_route = false;
  p.mask_paths = main.mask_paths;
  p.seccomp_profile = main.seccomp_profile;
  p.run_as_uid = main.run_as_uid;
  p.concurrency = main.concurrency;
  p.quotas = main.quotas;
  p.retention = main.retention;
  // A replaced environment: nothing from the engine's own (env.pass is the main policy's
  // business), and every variable that would let git read configuration, attributes or
  // replacement objects from outside the repository fixed.
  std::string parent = g.root.substr(0, g.root.rfind('/'));
  p.env.set = {
      {"HOME", "/nonexistent"},
      {"XDG_CONFIG_HOME", "/nonexistent"},
      {"GIT_CONFIG_NOSYSTEM", "1"},
      {"GIT_CONFIG_GLOBAL", "/dev/null"},
      {"GIT_ATTR_NOSYSTEM", "1"},
      {"GIT_TERMINAL_PROMPT", "0"},
      {"GIT_OPTIONAL_LOCKS", "0"},
      {"GIT_NO_REPLACE_OBJECTS", "1"},
      {"GIT_NO_LAZY_FETCH", "1"},
      // No transport at all, whatever the repository's config says: the list outranks every
      // protocol.<name>.allow (a repository's protocol.ext.allow=always beats the command
      // line's protocol.allow=never), and "/" is no transport's name. Since git 2.6, so it
      // holds for a git.binary too old for GIT_NO_LAZY_FETCH (2.45, some backports).
      {"GIT_ALLOW_PROTOCOL", "/"},
      {"GIT_LITERAL_PATHSPECS", "1"},
      {"GIT_CEILING_DIRECTORIES", parent.empty() ? "/" : parent},
      {"GIT_WORK_TREE", g.root},
      {"GIT_PAGER", "cat"},
      {"PAGER", "cat"},
      {"TERM", "dumb"},
  };
  return p;
}

// A readOnlyPaths entry inside the working root is bound by its path at each start, and a job
// can rename a directory above it (`mv sub sub2; mkdir -p sub/.git`): the next sandbox bound the
// job's directory there, and the one the policy protected, now `sub2/.git`, was writable (a
// red-team review, session 40). The start is refused until the operator has looked.
Result<void> check_read_only_paths_in_root(const Policy& p) {
  for (size_t i = 0; i < p.read_only_ids.size(); ++i) {
    const auto& [dev, ino] = p.read_only_ids[i];
    if (dev == 0 && ino == 0) {
      continue;
    }
    const std::string& path = p.resolved_read_only_paths[i];
    // As the spawner opens it: no symlink on the way.
    const std::string rel =
        path.size() == p.whole_root.size() ? "." : path.substr(p.whole_root.size() + 1);
    auto fd = sys::openat2_fd(p.whole_root_fd->get(), rel, O_PATH,
                              RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    auto st = fd ? sys::fstat_fd(fd->get()) : Result<struct stat>(std::unexpected(fd.error()));
    if (!st || st->st_dev != dev || st->st_ino != ino) {
      return refusal("{}", sandbox::moved_read_only_path(path));
    }
  }
  return {};
}

Result<CheckedStart> check_start(const Policy* policy, const StartRequest& req) {
  if (policy == nullptr) {
    return refusal("no policy is loaded: start cordon with --policy FILE; see docs/policy.md");
  }
  const Policy& p = *policy;
  CORDON_CHECK(check_argv(p, req.argv));
  CORDON_TRY(cwd, resolve_cwd(p, req.cwd));
  if (const Rule* r = matching_rule(p, req.argv)) {
    return std::unexpected(Error::refused(r->refuse));
  }
  CORDON_TRY(timeout, check_timeout(p, req.timeout_ms));
  CORDON_TRY(env, build_env(p, req.env));
  CORDON_CHECK(check_exec_size(req.argv, env));
  const AllowedExecutable* allowed = nullptr;
  for (const auto& e : p.allowed_executables) {
    if (e.path == req.argv[0]) {
      allowed = &e;
    }
  }
  CORDON_TRY(exe, check_executable(p, *allowed));
  CORDON_CHECK(check_read_only_paths_in_root(p));

  CheckedStart out;
  out.argv = req.argv;
  out.root = p.root;
  out.root_read_only = p.root_read_only;
  out.reads_root_and_system_only = p.reads_root_and_system_only;
  out.cwd = cwd.path;
  out.cwd_dev = cwd.dev;
  out.cwd_ino = cwd.ino;
  out.env = std::move(env);
  out.timeout_ms = timeout;
  out.kill_grace_ms = p.kill_grace_ms;
  out.max_output_bytes = p.max_output_bytes;
  out.limits = p.limits;
  out.network = p.network;
  out.allow_netlink_route = p.allow_netlink_route;
  out.read_only_paths = p.resolved_read_only_paths;
  out.read_only_ids = p.read_only_ids;
  out.mask_paths = p.mask_paths;
  out.seccomp_profile = p.seccomp_profile;
  out.run_as_uid = p.run_as_uid;
  out.executable_fd = std::move(exe.fd);
  out.executable_dev = exe.dev;
  out.executable_ino = exe.ino;
  out.executable_sha256 = allowed->sha256;
  return out;
}

sandbox::SandboxSpec to_sandbox_spec(const CheckedStart& s) {
  sandbox::SandboxSpec spec;
  spec.argv = s.argv;
  spec.env = s.env;
  spec.root = s.root;
  spec.root_read_only = s.root_read_only;
  spec.reads_root_and_system_only = s.reads_root_and_system_only;
  spec.cwd = s.cwd;
  spec.read_only_paths = s.read_only_paths;
  spec.read_only_ids = s.read_only_ids;
  spec.extra_masked_paths = s.mask_paths;
  spec.network = s.network;
  spec.allow_netlink_route = s.allow_netlink_route;
  spec.inside_uid = s.run_as_uid;
  spec.inside_gid = s.run_as_uid;
  // The file that passed the identity check (owner, mode, sha256 pin) is the one that runs.
  spec.exec_dev = s.executable_dev;
  spec.exec_ino = s.executable_ino;
  return spec;
}

}  // namespace cordon::policy
