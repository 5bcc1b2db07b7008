#define BOOST_TEST_MODULE policy_seccomp_profile
#include "policy/seccomp_profile.hpp"

#include <seccomp.h>
#include <sys/syscall.h>

#include <boost/test/unit_test.hpp>
#include <string>

#include "helpers/bpf_eval.hpp"
#include "sandbox/seccomp.hpp"

using namespace cordon;
using namespace cordon::policy;
using sandbox::SeccompAction;
using sandbox::SeccompOp;
using sandbox::SeccompProfile;

namespace {

// Boost evaluates a message even when the check passes; never touch error() of a value.
template <class T>
std::string error_text(const Result<T>& r) {
  return r.has_value() ? std::string() : r.error().message();
}

const std::string kDefaultProfile = std::string(CORDON_SECCOMP_DIR) + "/default.json";

std::string error_of(std::string_view text) {
  auto r = parse_seccomp_profile(text);
  if (r.has_value()) {
    return "(parsed)";
  }
  BOOST_TEST((r.error().code() == ErrorCode::kInvalid));
  return r.error().message();
}

const SeccompProfile& shipped() {
  static const SeccompProfile profile = [] {
    auto r = load_seccomp_profile(kDefaultProfile);
    BOOST_REQUIRE_MESSAGE(r.has_value(), error_text(r));
    return *r;
  }();
  return profile;
}

const std::vector<std::string> kEpermSet = {
    "mount",
    "umount2",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "pivot_root",
    "chroot",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "unshare",
    "setns",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "quotactl",
    "lookup_dcookie",
    "vhangup",
    "iopl",
    "ioperm",
    "syslog",
    "nfsservctl",
    "fanotify_init",
};

}  // namespace

