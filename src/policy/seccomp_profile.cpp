#include "policy/seccomp_profile.hpp"

#include <fcntl.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "policy/json_pointer.hpp"
#include "sys/fs.hpp"

namespace cordon::policy {
namespace {

using nlohmann::json;
using sandbox::SeccompAction;
using sandbox::SeccompArg;
using sandbox::SeccompOp;
using sandbox::SeccompProfile;
using sandbox::SeccompRule;

template <class... Args>
std::unexpected<Error> bad(const std::string& pointer, fmt::format_string<Args...> f,
                           Args&&... args) {
  return json_error("seccomp profile", pointer, f, std::forward<Args>(args)...);
}

std::string pointer_key(const std::string& base, const std::string& key) {
  return json_pointer_key(base, key);
}

std::string type_name(const json& j) {
  if (j.is_number_unsigned()) {
    return "non-negative integer";
  }
  if (j.is_number_integer()) {
    return "negative integer";
  }
  return j.type_name();
}

Result<std::string> get_string(const json& j, const std::string& ptr) {
  if (!j.is_string()) {
    return bad(ptr, "expected a string, got {}", type_name(j));
  }
  return j.get<std::string>();
}

Result<uint64_t> get_uint(const json& j, const std::string& ptr, uint64_t max) {
  if (!j.is_number_unsigned()) {
    return bad(ptr, "expected a non-negative integer, got {}", type_name(j));
  }
  uint64_t v = j.get<uint64_t>();
  if (v > max) {
    return bad(ptr, "{} is above {}", v, max);
  }
  return v;
}

Result<void> expect_object(const json& j, const std::string& ptr) {
  if (!j.is_object()) {
    return bad(ptr, "expected an object, got {}", type_name(j));
  }
  return {};
}

Result<void> expect_array(const json& j, const std::string& ptr) {
  if (!j.is_array()) {
    return bad(ptr, "expected an array, got {}", type_name(j));
  }
  return {};
}

Result<SeccompAction> parse_action(const json& j, const std::string& ptr) {
  CORDON_TRY(name, get_string(j, ptr));
  if (name == "SCMP_ACT_ALLOW") {
    return SeccompAction::kAllow;
  }
  if (name == "SCMP_ACT_ERRNO") {
    return SeccompAction::kErrno;
  }
  if (name == "SCMP_ACT_KILL_PROCESS") {
    return SeccompAction::kKillProcess;
  }
  // OCI's SCMP_ACT_KILL is libseccomp's historic name for killing the thread.
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") {
    return SeccompAction::kKillThread;
  }
  if (name == "SCMP_ACT_TRAP") {
    return SeccompAction::kTrap;
  }
  if (name == "SCMP_ACT_LOG") {
    return SeccompAction::kLog;
  }
  if (name == "SCMP_ACT_TRACE" || name == "SCMP_ACT_NOTIFY") {
    return bad(ptr, "action \"{}\" is not supported: no tracer or notify agent runs", name);
  }
  return bad(ptr, "unknown action \"{}\"", name);
}

Result<SeccompOp> parse_op(const json& j, const std::string& ptr) {
  CORDON_TRY(name, get_string(j, ptr));
  static const std::pair<const char*, SeccompOp> kOps[] = {
      {"SCMP_CMP_NE", SeccompOp::kNotEqual},           {"SCMP_CMP_LT", SeccompOp::kLessThan},
      {"SCMP_CMP_LE", SeccompOp::kLessEqual},          {"SCMP_CMP_EQ", SeccompOp::kEqual},
      {"SCMP_CMP_GE", SeccompOp::kGreaterEqual},       {"SCMP_CMP_GT", SeccompOp::kGreaterThan},
      {"SCMP_CMP_MASKED_EQ", SeccompOp::kMaskedEqual},
  };
  for (const auto& [n, op] : kOps) {
    if (name == n) {
      return op;
    }
  }
  return bad(ptr, "unknown operator \"{}\"", name);
}

bool known_arch(const std::string& name) {
  static const char* const kArches[] = {
      "SCMP_ARCH_X86",     "SCMP_ARCH_X86_64",   "SCMP_ARCH_X32",         "SCMP_ARCH_ARM",
      "SCMP_ARCH_AARCH64", "SCMP_ARCH_MIPS",     "SCMP_ARCH_MIPS64",      "SCMP_ARCH_MIPS64N32",
      "SCMP_ARCH_MIPSEL",  "SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_PPC",
      "SCMP_ARCH_PPC64",   "SCMP_ARCH_PPC64LE",  "SCMP_ARCH_S390",        "SCMP_ARCH_S390X",
      "SCMP_ARCH_PARISC",  "SCMP_ARCH_PARISC64", "SCMP_ARCH_RISCV64",     "SCMP_ARCH_LOONGARCH64",
      "SCMP_ARCH_M68K",    "SCMP_ARCH_SH",       "SCMP_ARCH_SHEB",
  };
  for (const char* a : kArches) {
    if (name == a) {
      return true;
    }
  }
  return false;
}

// Keys cordon refuses by name, with the reason, before the generic "unknown key".
std::optional<std::string> unsupported_key_reason(const std::string& key) {
  if (key == "includes" || key == "excludes") {
    return "Docker's conditional rules (capabilities, kernel versions) are not supported; "
           "list the syscalls a rule applies to explicitly";
  }
  if (key == "archMap") {
    return "Docker's archMap is not supported; cordon filters x86_64 only";
  }
  if (key == "listenerPath" || key == "listenerMetadata") {
    return "seccomp user notification is not supported";
  }
  return std::nullopt;
}

Result<void> refuse_key(const std::string& base, const std::string& key) {
  std::string ptr = pointer_key(base, key);
  if (auto reason = unsupported_key_reason(key)) {
    return bad(ptr, "{}", *reason);
  }
  return bad(ptr, "unknown key");
}

Result<SeccompArg> parse_arg(const json& j, const std::string& ptr) {
  CORDON_CHECK(expect_object(j, ptr));
  SeccompArg arg;
  bool has_index = false;
  bool has_value = false;
  bool has_op = false;
  for (const auto& [key, value] : j.items()) {
    std::string p = pointer_key(ptr, key);
    if (key == "index") {
      CORDON_TRY(v, get_uint(value, p, 5));
      arg.index = static_cast<unsigned>(v);
      has_index = true;
    } else if (key == "value") {
      CORDON_TRY(v, get_uint(value, p, std::numeric_limits<uint64_t>::max()));
      arg.value = v;
      has_value = true;
    } else if (key == "valueTwo") {
      CORDON_TRY(v, get_uint(value, p, std::numeric_limits<uint64_t>::max()));
      arg.value_two = v;
    } else if (key == "op") {
      CORDON_TRY(op, parse_op(value, p));
      arg.op = op;
      has_op = true;
    } else {
      CORDON_CHECK(refuse_key(ptr, key));
    }
  }
  if (!has_index) {
    return bad(ptr + "/index", "missing");
  }
  if (!has_value) {
    return bad(ptr + "/value", "missing");
  }
  if (!has_op) {
    return bad(ptr + "/op", "missing");
  }
  return arg;
}

Result<SeccompRule> parse_rule(const json& j, const std::string& ptr) {
  CORDON_CHECK(expect_object(j, ptr));
  SeccompRule rule;
  bool has_names = false;
  bool has_action = false;
  std::optional<uint32_t> errno_ret;
  for (const auto& [key, value] : j.items()) {
    std::string p = pointer_key(ptr, key);
    if (key == "names") {
      CORDON_CHECK(expect_array(value, p));
      if (value.empty()) {
        return bad(p, "empty");
      }
      for (size_t i = 0; i < value.size(); ++i) {
        CORDON_TRY(name, get_string(value[i], fmt::format("{}/{}", p, i)));
        if (name.empty()) {
          return bad(fmt::format("{}/{}", p, i), "empty syscall name");
        }
        rule.names.push_back(std::move(name));
      }
      has_names = true;
    } else if (key == "action") {
      CORDON_TRY(action, parse_action(value, p));
      rule.action = action;
      has_action = true;
    } else if (key == "errnoRet") {
      CORDON_TRY(v, get_uint(value, p, 4095));
      errno_ret = static_cast<uint32_t>(v);
    } else if (key == "args") {
      CORDON_CHECK(expect_array(value, p));
      for (size_t i = 0; i < value.size(); ++i) {
        CORDON_TRY(arg, parse_arg(value[i], fmt::format("{}/{}", p, i)));
        rule.args.push_back(arg);
      }
    } else if (key == "comment") {
      CORDON_CHECK(get_string(value, p));
    } else {
      CORDON_CHECK(refuse_key(ptr, key));
    }
  }
  if (!has_names) {
    return bad(ptr + "/names", "missing");
  }
  if (!has_action) {
    return bad(ptr + "/action", "missing");
  }
  if (errno_ret) {
    if (rule.action != SeccompAction::kErrno) {
      return bad(ptr + "/errnoRet", "only meaningful with SCMP_ACT_ERRNO");
    }
    rule.errno_ret = *errno_ret;
  }
  return rule;
}

}  // namespace

