#pragma once

// The BPF evaluator (src/sandbox/bpf_eval.hpp) with the test-only helpers around it.

#include "sandbox/bpf_eval.hpp"

namespace cordon::test {

using cordon::sandbox::bpf_eval;
using cordon::sandbox::syscall_data;

// What the program answers, or kEvalFailed when it cannot be evaluated (printable in tests).
inline constexpr uint32_t kEvalFailed = 0xdeadbeef;
inline uint32_t bpf_answer(const std::vector<sock_filter>& prog, const seccomp_data& data) {
  return bpf_eval(prog, data).value_or(kEvalFailed);
}

inline constexpr uint32_t ret_errno(uint32_t err) { return SECCOMP_RET_ERRNO | err; }
inline constexpr uint32_t kRetAllow = SECCOMP_RET_ALLOW;
inline constexpr uint32_t kRetKillProcess = SECCOMP_RET_KILL_PROCESS;

}  // namespace cordon::test
