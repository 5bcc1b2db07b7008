#pragma once

// The data the clone3 child applies, and the recipe that applies it. Everything here is
// prepared by the parent (sandbox/prepare.cpp): the child reads it from its copy of the
// parent's memory and runs only raw syscalls — no allocation, no locks, no exceptions, no
// logging — then execs the sandbox init.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "sandbox/spec.hpp"

namespace cordon::sandbox {

struct TreeMount {
  int fd;            // detached tree from open_tree(OPEN_TREE_CLONE), flags already set
  const char* path;  // where it goes, relative to the new root ("usr", "home/u/proj")
  bool is_file;      // a single file: the mount point is an empty file, not a directory
  // A --ro path inside the working root, bound onto itself: the mount point must be the very
  // file the tree was cloned from (a job renaming directories above it in a loop could make
  // the path lead elsewhere between the two lookups; a review, session 40). ESTALE if not.
  bool onto_itself = false;
};

struct SymlinkEntry {
  const char* target;
  const char* path;
};

struct GeneratedFile {
  const char* path;  // relative to the new root, over an existing file ("etc/passwd")
  const char* data;
  size_t size;
};

struct SysctlEntry {
  const char* path;  // "proc/sys/user/max_user_namespaces"
  const char* value;
};

struct LandlockPathRule {
  const char* path;  // absolute inside the sandbox
  uint64_t access;
};

struct ChildPlan {
  // Every descriptor the recipe uses, ascending; the child closes all others first thing, so
  // it never holds the supervisor's ends (EOF on the go byte must reach it when the parent
  // dies) nor a lock the parent holds (a record or a uid lease).
  const int* keep_fds = nullptr;
  size_t n_keep_fds = 0;
  int status_fd = -1;             // SOCK_SEQPACKET to the supervisor
  bool unshare_cgroupns = false;  // hybrid hosts: unshare after the v1 placement
  // Hybrid hosts: the `tasks` file of each v1 job cgroup, opened by the (root) parent. The
  // child moves itself in as its first step by writing "0" (itself, one thread) to each: a
  // thread that moves itself skips cgroup_threadgroup_rwsem, whose writer waits for an RCU
  // grace period (≈ 11 ms at one spawn per 20 ms) when the parent writes the child's pid to
  // cgroup.procs. The permission check uses the opener's credentials.
  const int* v1_tasks_fds = nullptr;
  size_t n_v1_tasks_fds = 0;

  const TreeMount* system_trees = nullptr;  // usr, lib, etc (all read-only)
  size_t n_system_trees = 0;
  const SymlinkEntry* symlinks = nullptr;  // merged-usr links (bin -> usr/bin) and /dev links
  size_t n_symlinks = 0;
  const GeneratedFile* generated = nullptr;  // passwd, group, hostname, hosts
  size_t n_generated = 0;
  const char* const* mask_files = nullptr;  // secrets under /etc: an empty read-only file
  size_t n_mask_files = 0;
  const char* const* mask_dirs = nullptr;  // an empty read-only directory
  size_t n_mask_dirs = 0;
  const char* const* dev_nodes = nullptr;  // "null", "zero", ... bound from the host /dev
  size_t n_dev_nodes = 0;
  const char* const* proc_read_only = nullptr;  // "proc/sys", "proc/sysrq-trigger", ...
  size_t n_proc_read_only = 0;
  const SysctlEntry* sysctls = nullptr;
  size_t n_sysctls = 0;
  // Settings of the sandbox's own network namespace (with loopback_up only: never the host's).
  const SysctlEntry* net_sysctls = nullptr;
  size_t n_net_sysctls = 0;
  // "size=...,mode=0755": the root tmpfs, whose tmp and dev/shm directories are /tmp and
  // /dev/shm (mount_tmp); sized for them plus the root's own few files.
  const char* root_options = nullptr;
  const TreeMount* user_trees = nullptr;  // working root and --ro paths, parents first
  size_t n_user_trees = 0;

  // Absolute inside the sandbox, already resolved by the parent. nullptr for a parked sandbox
  // (warm pool), whose init enters its job's cwd; its stdio and exec fd are -1 as well.
  const char* cwd = nullptr;
  dev_t cwd_dev = 0;
  ino_t cwd_ino = 0;

  bool loopback_up = false;
  const char* hostname = nullptr;
  const Rlimit* rlimits = nullptr;
  size_t n_rlimits = 0;
  bool tty = false;
  uint16_t tty_cols = 120, tty_rows = 30;

  int landlock_abi = 0;
  uint64_t landlock_handled = 0;
  uint64_t landlock_scoped = 0;
  const LandlockPathRule* landlock_rules = nullptr;
  size_t n_landlock_rules = 0;

  uid_t uid = 1000;
  gid_t gid = 1000;
  int cap_last_cap = 40;

  int plan_fd = -1;  // memfd read by init
  int exec_fd = -1;  // O_PATH of the command's executable, -1 when exec'd by path
  int init_fd = -1;  // O_PATH of the cordon-init binary
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;  // -1 with tty
  uint32_t disabled_walls = 0;
};

/// The clone3 child's entry point: applies `plan` and execs init; never returns.
[[noreturn]] void child_main(const ChildPlan& plan);

}  // namespace cordon::sandbox
