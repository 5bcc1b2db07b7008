#pragma once

// A classic-BPF evaluator for seccomp programs: what an exported program answers for a given
// syscall, without loading it. The spawner asks it whether a parked init may load a command's
// filters ahead of its job (seccomp.cpp, init_may_preload); unit tests ask it what a profile
// answers. It implements the instructions libseccomp emits and fails (returns nullopt) on
// anything else, so a new opcode can neither pass a test nor allow a preload by accident.

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <vector>

namespace cordon::sandbox {

inline seccomp_data syscall_data(int nr, std::initializer_list<uint64_t> args = {},
                                 uint32_t arch = AUDIT_ARCH_X86_64) {
  seccomp_data d{};
  d.nr = nr;
  d.arch = arch;
  size_t i = 0;
  for (uint64_t a : args) {
    d.args[i++] = a;
  }
  return d;
}

inline std::optional<uint32_t> bpf_eval(const std::vector<sock_filter>& prog,
                                        const seccomp_data& data) {
  unsigned char bytes[sizeof(seccomp_data)];
  std::memcpy(bytes, &data, sizeof data);
  uint32_t a = 0;
  uint32_t x = 0;
  uint32_t mem[BPF_MEMWORDS] = {};
  for (size_t pc = 0; pc < prog.size(); ++pc) {
    const sock_filter& f = prog[pc];
    switch (f.code) {
      case BPF_LD | BPF_W | BPF_ABS:
        if (f.k % 4 != 0 || f.k > sizeof bytes - 4) {  // no wrap of f.k + 4
          return std::nullopt;
        }
        std::memcpy(&a, bytes + f.k, 4);
        break;
      case BPF_LD | BPF_MEM:
        if (f.k >= BPF_MEMWORDS) {
          return std::nullopt;
        }
        a = mem[f.k];
        break;
      case BPF_LDX | BPF_MEM:
        if (f.k >= BPF_MEMWORDS) {
          return std::nullopt;
        }
        x = mem[f.k];
        break;
      case BPF_ST:
        if (f.k >= BPF_MEMWORDS) {
          return std::nullopt;
        }
        mem[f.k] = a;
        break;
      case BPF_STX:
        if (f.k >= BPF_MEMWORDS) {
          return std::nullopt;
        }
        mem[f.k] = x;
        break;
      case BPF_ALU | BPF_AND | BPF_K:
        a &= f.k;
        break;
      case BPF_ALU | BPF_OR | BPF_K:
        a |= f.k;
        break;
      case BPF_MISC | BPF_TAX:
        x = a;
        break;
      case BPF_MISC | BPF_TXA:
        a = x;
        break;
      case BPF_JMP | BPF_JA:
        pc += f.k;
        break;
      case BPF_JMP | BPF_JEQ | BPF_K:
        pc += (a == f.k) ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JGT | BPF_K:
        pc += (a > f.k) ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JGE | BPF_K:
        pc += (a >= f.k) ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JSET | BPF_K:
        pc += (a & f.k) ? f.jt : f.jf;
        break;
      case BPF_RET | BPF_K:
        return f.k;
      case BPF_RET | BPF_A:
        return a;
      default:
        return std::nullopt;
    }
  }
  return std::nullopt;  // fell off the end: the kernel would reject the program
}

}  // namespace cordon::sandbox
