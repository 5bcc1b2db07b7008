#pragma once
// The idmap user namespace's only process when it shares its caller's memory: see
// idmap_child.cpp (built without sanitizers or coverage, like the clone3 child's recipe).

namespace cordon::sandbox {

#if defined(__x86_64__)
struct IdmapChildArgs {
  long parent;  // the caller's pid (a child whose parent is gone already exits at once)
};

/// clone()'s function for a child with CLONE_VM | CLONE_FILES and every signal blocked: waits
/// for its SIGKILL, or dies with the caller. Returns never.
int idmap_child(void* arg);
#endif

}  // namespace cordon::sandbox
