// The policy parser (src/policy/policy.cpp): parse_policy() on arbitrary text. Invariants:
//  - it never throws and is deterministic (same text, same outcome, same message);
//  - a refusal is kInvalid and reads "policy: <JSON pointer>: ...";
//  - an accepted policy is within the bounds docs/policy.md promises: absolute normalised
//    paths, defaultTimeoutMs <= maxTimeoutMs, perSession <= total, runAsUid != 0, rules that
//    can match and say why, sha256 pins of 64 lower-case hex digits;
//  - a JSON object with a key outside policy_keys() is never accepted.

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "base/strings.hpp"
#include "fuzz/fuzz_check.hpp"
#include "policy/policy.hpp"

namespace {

using cordon::fuzz::show;
using json = nlohmann::json;

void check_path(const std::string& p, const char* what) {
  FUZZ_CHECK(!p.empty() && p[0] == '/', "{} `{}` is not absolute", what, show(p));
  FUZZ_CHECK(cordon::normalize_path(p) == p, "{} `{}` is not normalised", what, show(p));
  FUZZ_CHECK(p.find('\0') == std::string::npos, "{} `{}` has a NUL", what, show(p));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto a = cordon::policy::parse_policy(text);
  auto b = cordon::policy::parse_policy(text);
  FUZZ_CHECK(a.has_value() == b.has_value(), "parse_policy is not deterministic");
  if (!a) {
    const cordon::Error& e = a.error();
    FUZZ_CHECK(e.code() == cordon::ErrorCode::kInvalid, "a refusal of kind {}: {}",
               static_cast<int>(e.code()), e.message());
    FUZZ_CHECK(e.message().rfind("policy: ", 0) == 0,
               "message `{}` does not start with policy:", show(e.message()));
    FUZZ_CHECK(e.message() == b.error().message(), "two messages for one text");
    return 0;
  }
  const cordon::policy::Policy& p = *a;
  json j = json::parse(text, nullptr, false);
  FUZZ_CHECK(j.is_object(), "accepted text that is not a JSON object");
  const auto& keys = cordon::policy::policy_keys();
  for (const auto& [k, v] : j.items()) {
    FUZZ_CHECK(std::find(keys.begin(), keys.end(), k) != keys.end(), "accepted unknown key `{}`",
               show(k));
  }
  check_path(p.cwd_root, "cwdRoot");
  for (const auto& e : p.allowed_executables) {
    check_path(e.path, "allowedExecutables entry");
    if (e.sha256) {
      FUZZ_CHECK(e.sha256->size() == 64 &&
                     e.sha256->find_first_not_of("0123456789abcdef") == std::string::npos,
                 "sha256 pin `{}`", show(*e.sha256));
    }
  }
  for (const auto& r : p.read_only_paths) {
    check_path(r, "readOnlyPaths entry");
  }
  for (const auto& r : p.mask_paths) {
    check_path(r, "maskPaths entry");
  }
  if (p.seccomp_profile) {
    check_path(*p.seccomp_profile, "seccompProfile");
  }
  FUZZ_CHECK(p.default_timeout_ms >= 1 && p.default_timeout_ms <= p.max_timeout_ms,
             "defaultTimeoutMs {} maxTimeoutMs {}", p.default_timeout_ms, p.max_timeout_ms);
  FUZZ_CHECK(p.concurrency.per_session >= 1 && p.concurrency.per_session <= p.concurrency.total,
             "concurrency {}/{}", p.concurrency.per_session, p.concurrency.total);
  FUZZ_CHECK(p.run_as_uid != 0, "runAsUid 0 accepted");
  FUZZ_CHECK(p.max_output_bytes >= 1, "maxOutputBytes 0 accepted");
  FUZZ_CHECK(p.limits.memory_bytes > 0 && p.limits.pids > 0 && p.limits.cpus > 0,
             "a zero limit accepted");
  FUZZ_CHECK(p.quotas.max_jobs >= 1, "quotas.maxJobs 0 accepted");
  for (const auto& r : p.rules) {
    FUZZ_CHECK(!r.refuse.empty(), "a rule without a message");
    FUZZ_CHECK(!r.argv_prefix.empty() || r.argv_contains.has_value(), "a rule that never matches");
  }
  for (const auto& [k, v] : p.env.set) {
    FUZZ_CHECK(!k.empty() && k.find('=') == std::string::npos && k.find('\0') == std::string::npos,
               "env.set name `{}`", show(k));
  }
  return 0;
}