Result<SeccompProfile> parse_seccomp_profile(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    return invalid("seccomp profile: not valid JSON");
  }
  CORDON_CHECK(expect_object(j, ""));
  SeccompProfile profile;
  bool has_default = false;
  std::optional<uint32_t> default_errno;
  for (const auto& [key, value] : j.items()) {
    std::string p = pointer_key("", key);
    if (key == "defaultAction") {
      CORDON_TRY(action, parse_action(value, p));
      profile.default_action = action;
      has_default = true;
    } else if (key == "defaultErrnoRet") {
      CORDON_TRY(v, get_uint(value, p, 4095));
      default_errno = static_cast<uint32_t>(v);
    } else if (key == "architectures") {
      CORDON_CHECK(expect_array(value, p));
      for (size_t i = 0; i < value.size(); ++i) {
        std::string ap = fmt::format("{}/{}", p, i);
        CORDON_TRY(arch, get_string(value[i], ap));
        if (!known_arch(arch)) {
          return bad(ap, "unknown architecture \"{}\"", arch);
        }
        profile.architectures.push_back(std::move(arch));
      }
    } else if (key == "flags") {
      // cordon loads the filters with its own flags; accepting others silently would lie.
      CORDON_CHECK(expect_array(value, p));
      if (!value.empty()) {
        return bad(fmt::format("{}/0", p), "filter flags are not supported");
      }
    } else if (key == "syscalls") {
      CORDON_CHECK(expect_array(value, p));
      for (size_t i = 0; i < value.size(); ++i) {
        CORDON_TRY(rule, parse_rule(value[i], fmt::format("{}/{}", p, i)));
        profile.syscalls.push_back(std::move(rule));
      }
    } else {
      CORDON_CHECK(refuse_key("", key));
    }
  }
  if (!has_default) {
    return bad("/defaultAction", "missing");
  }
  if (default_errno) {
    if (profile.default_action != SeccompAction::kErrno) {
      return bad("/defaultErrnoRet", "only meaningful with SCMP_ACT_ERRNO");
    }
    profile.default_errno_ret = *default_errno;
  }
  return profile;
}

Result<SeccompProfile> load_seccomp_profile(const std::string& path) {
  CORDON_TRY_CTX(text, sys::read_file_at(AT_FDCWD, path), "load seccomp profile `{}`", path);
  auto parsed = parse_seccomp_profile(text);
  if (!parsed) {
    return std::unexpected(std::move(parsed.error()).wrap("`{}`", path));
  }
  return parsed;
}

}  // namespace cordon::policy
