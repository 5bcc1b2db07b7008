#pragma once
// The idmap user namespace's only process when it shares its caller's memory: see
// idmap_child.cpp (built without sanitizers or coverage, like the clone3 child's recipe).

namespace cordon::sandbox {

#if defined(__x86_64__)
struct IdmapChildArgs {
  int read_end;  // a pipe's: the caller closes the write end to end the child
  int parent;    // the caller's pid (a child whose parent is gone already exits at once)
};

/// clone()'s function for a child with CLONE_VM | CLONE_FILES: exits when the caller dies, or
/// at EOF (or any error) on `read_end`. Returns never.
int idmap_child(void* arg);
#endif

}  // namespace cordon::sandbox
