#pragma once

// The plan memfd the sandbox init reads at kFdPlan: a header, then NUL-separated strings
// (argv, envp, exec path) and the BPF programs. Written by the parent (prepare.cpp), read by
// init (init.cpp), which maps it before confining itself.

#include <linux/filter.h>

#include <cstddef>
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
  // Warm pool: a park plan (no strings; programs only with kPlanPreloadFilters). Init says kParked
  // on kFdStatus and waits there for its job: one ParkedJob datagram whose descriptors replace its
  // plan, its stdio and its exec fd; it then runs the job's plan exactly as an unparked init would.
  kPlanParked = 1u << 7,
  // With kPlanParked: the park plan carries the command's profile and fixed filters, and init
  // loads them (after no_new_privs) before it says kParked, so the command inherits them
  // instead of loading them on the job's path. Init then refuses a job whose plan has other
  // programs, and does every later step under them (seccomp.cpp, preload_calls). Never with a
  // tty or a wall switched off (the test-walls build).
  kPlanPreloadFilters = 1u << 8,
};

inline constexpr uint32_t kParkedJobMagic = 0x314a5043;  // "CPJ1"
inline constexpr uint32_t kParkedJobHasExec = 1u << 0;   // a fifth descriptor: kFdExec
inline constexpr size_t kParkedJobFds = 5;

/// The job a parked init receives on kFdStatus, with SCM_RIGHTS in this order: the job's
/// sealed plan memfd, stdin (read end), stdout and stderr (write ends), and the pinned
/// executable's O_PATH fd when kParkedJobHasExec. Sent by the spawner only (the other end of
/// the status channel is its own until the job is handed to the engine).
struct ParkedJob {
  uint32_t magic;
  uint32_t flags;
  uint64_t cwd_dev;  // the cwd as the spawner resolved it beneath the working root
  uint64_t cwd_ino;
  // Landlock rights for the pinned executable (its own rule: it is reached through the
  // host's mount, outside every tree the parked ruleset covers); 0 without one.
  uint64_t exec_access;
  char cwd[4096];  // absolute inside the sandbox, NUL-terminated
};

// The most instructions init's own filter may have: init copies it into its argv/envp pointer
// array (1024 slots of 8 bytes, free once the command has exec'd) so it can unmap the plan
// before loading it. prepare_plan_file refuses a larger one.
inline constexpr uint32_t kMaxInitFilterInsns = 1024;

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
