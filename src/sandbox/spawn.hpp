#pragma once

#include <sys/types.h>

#include <vector>

#include "base/error.hpp"
#include "base/unique_fd.hpp"
#include "sandbox/prepare.hpp"

namespace cordon::sandbox {

struct SpawnOptions {
  uid_t host_id = 0;              // leased host uid == gid; the user namespace is owned by it
  int cgroup_fd = -1;             // v2 job cgroup for CLONE_INTO_CGROUP, -1 for none
  bool cgroupns_at_clone = true;  // pure v2: CLONE_NEWCGROUP; hybrid: the child unshares later
  bool network_namespace = true;
  // Hybrid hosts: the v1 job cgroup directories; the child moves itself into each as its
  // first step (ChildPlan::v1_tasks_fds). Borrowed for the call.
  std::vector<int> v1_cgroup_dirs;
};

struct SpawnedSandbox {
  pid_t pid = -1;  // the init, in our pid namespace
  UniqueFd pidfd;
};

/// clone3s the sandbox from the calling (single-threaded, small) process (which moves
/// itself into `v1_cgroup_dirs`), maps its ids and releases it. The child's ends in `prepared` are
/// closed on return.
[[nodiscard]] Result<SpawnedSandbox> spawn_sandbox(PreparedSandbox& prepared,
                                                   const SpawnOptions& options);

}  // namespace cordon::sandbox
