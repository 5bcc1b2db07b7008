#pragma once

// The plan memfd the sandbox init reads at kFdPlan: a header, then NUL-separated strings
// (argv, envp, exec path) and the BPF programs. Written by the parent (prepare.cpp), read by
// init (init.cpp), which maps it before confining itself.

#include <linux/filter.h>

#include <cstdint>

namespace cordon::sandbox {

inline constexpr uint32_t kPlanMagic = 0x31445243;  // "CRD1"

enum PlanFlags : uint32_t {
  kPlanTty = 1u << 0,
  kPlanExecByPath = 1u << 1,       // exec `exec_path` inside the sandbox instead of kFdExec
  kPlanNoProfileFilter = 1u << 2,  // test-walls controls only
  kPlanNoFixedFilter = 1u << 3,
  kPlanNoLandlock = 1u << 4,
  kPlanNoNoNewPrivs = 1u << 5,
  kPlanKeepDumpable = 1u << 6,
};

struct PlanHeader {
  uint32_t magic;
  uint32_t total_size;
  uint32_t flags;
  uint32_t argc;
  uint32_t envc;
  uint32_t strings_off;  // argv[0..argc), envp[0..envc), exec_path — each NUL-terminated
  uint32_t strings_len;
  uint32_t profile_off;  // struct sock_filter[profile_count]
  uint32_t profile_count;
  uint32_t fixed_off;
  uint32_t fixed_count;
  uint32_t init_off;
  uint32_t init_count;
};

}  // namespace cordon::sandbox