BOOST_AUTO_TEST_CASE(parses_every_accepted_field) {
  auto r = parse_seccomp_profile(R"({
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 38,
    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
    "flags": [],
    "syscalls": [
      {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW", "comment": "io"},
      {"names": ["kill"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
       "args": [{"index": 1, "value": 9, "op": "SCMP_CMP_EQ"},
                {"index": 0, "value": 4294967295, "valueTwo": 18446744073709551615,
                 "op": "SCMP_CMP_MASKED_EQ"}]},
      {"names": ["mount"], "action": "SCMP_ACT_ERRNO"},
      {"names": ["a"], "action": "SCMP_ACT_KILL"},
      {"names": ["b"], "action": "SCMP_ACT_KILL_THREAD"},
      {"names": ["c"], "action": "SCMP_ACT_KILL_PROCESS"},
      {"names": ["d"], "action": "SCMP_ACT_TRAP"},
      {"names": ["e"], "action": "SCMP_ACT_LOG",
       "args": [{"index": 5, "value": 1, "op": "SCMP_CMP_NE"},
                {"index": 4, "value": 1, "op": "SCMP_CMP_LT"},
                {"index": 3, "value": 1, "op": "SCMP_CMP_LE"},
                {"index": 2, "value": 1, "op": "SCMP_CMP_GE"},
                {"index": 1, "value": 1, "op": "SCMP_CMP_GT"}]}
    ]
  })");
  BOOST_REQUIRE_MESSAGE(r.has_value(), error_text(r));
  const SeccompProfile& p = *r;
  BOOST_TEST((p.default_action == SeccompAction::kErrno));
  BOOST_TEST(p.default_errno_ret == 38u);
  BOOST_TEST((p.architectures == std::vector<std::string>{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86"}));
  BOOST_REQUIRE(p.syscalls.size() == 8u);
  BOOST_TEST((p.syscalls[0].names == std::vector<std::string>{"read", "write"}));
  BOOST_TEST((p.syscalls[0].action == SeccompAction::kAllow));
  BOOST_TEST(p.syscalls[0].args.empty());
  BOOST_TEST(p.syscalls[1].errno_ret == 13u);
  BOOST_REQUIRE(p.syscalls[1].args.size() == 2u);
  BOOST_TEST(p.syscalls[1].args[0].index == 1u);
  BOOST_TEST((p.syscalls[1].args[0].op == SeccompOp::kEqual));
  BOOST_TEST(p.syscalls[1].args[0].value == 9u);
  BOOST_TEST(p.syscalls[1].args[0].value_two == 0u);
  BOOST_TEST((p.syscalls[1].args[1].op == SeccompOp::kMaskedEqual));
  BOOST_TEST(p.syscalls[1].args[1].value == 0xffffffffULL);
  BOOST_TEST(p.syscalls[1].args[1].value_two == ~0ULL);
  BOOST_TEST(p.syscalls[2].errno_ret == 1u);  // OCI: EPERM when errnoRet is absent
  BOOST_TEST((p.syscalls[3].action == SeccompAction::kKillThread));
  BOOST_TEST((p.syscalls[4].action == SeccompAction::kKillThread));
  BOOST_TEST((p.syscalls[5].action == SeccompAction::kKillProcess));
  BOOST_TEST((p.syscalls[6].action == SeccompAction::kTrap));
  BOOST_TEST((p.syscalls[7].action == SeccompAction::kLog));
  BOOST_TEST((p.syscalls[7].args[0].op == SeccompOp::kNotEqual));
  BOOST_TEST((p.syscalls[7].args[1].op == SeccompOp::kLessThan));
  BOOST_TEST((p.syscalls[7].args[2].op == SeccompOp::kLessEqual));
  BOOST_TEST((p.syscalls[7].args[3].op == SeccompOp::kGreaterEqual));
  BOOST_TEST((p.syscalls[7].args[4].op == SeccompOp::kGreaterThan));
}

BOOST_AUTO_TEST_CASE(names_the_offending_field_with_a_json_pointer) {
  const std::string head = R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [)";
  const std::string ok = R"({"names": ["read"], "action": "SCMP_ACT_ALLOW"}, )";
  BOOST_TEST(error_of(head + ok + ok + ok + R"({"names": ["x"], "action": "SCMP_ACT_FOO"}]})") ==
             "seccomp profile: /syscalls/3/action: unknown action \"SCMP_ACT_FOO\"");
  BOOST_TEST(error_of(head + ok + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                      "includes": {"caps": ["CAP_SYS_ADMIN"]}}]})") ==
             "seccomp profile: /syscalls/1/includes: Docker's conditional rules (capabilities, "
             "kernel versions) are not supported; list the syscalls a rule applies to "
             "explicitly");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "excludes": {}}]})")
                 .starts_with("seccomp profile: /syscalls/0/excludes: Docker's conditional"));
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW", "nmae": 1}]})") ==
             "seccomp profile: /syscalls/0/nmae: unknown key");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ",
                                           "x/y~": 2}]}]})") ==
             "seccomp profile: /syscalls/0/args/0/x~1y~0: unknown key");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]}]})") ==
             "seccomp profile: /syscalls/0/args/0/index: 6 is above 5");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "args": [{"index": 0, "value": -1, "op": "SCMP_CMP_EQ"}]}]})") ==
             "seccomp profile: /syscalls/0/args/0/value: expected a non-negative integer, got "
             "negative integer");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "args": [{"index": 0, "value": 1.5, "op": "SCMP_CMP_EQ"}]}]})") ==
             "seccomp profile: /syscalls/0/args/0/value: expected a non-negative integer, got "
             "number");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_IN"}]}]})") ==
             "seccomp profile: /syscalls/0/args/0/op: unknown operator \"SCMP_CMP_IN\"");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW",
                                 "args": [{"value": 1, "op": "SCMP_CMP_EQ"}]}]})") ==
             "seccomp profile: /syscalls/0/args/0/index: missing");
  BOOST_TEST(error_of(head + R"({"names": "read", "action": "SCMP_ACT_ALLOW"}]})") ==
             "seccomp profile: /syscalls/0/names: expected an array, got string");
  BOOST_TEST(error_of(head + R"({"names": ["read", 3], "action": "SCMP_ACT_ALLOW"}]})") ==
             "seccomp profile: /syscalls/0/names/1: expected a string, got non-negative integer");
  BOOST_TEST(error_of(head + R"({"names": [], "action": "SCMP_ACT_ALLOW"}]})") ==
             "seccomp profile: /syscalls/0/names: empty");
  BOOST_TEST(error_of(head + R"({"action": "SCMP_ACT_ALLOW"}]})") ==
             "seccomp profile: /syscalls/0/names: missing");
  BOOST_TEST(error_of(head + R"({"names": ["x"]}]})") ==
             "seccomp profile: /syscalls/0/action: missing");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ALLOW", "errnoRet": 1}]})") ==
             "seccomp profile: /syscalls/0/errnoRet: only meaningful with SCMP_ACT_ERRNO");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_ERRNO",
                                 "errnoRet": 4096}]})") ==
             "seccomp profile: /syscalls/0/errnoRet: 4096 is above 4095");
  BOOST_TEST(error_of(head + R"({"names": ["x"], "action": "SCMP_ACT_NOTIFY"}]})") ==
             "seccomp profile: /syscalls/0/action: action \"SCMP_ACT_NOTIFY\" is not supported: "
             "no tracer or notify agent runs");
  BOOST_TEST(error_of(head + "3]}") ==
             "seccomp profile: /syscalls/0: expected an object, got non-negative integer");
}

