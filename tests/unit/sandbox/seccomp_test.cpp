#define BOOST_TEST_MODULE sandbox_seccomp
#include "sandbox/seccomp.hpp"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "helpers/bpf_eval.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;
using namespace cordon::sandbox;
using cordon::test::bpf_answer;
using cordon::test::kRetAllow;
using cordon::test::kRetKillProcess;
using cordon::test::ret_errno;
using cordon::test::syscall_data;

namespace {

// Boost evaluates a message even when the check passes; never touch error() of a value.
template <class T>
std::string error_text(const Result<T>& r) {
  return r.has_value() ? std::string() : r.error().message();
}

constexpr uint32_t kEperm = ret_errno(1);
constexpr uint32_t kEnosys = ret_errno(38);
constexpr uint32_t kEafnosupport = ret_errno(97);
constexpr uint32_t kEprotonosupport = ret_errno(93);

// The PFC block of one syscall: from its "# filter for syscall" line to the next one.
std::string pfc_block(const std::string& pfc, const std::string& name) {
  std::string head = "# filter for syscall \"" + name + "\"";
  size_t start = pfc.find(head);
  if (start == std::string::npos) {
    return {};
  }
  size_t end = pfc.find("# filter for syscall", start + head.size());
  size_t def = pfc.find("# default action", start);
  if (end == std::string::npos || (def != std::string::npos && def < end)) {
    end = def;
  }
  return pfc.substr(start, end - start);
}

const CompiledFilters& fixed_only(bool netlink_route = false) {
  // An allow-all profile, so every answer below comes from the fixed filter.
  auto compile = [](bool netlink) {
    SeccompProfile p;
    p.default_action = SeccompAction::kAllow;
    auto r = compile_filters(p, {.allow_netlink_route = netlink});
    BOOST_REQUIRE_MESSAGE(r.has_value(), error_text(r));
    return *r;
  };
  static const CompiledFilters without = compile(false), with = compile(true);
  return netlink_route ? with : without;
}

uint32_t fixed_answer(int nr, std::initializer_list<uint64_t> args, bool netlink_route = false) {
  return bpf_answer(fixed_only(netlink_route).fixed.insns, syscall_data(nr, args));
}

SeccompRule rule(std::vector<std::string> names, SeccompAction action, uint32_t err = 1,
                 std::vector<SeccompArg> args = {}) {
  return SeccompRule{std::move(names), action, err, std::move(args)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(fixed_pfc_keeps_every_conditional_rule) {
  auto pfc = fixed_pfc();
  BOOST_REQUIRE_MESSAGE(pfc.has_value(), error_text(pfc));

  // ioctl: 32-bit masked compares (the high word is masked out entirely).
  std::string ioctl = pfc_block(*pfc, "ioctl");
  BOOST_TEST(ioctl.find("$a1.hi32 & 0x00000000 == 0") != std::string::npos);
  for (const char* cmd : {"== 21522", "== 21532", "== 21539"}) {  // TIOCSTI, TIOCLINUX, TIOCSETD
    BOOST_TEST((ioctl.find(std::string("$a1.lo32 & 0xffffffff ") + cmd) != std::string::npos),
               "ioctl " << cmd);
  }

  struct Mode {
    const char* name;
    const char* arg;
  };
  for (Mode m : {Mode{"chmod", "$a1"}, Mode{"fchmod", "$a1"}, Mode{"fchmodat", "$a2"},
                 Mode{"fchmodat2", "$a2"}, Mode{"mkdir", "$a1"}, Mode{"mkdirat", "$a2"},
                 Mode{"mknod", "$a1"}, Mode{"mknodat", "$a2"}, Mode{"creat", "$a1"}}) {
    std::string block = pfc_block(*pfc, m.name);
    BOOST_TEST_CONTEXT(m.name) {
      BOOST_TEST(
          (block.find(std::string(m.arg) + ".lo32 & 0x00000800 == 2048") != std::string::npos));
      BOOST_TEST(
          (block.find(std::string(m.arg) + ".lo32 & 0x00000400 == 1024") != std::string::npos));
    }
  }
  for (auto [name, flags, mode] :
       {std::tuple{"open", "$a1", "$a2"}, std::tuple{"openat", "$a2", "$a3"}}) {
    std::string block = pfc_block(*pfc, name);
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST((block.find(std::string(flags) + ".lo32 & 0x00000040 == 64") !=
                  std::string::npos));  // O_CREAT
      BOOST_TEST((block.find(std::string(flags) + ".lo32 & 0x00410000 == 4259840") !=
                  std::string::npos));  // O_TMPFILE
      BOOST_TEST(
          (block.find(std::string(mode) + ".lo32 & 0x00000800 == 2048") != std::string::npos));
      BOOST_TEST(
          (block.find(std::string(mode) + ".lo32 & 0x00000400 == 1024") != std::string::npos));
    }
  }
  for (const char* name : {"clone", "unshare"}) {
    std::string block = pfc_block(*pfc, name);
    for (const char* flag : {"0x00020000", "0x10000000", "0x20000000", "0x40000000", "0x08000000",
                             "0x04000000", "0x02000000", "0x00000080"}) {
      BOOST_TEST((block.find(std::string("$a0.lo32 & ") + flag) != std::string::npos),
                 name << " " << flag);
    }
  }
  BOOST_TEST(pfc_block(*pfc, "openat2").find("action ERRNO(38)") != std::string::npos);
  BOOST_TEST(pfc_block(*pfc, "clone3").find("action ERRNO(38)") != std::string::npos);
  // The family allowlist ends at AF_INET6 (10); with the netlink opt-in at AF_NETLINK (16),
  // whose protocol is checked then.
  auto with_netlink = fixed_pfc({.allow_netlink_route = true});
  BOOST_REQUIRE_MESSAGE(with_netlink.has_value(), error_text(with_netlink));
  for (const char* name : {"socket", "socketpair"}) {
    std::string block = pfc_block(*pfc, name);
    BOOST_TEST(block.find("$a0.lo32 > 10") != std::string::npos, name);
    BOOST_TEST(block.find("$a0.lo32 == 16") == std::string::npos, name);
    BOOST_TEST(block.find("action ERRNO(97)") != std::string::npos, name);
    std::string opted = pfc_block(*with_netlink, name);
    BOOST_TEST(opted.find("$a0.lo32 > 16") != std::string::npos, name);
    BOOST_TEST(opted.find("$a0.lo32 == 16") != std::string::npos, name);
    BOOST_TEST(opted.find("action ERRNO(97)") != std::string::npos, name);
  }
  BOOST_TEST(pfc_block(*pfc, "personality").find("action ERRNO(1)") != std::string::npos);
  BOOST_TEST(pfc->find("action ALLOW;\n# invalid architecture action\naction KILL_PROCESS") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(every_program_kills_x32_and_foreign_architectures) {
  const CompiledFilters& f = fixed_only();
  auto init = compile_init_filter();
  BOOST_REQUIRE(init.has_value());
  for (const BpfProgram* prog :
       std::initializer_list<const BpfProgram*>{&f.profile, &f.fixed, &*init}) {
    // x32: the x86_64 arch with bit 30 set in the number (getpid there).
    BOOST_TEST(bpf_answer(prog->insns, syscall_data(0x40000000 | SYS_getpid)) == kRetKillProcess);
    BOOST_TEST(bpf_answer(prog->insns, syscall_data(SYS_getpid, {}, AUDIT_ARCH_I386)) ==
               kRetKillProcess);
  }
}

BOOST_AUTO_TEST_CASE(ioctl_check_ignores_the_high_word) {
  BOOST_TEST(fixed_answer(SYS_ioctl, {0, 0x5412}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_ioctl, {0, (1ULL << 32) | 0x5412}) == kEperm);  // CVE-2019-10063
  BOOST_TEST(fixed_answer(SYS_ioctl, {0, 0x541C}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_ioctl, {0, 0x5423}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_ioctl, {0, 0x5401}) == kRetAllow);  // TCGETS
}

BOOST_AUTO_TEST_CASE(refuses_setuid_and_setgid_modes) {
  BOOST_TEST(fixed_answer(SYS_chmod, {0, 04755}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_chmod, {0, 02755}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_chmod, {0, 0755}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_chmod, {0, 01777}) == kRetAllow);  // sticky is harmless
  BOOST_TEST(fixed_answer(SYS_fchmodat, {0, 0, 04755}) == kEperm);
  BOOST_TEST(fixed_answer(static_cast<int>(sys::kNrFchmodat2), {0, 0, 06755, 0}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_mknodat, {0, 0, 0100000 | 04755, 0}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_open, {0, O_CREAT | O_WRONLY, 06755}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_openat, {0, 0, O_CREAT | O_WRONLY, 04755}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_openat, {0, 0, O_TMPFILE | O_RDWR, 02755}) == kEperm);
  BOOST_TEST(fixed_answer(SYS_openat, {0, 0, O_CREAT | O_WRONLY, 0644}) == kRetAllow);
  // Without O_CREAT/O_TMPFILE the mode argument is ignored by the kernel; so is the filter.
  BOOST_TEST(fixed_answer(SYS_openat, {0, 0, O_RDONLY, 04755}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_openat2, {0, 0, 0, 24}) == kEnosys);
}

BOOST_AUTO_TEST_CASE(refuses_namespace_flags_on_clone_and_unshare) {
  for (uint64_t flag : {CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC,
                        CLONE_NEWUTS, CLONE_NEWCGROUP, 0x80}) {
    BOOST_TEST(fixed_answer(SYS_clone, {flag | SIGCHLD}) == kEperm, flag);
    BOOST_TEST(fixed_answer(SYS_unshare, {flag}) == kEperm, flag);
  }
  // What glibc's fork and pthread_create pass.
  BOOST_TEST(fixed_answer(SYS_clone, {SIGCHLD}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_clone, {CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND |
                                      CLONE_THREAD | CLONE_SYSVSEM | CLONE_SETTLS |
                                      CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_unshare, {CLONE_FILES}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_clone3, {0, 88}) == kEnosys);
  BOOST_TEST(fixed_answer(SYS_io_uring_setup, {8, 0}) == kEperm);
}

// AF_NETLINK only with SeccompOptions::allow_netlink_route (session 29: the replies a netlink
// socket queues are charged to no memory cgroup).
BOOST_AUTO_TEST_CASE(allows_only_listed_socket_families) {
  for (bool netlink : {false, true}) {
    for (uint64_t family = 0; family < 64; ++family) {
      bool allowed = family == AF_UNIX || family == AF_INET || family == AF_INET6 ||
                     (netlink && family == AF_NETLINK);
      for (int nr : {SYS_socket, SYS_socketpair}) {
        BOOST_TEST(fixed_answer(nr, {family, SOCK_STREAM, 0}, netlink) ==
                       (allowed ? kRetAllow : kEafnosupport),
                   "nr " << nr << " family " << family << " netlink " << netlink);
      }
    }
  }
  BOOST_TEST(fixed_answer(SYS_socket, {AF_NETLINK, SOCK_RAW, 0}) == kEafnosupport);  // by default
  BOOST_TEST(fixed_answer(SYS_socket, {40, SOCK_STREAM, 0}) == kEafnosupport);       // AF_VSOCK
  // The kernel truncates the family to an int: bit 32 must not smuggle in AF_VSOCK.
  BOOST_TEST(fixed_answer(SYS_socket, {(1ULL << 32) | 40, SOCK_STREAM, 0}) == kEafnosupport);
  BOOST_TEST(fixed_answer(SYS_socket, {~0ULL, SOCK_STREAM, 0}) == kEafnosupport);
  BOOST_TEST(fixed_answer(SYS_socket, {AF_NETLINK, SOCK_RAW, 0}, true) == kRetAllow);      // ROUTE
  BOOST_TEST(fixed_answer(SYS_socket, {AF_NETLINK, SOCK_RAW, 9}, true) == kEafnosupport);  // AUDIT
  BOOST_TEST(fixed_answer(SYS_socket, {AF_NETLINK, SOCK_RAW, 1ULL << 32}, true) == kEafnosupport);
}

// Inet sockets: TCP, UDP and ping only, by protocol and by type (protocol 0 is the type's
// first protocol: SOCK_SEQPACKET is SCTP's). Checked against a model of the whole rule set,
// over every family near the allowed ones, every type's low bits with and without the flag
// bits, and protocols around each allowed value and above 32 bits, so a rule miscompiled next
// to the family and netlink rules (libseccomp 2.5.4 has dropped and misordered such rules
// before) shows up as a wrong answer.
BOOST_AUTO_TEST_CASE(inet_sockets_only_with_tcp_udp_and_ping_protocols) {
  auto model = [](uint64_t family, uint64_t type, uint64_t protocol, bool netlink) {
    if (family != AF_UNIX && family != AF_INET && family != AF_INET6 &&
        !(netlink && family == AF_NETLINK)) {
      return kEafnosupport;
    }
    if (family == AF_NETLINK) {
      return protocol == 0 ? kRetAllow : kEafnosupport;
    }
    if (family == AF_INET || family == AF_INET6) {
      uint64_t t = type & 0xf;
      bool type_ok = t == SOCK_STREAM || t == SOCK_DGRAM || t == SOCK_RAW;
      uint64_t icmp = family == AF_INET ? uint64_t{IPPROTO_ICMP} : uint64_t{IPPROTO_ICMPV6};
      bool protocol_ok =
          protocol == 0 || protocol == IPPROTO_TCP || protocol == IPPROTO_UDP || protocol == icmp;
      return type_ok && protocol_ok ? kRetAllow : kEprotonosupport;
    }
    return kRetAllow;
  };
  std::vector<uint64_t> protocols = {1ULL << 32,
                                     (1ULL << 32) | IPPROTO_TCP,
                                     ~0ULL,
                                     0xffffffff,
                                     IPPROTO_MPTCP,
                                     IPPROTO_UDPLITE,
                                     IPPROTO_SCTP,
                                     255,
                                     256};
  for (uint64_t p = 0; p < 80; ++p) {
    protocols.push_back(p);
  }
  size_t checked = 0;
  for (uint64_t family = 0; family < 16; ++family) {
    for (uint64_t low : {0ULL, 1ULL, 2ULL, 3ULL, 4ULL, 5ULL, 6ULL, 7ULL, 8ULL, 10ULL, 15ULL}) {
      for (uint64_t flags :
           {uint64_t{0}, uint64_t{SOCK_CLOEXEC | SOCK_NONBLOCK}, uint64_t{1} << 32}) {
        for (uint64_t protocol : protocols) {
          for (int nr : {SYS_socket, SYS_socketpair}) {
            for (bool netlink : {false, true}) {
              uint32_t want = model(family, low | flags, protocol, netlink);
              uint32_t got = fixed_answer(nr, {family, low | flags, protocol}, netlink);
              ++checked;
              if (got != want) {
                BOOST_ERROR("nr " << nr << " family " << family << " type " << (low | flags)
                                  << " protocol " << protocol << " netlink " << netlink << ": "
                                  << got << " != " << want);
              }
            }
          }
        }
      }
    }
  }
  BOOST_TEST(checked > 100000u);
  // The cases the security suite tries in a sandbox.
  BOOST_TEST(fixed_answer(SYS_socket, {AF_INET, SOCK_STREAM, IPPROTO_MPTCP}) == kEprotonosupport);
  BOOST_TEST(fixed_answer(SYS_socket, {AF_INET6, SOCK_STREAM, IPPROTO_MPTCP}) == kEprotonosupport);
  BOOST_TEST(fixed_answer(SYS_socket, {AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE}) == kEprotonosupport);
  BOOST_TEST(fixed_answer(SYS_socketpair, {AF_INET, SOCK_STREAM, IPPROTO_MPTCP}) ==
             kEprotonosupport);
  BOOST_TEST(fixed_answer(SYS_socket, {AF_INET, SOCK_DGRAM, IPPROTO_ICMP}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_socket, {AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_socket, {AF_INET, SOCK_RAW, IPPROTO_ICMP}) == kRetAllow);  // caps
}

BOOST_AUTO_TEST_CASE(allows_only_docker_personalities) {
  const uint64_t allowed[] = {0, 0x8, 0x20000, 0x20008, 0xffffffff};
  for (uint64_t v : allowed) {
    BOOST_TEST(fixed_answer(SYS_personality, {v}) == kRetAllow, v);
  }
  for (int bit = 0; bit < 64; ++bit) {
    uint64_t v = 1ULL << bit;
    bool ok = v == 0x8 || v == 0x20000;
    BOOST_TEST(fixed_answer(SYS_personality, {v}) == (ok ? kRetAllow : kEperm), v);
  }
  for (uint64_t v : {0x1ULL, 0x7ULL, 0x9ULL, 0x1ffffULL, 0x20001ULL, 0x20007ULL, 0x20009ULL,
                     0x0040000ULL /* ADDR_NO_RANDOMIZE */, 0x0400000ULL /* READ_IMPLIES_EXEC */,
                     0xfffffffeULL, 0x100000000ULL, 0x1ffffffffULL}) {
    BOOST_TEST(fixed_answer(SYS_personality, {v}) == kEperm, v);
  }
}

BOOST_AUTO_TEST_CASE(fixed_filter_allows_everything_else) {
  BOOST_TEST(fixed_answer(SYS_getpid, {}) == kRetAllow);
  BOOST_TEST(fixed_answer(SYS_mount, {}) == kRetAllow);  // the profile's business
  BOOST_TEST(fixed_answer(1000, {}) == kRetAllow);
}

BOOST_AUTO_TEST_CASE(profile_answers_and_skips_with_warnings) {
  SeccompProfile p;
  p.default_action = SeccompAction::kErrno;
  p.default_errno_ret = 38;
  p.architectures = {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_AARCH64"};
  p.syscalls = {
      rule({"getpid", "no_such_syscall", "chown32"}, SeccompAction::kAllow),
      rule({"mount"}, SeccompAction::kErrno, 1),
      rule({"uname"}, SeccompAction::kErrno, 38),  // equals the default
  };
  auto r = compile_filters(p, {});
  BOOST_REQUIRE_MESSAGE(r.has_value(), error_text(r));
  const auto& w = r->warnings;
  auto has = [&](const std::string& s) {
    for (const auto& x : w) {
      if (x.find(s) != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  BOOST_TEST(w.size() == 5u);
  BOOST_TEST(has("/architectures/1: `SCMP_ARCH_X86` ignored"));
  BOOST_TEST(has("/architectures/2: `SCMP_ARCH_AARCH64` ignored"));
  BOOST_TEST(has("/syscalls/0/names/1: unknown syscall `no_such_syscall` skipped"));
  BOOST_TEST(has("/syscalls/0/names/2: `chown32` is not an x86_64 syscall"));
  BOOST_TEST(has("/syscalls/2: skipped: its action is the defaultAction"));

  auto answer = [&](int nr) { return bpf_answer(r->profile.insns, syscall_data(nr)); };
  BOOST_TEST(answer(SYS_getpid) == kRetAllow);
  BOOST_TEST(answer(SYS_mount) == kEperm);
  BOOST_TEST(answer(SYS_uname) == kEnosys);
  BOOST_TEST(answer(1000) == kEnosys);
}

BOOST_AUTO_TEST_CASE(refuses_unconditional_and_conditional_rules_for_one_syscall) {
  SeccompArg masked{1, SeccompOp::kMaskedEqual, 0xffffffff, 0x5412};
  for (bool conditional_first : {false, true}) {
    SeccompProfile p;
    p.default_action = SeccompAction::kErrno;
    SeccompRule plain = rule({"read", "ioctl"}, SeccompAction::kAllow);
    SeccompRule cond = rule({"ioctl"}, SeccompAction::kErrno, 13, {masked});
    p.syscalls = conditional_first ? std::vector{cond, plain} : std::vector{plain, cond};
    auto r = compile_filters(p, {});
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().code() == ErrorCode::kInvalid));
    BOOST_TEST(r.error().message().find("`ioctl`") != std::string::npos, r.error().message());
    BOOST_TEST(r.error().message().find("/syscalls/0") != std::string::npos, r.error().message());
    BOOST_TEST(r.error().message().find("/syscalls/1") != std::string::npos, r.error().message());
  }
}

// Found by the seccomp fuzzer: libseccomp masks the datum, so {mask 0xff, datum 0x100}
// (never true) compiled to "(arg & 0xff) == 0" and the rule matched.
BOOST_AUTO_TEST_CASE(refuses_a_masked_comparison_with_bits_outside_its_mask) {
  SeccompProfile p;
  p.default_action = SeccompAction::kErrno;
  p.syscalls = {
      rule({"prctl"}, SeccompAction::kAllow, 1, {{1, SeccompOp::kMaskedEqual, 0xff, 0x100}})};
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST((r.error().code() == ErrorCode::kInvalid));
  BOOST_TEST(r.error().message().find("/syscalls/0/args/0/valueTwo: 0x100 has bits outside the "
                                      "mask 0xff") != std::string::npos,
             r.error().message());
  // Inside the mask it compiles, and answers as written.
  p.syscalls[0].args[0].value_two = 0x10;
  auto ok = compile_filters(p, {});
  BOOST_REQUIRE_MESSAGE(ok.has_value(), error_text(ok));
  BOOST_TEST(bpf_answer(ok->profile.insns, syscall_data(SYS_prctl, {0, 0x310})) == kRetAllow);
  BOOST_TEST(bpf_answer(ok->profile.insns, syscall_data(SYS_prctl, {0, 0x300})) != kRetAllow);
}

// Found by the seccomp fuzzer: with two conditional rules for fchmodat, {a1 < 0x574f4c4c415f5443
// -> KILL_THREAD} and {a1 < 0x55ffffffffffff -> ERRNO}, libseccomp 2.5.4's BPF allowed
// a1 = 0x55ffffffffffff (high words equal, low word fails: it jumps to the default).
BOOST_AUTO_TEST_CASE(refuses_less_than_among_several_conditional_rules_for_one_syscall) {
  SeccompProfile p;
  p.default_action = SeccompAction::kAllow;
  p.syscalls = {
      rule({"fchmodat"}, SeccompAction::kKillThread, 1,
           {{1, SeccompOp::kLessThan, 0x574f4c4c415f5443ULL, 0}}),
      rule({"fchmodat"}, SeccompAction::kErrno, 5,
           {{1, SeccompOp::kLessThan, 0x55ffffffffffffULL, 0}}),
  };
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("/syscalls/1: `fchmodat` has another conditional rule at "
                                      "/syscalls/0") != std::string::npos,
             r.error().message());
  // One LT rule alone compiles and answers as written on both sides of the boundary.
  p.syscalls.pop_back();
  auto one = compile_filters(p, {});
  BOOST_REQUIRE_MESSAGE(one.has_value(), error_text(one));
  BOOST_TEST(bpf_answer(one->profile.insns, syscall_data(SYS_fchmodat, {0, 0x55ffffffffffffULL})) ==
             SECCOMP_RET_KILL_THREAD);
  BOOST_TEST(bpf_answer(one->profile.insns,
                        syscall_data(SYS_fchmodat, {0, 0x574f4c4c415f5443ULL})) == kRetAllow);
}

// Found by the seccomp fuzzer (a later run): libseccomp 2.5.4 compiled these three rules so
// that a0 = 4, a3 = 0x5e5e5e5fa1a1a1aa (no rule matches) got LOG instead of the default.
BOOST_AUTO_TEST_CASE(refuses_not_equal_among_several_conditional_rules_for_one_syscall) {
  SeccompProfile p;
  p.default_action = SeccompAction::kKillThread;
  p.syscalls = {
      rule({"process_vm_readv"}, SeccompAction::kLog, 1,
           {{3, SeccompOp::kEqual, 0x5e5e5e5fa1a1a1a1ULL, 0}, {0, SeccompOp::kNotEqual, 8, 0}}),
      rule({"process_vm_readv"}, SeccompAction::kLog, 1, {{0, SeccompOp::kNotEqual, 4, 0}}),
      rule({"process_vm_readv"}, SeccompAction::kLog, 1, {{3, SeccompOp::kEqual, 4, 0}}),
  };
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("/syscalls/1: `process_vm_readv` has another conditional "
                                      "rule at /syscalls/0") != std::string::npos,
             r.error().message());
  BOOST_TEST(r.error().message().find("LT/LE/NE") != std::string::npos, r.error().message());
  // One NE rule alone compiles and answers as written on both sides.
  p.syscalls = {p.syscalls[1]};
  auto one = compile_filters(p, {});
  BOOST_REQUIRE_MESSAGE(one.has_value(), error_text(one));
  BOOST_TEST(bpf_answer(one->profile.insns, syscall_data(SYS_process_vm_readv, {5})) ==
             SECCOMP_RET_LOG);
  BOOST_TEST(bpf_answer(one->profile.insns, syscall_data(SYS_process_vm_readv, {4})) ==
             SECCOMP_RET_KILL_THREAD);
}

BOOST_AUTO_TEST_CASE(refuses_two_actions_for_one_syscall) {
  SeccompProfile p;
  p.syscalls = {rule({"read"}, SeccompAction::kAllow), rule({"read"}, SeccompAction::kErrno, 13)};
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message() ==
             "seccomp profile: /syscalls/1: `read` already has a rule with another action at "
             "/syscalls/0");
}

BOOST_AUTO_TEST_CASE(refuses_two_comparisons_of_one_argument) {
  SeccompProfile p;
  p.syscalls = {rule({"socket"}, SeccompAction::kAllow, 1,
                     {{0, SeccompOp::kGreaterEqual, 3, 0}, {0, SeccompOp::kLessEqual, 9, 0}})};
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("/syscalls/0/args/1/index: argument 0 compared twice") !=
                 std::string::npos,
             r.error().message());
}

BOOST_AUTO_TEST_CASE(conditional_profile_rules_reach_the_program) {
  SeccompProfile p;
  p.default_action = SeccompAction::kAllow;
  p.syscalls = {rule({"kill"}, SeccompAction::kErrno, 1, {{1, SeccompOp::kEqual, 9, 0}})};
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(r.has_value());
  BOOST_TEST(bpf_answer(r->profile.insns, syscall_data(SYS_kill, {1, 9})) == kEperm);
  BOOST_TEST(bpf_answer(r->profile.insns, syscall_data(SYS_kill, {1, 15})) == kRetAllow);
}

BOOST_AUTO_TEST_CASE(refuses_errno_above_max_errno) {
  SeccompProfile p;
  p.default_errno_ret = 70000;
  auto r = compile_filters(p, {});
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message() == "seccomp profile: /defaultErrnoRet: 70000 is above 4095");
}

BOOST_AUTO_TEST_CASE(allow_ptrace_option_turns_ptrace_rules_into_allow) {
  SeccompProfile p;
  p.default_action = SeccompAction::kErrno;
  p.default_errno_ret = 38;
  p.syscalls = {rule({"ptrace", "process_vm_readv", "process_vm_writev", "getpid"},
                     SeccompAction::kErrno, 1)};
  auto denied = compile_filters(p, {});
  auto allowed = compile_filters(p, SeccompOptions{.allow_ptrace = true});
  BOOST_REQUIRE(denied.has_value());
  BOOST_REQUIRE(allowed.has_value());
  for (int nr : {SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev}) {
    BOOST_TEST(bpf_answer(denied->profile.insns, syscall_data(nr)) == kEperm);
    BOOST_TEST(bpf_answer(allowed->profile.insns, syscall_data(nr)) == kRetAllow);
  }
  // Only the ptrace family changes.
  BOOST_TEST(bpf_answer(allowed->profile.insns, syscall_data(SYS_getpid)) == kEperm);
}

BOOST_AUTO_TEST_CASE(init_filter_allows_its_list_and_kills_the_rest) {
  auto init = compile_init_filter();
  BOOST_REQUIRE(init.has_value());
  for (int nr : {SYS_read, SYS_write, SYS_close, SYS_wait4, SYS_waitid, SYS_kill, SYS_rt_sigaction,
                 SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigtimedwait, SYS_restart_syscall,
                 SYS_exit, SYS_exit_group, SYS_munmap}) {
    BOOST_TEST(bpf_answer(init->insns, syscall_data(nr)) == kRetAllow, nr);
  }
  for (int nr :
       {SYS_getpid, SYS_openat, SYS_execve, SYS_ptrace, SYS_mmap, SYS_mprotect, SYS_mremap, 1000}) {
    BOOST_TEST(bpf_answer(init->insns, syscall_data(nr)) == kRetKillProcess, nr);
  }
  auto pfc = init_pfc();
  BOOST_REQUIRE(pfc.has_value());
  for (const std::string& name : init_allowed_syscalls()) {
    BOOST_TEST(pfc_block(*pfc, name).find("action ALLOW") != std::string::npos, name);
  }
  BOOST_TEST(pfc->find("# default action\n  action KILL_PROCESS") != std::string::npos);
}

// A parked init loads its command's two filters before its job only when both allow every
// call it (and the command, before its exec) makes from there on (seccomp.cpp,
// preload_calls): a profile that refuses one of them is loaded by the command instead.
BOOST_AUTO_TEST_CASE(a_parked_init_preloads_only_filters_that_allow_every_call_it_makes) {
  auto preloads = [](const SeccompProfile& p) {
    auto r = compile_filters(p, {});
    BOOST_REQUIRE_MESSAGE(r.has_value(), error_text(r));
    BOOST_TEST(r->init_may_preload == init_may_preload(r->profile, r->fixed));
    return r->init_may_preload;
  };
  SeccompProfile allow_all;
  allow_all.default_action = SeccompAction::kAllow;
  BOOST_TEST(preloads(allow_all));  // and so the fixed filter allows them all: no openat2

  const std::vector<std::string> names = preload_syscall_names();
  for (const char* needed :
       {"wait4", "recvmsg", "clone", "execveat", "landlock_add_rule", "landlock_restrict_self",
        "seccomp", "kill", "rt_sigreturn", "fchdir", "openat", "exit_group", "futex"}) {
    BOOST_TEST((std::find(names.begin(), names.end(), needed) != names.end()), needed);
  }
  BOOST_TEST((std::find(names.begin(), names.end(), "openat2") == names.end()));

  SeccompProfile exactly;
  exactly.default_action = SeccompAction::kErrno;
  exactly.default_errno_ret = 38;
  exactly.syscalls = {rule(names, SeccompAction::kAllow)};
  BOOST_TEST(preloads(exactly));

  for (const std::string& left_out : {std::string("wait4"), std::string("landlock_restrict_self"),
                                      std::string("rt_sigreturn"), std::string("futex")}) {
    BOOST_TEST_CONTEXT(left_out) {
      SeccompProfile p = exactly;
      std::erase(p.syscalls[0].names, left_out);
      BOOST_TEST(!preloads(p));
    }
  }
  // An argument condition counts too: a profile that refuses init's clone flags, or the
  // start's futex on a private word.
  SeccompProfile no_shared_mm = allow_all;
  no_shared_mm.syscalls = {rule({"clone"}, SeccompAction::kErrno, 1,
                                {SeccompArg{0, SeccompOp::kMaskedEqual, CLONE_VM, CLONE_VM}})};
  BOOST_TEST(!preloads(no_shared_mm));
  SeccompProfile no_private_futex = allow_all;
  no_private_futex.syscalls = {
      rule({"futex"}, SeccompAction::kErrno, 1,
           {SeccompArg{1, SeccompOp::kMaskedEqual, FUTEX_PRIVATE_FLAG, FUTEX_PRIVATE_FLAG}})};
  BOOST_TEST(!preloads(no_private_futex));
}
