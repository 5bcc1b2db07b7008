// The seccomp profile parser and compiler (src/policy/seccomp_profile.cpp,
// src/sandbox/seccomp.cpp). An input that starts with '{' is profile JSON; anything else is
// decoded into a SeccompProfile directly, so the compiler sees profiles the JSON mutator
// rarely builds. Invariants:
//  - parse errors read "seccomp profile: ..."; compile errors have a message; nothing throws;
//  - a compiled profile's exported BPF answers, for every syscall a rule names and a sample of
//    others, with the action the profile says: the rule's for an unconditional rule or for
//    arguments that match exactly one conditional action, the default otherwise. libseccomp
//    can drop a rule silently; this is where that would show;
//  - another architecture (i386) and x32 numbers get KILL_PROCESS;
//  - both programs (profile and fixed) evaluate to an answer (never fall off the end).

#include <fuzzer/FuzzedDataProvider.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <seccomp.h>

#include <fmt/ranges.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.hpp"
#include "helpers/bpf_eval.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/seccomp.hpp"

namespace {

using namespace cordon::sandbox;
using cordon::fuzz::show;

// A small pool of names: real ones (with and without argument-heavy kernel paths), aliases
// that only exist on other architectures, and unknown ones.
const char* kNames[] = {"read",
                        "write",
                        "openat",
                        "ioctl",
                        "clone",
                        "clone3",
                        "ptrace",
                        "mount",
                        "socket",
                        "fchmodat",
                        "kill",
                        "prctl",
                        "mmap",
                        "personality",
                        "chown32",
                        "socketcall",
                        "no_such_syscall",
                        "process_vm_readv",
                        "execve",
                        "unshare",
                        "setns",
                        "bpf",
                        "keyctl",
                        "getpid"};

uint32_t ret_of(SeccompAction a, uint32_t errno_ret) {
  switch (a) {
    case SeccompAction::kAllow:
      return SECCOMP_RET_ALLOW;
    case SeccompAction::kErrno:
      return SECCOMP_RET_ERRNO | (errno_ret & SECCOMP_RET_DATA);
    case SeccompAction::kKillProcess:
      return SECCOMP_RET_KILL_PROCESS;
    case SeccompAction::kKillThread:
      return SECCOMP_RET_KILL_THREAD;
    case SeccompAction::kTrap:
      return SECCOMP_RET_TRAP;
    case SeccompAction::kLog:
      return SECCOMP_RET_LOG;
  }
  return 0xffffffff;
}

bool matches(const SeccompArg& c, uint64_t v) {
  switch (c.op) {
    case SeccompOp::kNotEqual:
      return v != c.value;
    case SeccompOp::kLessThan:
      return v < c.value;
    case SeccompOp::kLessEqual:
      return v <= c.value;
    case SeccompOp::kEqual:
      return v == c.value;
    case SeccompOp::kGreaterEqual:
      return v >= c.value;
    case SeccompOp::kGreaterThan:
      return v > c.value;
    case SeccompOp::kMaskedEqual:
      return (v & c.value) == c.value_two;
  }
  return false;
}

SeccompProfile decode(FuzzedDataProvider& fdp) {
  SeccompProfile p;
  auto action = [&] { return static_cast<SeccompAction>(fdp.ConsumeIntegralInRange<int>(0, 5)); };
  auto errno_ret = [&] {
    return fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint32_t>(0, 4200)
                             : fdp.ConsumeIntegral<uint32_t>();
  };
  p.default_action = action();
  p.default_errno_ret = errno_ret();
  if (fdp.ConsumeBool()) {
    p.architectures = {"SCMP_ARCH_X86_64"};
    if (fdp.ConsumeBool()) {
      p.architectures.push_back("SCMP_ARCH_X86");
    }
  }
  size_t n = fdp.ConsumeIntegralInRange<size_t>(0, 8);
  for (size_t i = 0; i < n; ++i) {
    SeccompRule r;
    size_t names = fdp.ConsumeIntegralInRange<size_t>(0, 4);
    for (size_t k = 0; k < names; ++k) {
      r.names.push_back(fdp.ConsumeBool() ? fdp.PickValueInArray(kNames)
                                          : fdp.ConsumeRandomLengthString(12));
    }
    r.action = action();
    r.errno_ret = errno_ret();
    size_t args = fdp.ConsumeIntegralInRange<size_t>(0, 3);
    for (size_t k = 0; k < args; ++k) {
      SeccompArg a;
      a.index = fdp.ConsumeIntegralInRange<unsigned>(0, 6);
      a.op = static_cast<SeccompOp>(fdp.ConsumeIntegralInRange<int>(0, 6));
      a.value = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint64_t>(0, 16)
                                  : fdp.ConsumeIntegral<uint64_t>();
      a.value_two = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<uint64_t>(0, 16)
                                      : fdp.ConsumeIntegral<uint64_t>();
      r.args.push_back(a);
    }
    p.syscalls.push_back(std::move(r));
  }
  return p;
}

struct Effective {
  uint32_t ret;
  std::vector<SeccompArg> args;
};

// Argument values worth trying against a comparison: both sides of every boundary, in both
// 32-bit halves (libseccomp compares 64-bit arguments as two 32-bit words).
void candidates(const SeccompArg& c, std::set<uint64_t>& out) {
  for (uint64_t v : {c.value, c.value_two, c.value & c.value_two, c.value | c.value_two}) {
    out.insert(v);
    out.insert(v + 1);
    out.insert(v - 1);
    out.insert(v ^ (uint64_t{1} << 32));
    out.insert(v ^ 1);
  }
}

std::string describe(const SeccompProfile& p, bool ptrace) {
  std::string out = fmt::format("default {}/{} ptrace {}\n", static_cast<int>(p.default_action),
                                p.default_errno_ret, ptrace);
  for (const auto& r : p.syscalls) {
    out += fmt::format("  [{}] action {}/{}", fmt::join(r.names, ","), static_cast<int>(r.action),
                       r.errno_ret);
    for (const auto& a : r.args) {
      out += fmt::format(" (arg{} op{} {:#x} {:#x})", a.index, static_cast<int>(a.op), a.value,
                         a.value_two);
    }
    out += "\n";
  }
  auto pfc = profile_pfc(p, SeccompOptions{.allow_ptrace = ptrace});
  return out + (pfc ? *pfc : pfc.error().message());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SeccompProfile profile;
  FuzzedDataProvider fdp(data, size);
  bool ptrace = false;
  if (size > 0 && data[0] == '{') {
    std::string_view text(reinterpret_cast<const char*>(data), size);
    auto parsed = cordon::policy::parse_seccomp_profile(text);
    if (!parsed) {
      FUZZ_CHECK(parsed.error().message().rfind("seccomp profile: ", 0) == 0,
                 "parse error `{}` does not start with `seccomp profile: `",
                 show(parsed.error().message()));
      return 0;
    }
    profile = std::move(*parsed);
    ptrace = size % 2 == 1;
  } else {
    ptrace = fdp.ConsumeBool();
    profile = decode(fdp);
  }
  auto compiled = compile_filters(profile, SeccompOptions{.allow_ptrace = ptrace});
  if (!compiled) {
    FUZZ_CHECK(!compiled.error().message().empty(), "a compile error without a message");
    return 0;
  }
  const auto& prog = compiled->profile.insns;
  const auto& fixed = compiled->fixed.insns;
  FUZZ_CHECK(!prog.empty() && prog.size() <= BPF_MAXINSNS, "{} instructions", prog.size());

  // The reference: what each syscall number should get.
  uint32_t dflt = ret_of(profile.default_action, profile.default_errno_ret);
  std::vector<std::pair<SeccompRule, bool>> rules;  // rule, counts
  for (auto r : profile.syscalls) {
    if (ptrace) {
      std::erase_if(r.names, [](const std::string& n) {
        return n == "ptrace" || n == "process_vm_readv" || n == "process_vm_writev";
      });
    }
    rules.push_back({r, true});
  }
  if (ptrace) {
    rules.push_back(
        {SeccompRule{
             {"ptrace", "process_vm_readv", "process_vm_writev"}, SeccompAction::kAllow, 0, {}},
         true});
  }
  std::map<int, std::vector<Effective>> by_nr;
  for (const auto& [r, counts] : rules) {
    uint32_t ret = ret_of(r.action, r.errno_ret);
    if (ret == dflt) {
      continue;  // compiled as a no-op (a warning)
    }
    for (const auto& name : r.names) {
      int nr = seccomp_syscall_resolve_name(name.c_str());
      if (nr < 0) {
        continue;
      }
      by_nr[nr].push_back({ret, r.args});
    }
  }

  uint64_t seed = size;
  auto rnd = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return seed >> 33;
  };
  std::set<int> nrs = {0, 1, 2, 59, 101, 435, 450};
  for (const auto& [nr, _] : by_nr) {
    nrs.insert(nr);
  }
  for (int nr : nrs) {
    const auto& effs = by_nr[nr];
    std::vector<std::set<uint64_t>> cand(6, std::set<uint64_t>{0, ~uint64_t{0}});
    for (const auto& e : effs) {
      for (const auto& a : e.args) {
        candidates(a, cand[a.index]);
      }
    }
    std::vector<std::vector<uint64_t>> pools;
    for (auto& c : cand) {
      pools.emplace_back(c.begin(), c.end());
    }
    int tries = effs.empty() ? 1 : 48;
    for (int t = 0; t < tries; ++t) {
      uint64_t args[6];
      for (size_t i = 0; i < 6; ++i) {
        args[i] = pools[i][rnd() % pools[i].size()];
      }
      std::set<uint32_t> hit;
      for (const auto& e : effs) {
        bool all = true;
        for (const auto& a : e.args) {
          all = all && matches(a, args[a.index]);
        }
        if (all) {
          hit.insert(e.ret);
        }
      }
      seccomp_data d =
          cordon::test::syscall_data(nr, {args[0], args[1], args[2], args[3], args[4], args[5]});
      auto got = cordon::test::bpf_eval(prog, d);
      FUZZ_CHECK(got.has_value(), "the profile program does not evaluate for nr {}", nr);
      FUZZ_CHECK(cordon::test::bpf_eval(fixed, d).has_value(),
                 "the fixed program does not evaluate for nr {}", nr);
      if (hit.size() > 1) {
        continue;  // overlapping conditional rules with different actions: libseccomp's choice
      }
      uint32_t want = hit.empty() ? dflt : *hit.begin();
      FUZZ_CHECK(*got == want,
                 "nr {} args {:#x} {:#x} {:#x} {:#x} {:#x} {:#x}: the filter answers {:#x}, the "
                 "profile says {:#x} ({} rules for it)\n{}",
                 nr, args[0], args[1], args[2], args[3], args[4], args[5], *got, want, effs.size(),
                 describe(profile, ptrace));
    }
  }
  // Other architectures and the x32 ABI never reach the rules.
  auto i386 = cordon::test::bpf_eval(prog, cordon::test::syscall_data(1, {}, AUDIT_ARCH_I386));
  FUZZ_CHECK(i386 == SECCOMP_RET_KILL_PROCESS, "i386 gets {:#x}", i386.value_or(0xdeadbeef));
  auto x32 = cordon::test::bpf_eval(prog, cordon::test::syscall_data(0x40000000 | 1));
  FUZZ_CHECK(x32 == SECCOMP_RET_KILL_PROCESS, "x32 gets {:#x}", x32.value_or(0xdeadbeef));
  return 0;
}