BOOST_AUTO_TEST_CASE(refuses_malformed_top_level_fields) {
  BOOST_TEST(error_of("{") == "seccomp profile: not valid JSON");
  BOOST_TEST(error_of("[]") == "seccomp profile: /: expected an object, got array");
  BOOST_TEST(error_of("{}") == "seccomp profile: /defaultAction: missing");
  BOOST_TEST(error_of(R"({"defaultAction": 1})") ==
             "seccomp profile: /defaultAction: expected a string, got non-negative integer");
  BOOST_TEST(error_of(R"({"defaultAction": "SCMP_ACT_ALLOW", "defaultErrnoRet": 1})") ==
             "seccomp profile: /defaultErrnoRet: only meaningful with SCMP_ACT_ERRNO");
  BOOST_TEST(
      error_of(R"({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_VAX"]})") ==
      "seccomp profile: /architectures/0: unknown architecture \"SCMP_ARCH_VAX\"");
  BOOST_TEST(
      error_of(R"({"defaultAction": "SCMP_ACT_ERRNO", "flags": ["SECCOMP_FILTER_FLAG_LOG"]})") ==
      "seccomp profile: /flags/0: filter flags are not supported");
  BOOST_TEST(error_of(R"({"defaultAction": "SCMP_ACT_ERRNO", "archMap": []})") ==
             "seccomp profile: /archMap: Docker's archMap is not supported; cordon filters "
             "x86_64 only");
  BOOST_TEST(error_of(R"({"defaultAction": "SCMP_ACT_ERRNO", "listenerPath": "/x"})") ==
             "seccomp profile: /listenerPath: seccomp user notification is not supported");
  BOOST_TEST(error_of(R"({"defaultAction": "SCMP_ACT_ERRNO", "syscals": []})") ==
             "seccomp profile: /syscals: unknown key");
  BOOST_TEST(error_of(R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": {}})") ==
             "seccomp profile: /syscalls: expected an array, got object");
}

BOOST_AUTO_TEST_CASE(load_names_the_path) {
  auto r = load_seccomp_profile("/nonexistent/cordon/profile.json");
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("load seccomp profile `/nonexistent/cordon/profile.json`") !=
                 std::string::npos,
             r.error().message());
  BOOST_TEST(r.error().sys_errno() == ENOENT);
}

BOOST_AUTO_TEST_CASE(shipped_default_is_an_enosys_allowlist_without_conditions) {
  const SeccompProfile& p = shipped();
  BOOST_TEST((p.default_action == SeccompAction::kErrno));
  BOOST_TEST(p.default_errno_ret == 38u);
  for (const auto& rule : p.syscalls) {
    BOOST_TEST(rule.args.empty());  // every argument check lives in the fixed filter
  }
  auto compiled = sandbox::compile_filters(p, {});
  BOOST_REQUIRE_MESSAGE(compiled.has_value(), error_text(compiled));
  // Every name is an x86_64 syscall libseccomp knows, and no rule is redundant.
  BOOST_TEST(compiled->warnings.empty());
  for (const auto& w : compiled->warnings) {
    BOOST_TEST_MESSAGE(w);
  }
}

BOOST_AUTO_TEST_CASE(shipped_default_answers_as_documented) {
  auto compiled = sandbox::compile_filters(shipped(), {});
  BOOST_REQUIRE(compiled.has_value());
  const auto& prog = compiled->profile.insns;
  auto answer = [&](const std::string& name) {
    int nr = seccomp_syscall_resolve_name(name.c_str());
    BOOST_REQUIRE_MESSAGE(nr >= 0, name);
    return test::bpf_answer(prog, test::syscall_data(nr));
  };
  for (const std::string& name : kEpermSet) {
    BOOST_TEST(answer(name) == test::ret_errno(1), name);
  }
  BOOST_TEST(answer("clone3") == test::ret_errno(38));  // glibc falls back to clone
  for (const char* name :
       {"read",        "write", "openat",    "execve", "clone",       "fork",       "vfork",
        "wait4",       "mmap",  "ioctl",     "socket", "connect",     "chmod",      "getdents64",
        "statx",       "rseq",  "getrandom", "prctl",  "personality", "arch_prctl", "futex",
        "epoll_pwait", "pipe2", "dup3",      "rename", "utimensat"}) {
    BOOST_TEST(answer(name) == test::kRetAllow, name);
  }
  BOOST_TEST(test::bpf_answer(prog, test::syscall_data(1000)) == test::ret_errno(38));
  BOOST_TEST(test::bpf_answer(prog, test::syscall_data(462)) == test::ret_errno(38));  // mseal

  // The PFC agrees, and has no argument comparison at all.
  auto pfc = sandbox::profile_pfc(shipped(), {});
  BOOST_REQUIRE(pfc.has_value());
  for (const char* arg : {"$a0", "$a1", "$a2", "$a3", "$a4", "$a5"}) {
    BOOST_TEST(pfc->find(arg) == std::string::npos, arg);
  }
  BOOST_TEST(pfc->find("# default action\n  action ERRNO(38);") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(shipped_default_allows_ptrace_only_with_the_option) {
  auto with = sandbox::compile_filters(shipped(), sandbox::SeccompOptions{.allow_ptrace = true});
  BOOST_REQUIRE(with.has_value());
  BOOST_TEST(with->warnings.empty());
  for (int nr : {SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev}) {
    BOOST_TEST(test::bpf_answer(with->profile.insns, test::syscall_data(nr)) == test::kRetAllow);
  }
  BOOST_TEST(test::bpf_answer(with->profile.insns, test::syscall_data(SYS_mount)) ==
             test::ret_errno(1));
}
