#pragma once
// Whether the host's /etc secrets may have changed since a sandbox was parked, asked without
// scanning them: an inotify instance watches every directory on the way to each secret, and
// each secret itself. A parked sandbox's job used to lstat every candidate secret (~20 calls,
// ~0.2 ms of the start here); now one read of the instance answers "nothing happened", and
// only an answer of "something happened" pays for that scan (PreparedSandbox::
// shape_still_holds). docs/security.md, docs/performance.md.
//
// The watch answers only where inotify sees every change that can move a mask: each entry on
// every way is a directory or the secret itself on a local filesystem (no network or FUSE
// filesystem, whose changes made elsewhere raise no event), and a symlink is allowed only as
// the secret's own last component, pointing in one hop to a path under the base without
// symlinks, "." or "..". Anything else hands out no mark, and the job scans as before.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/unique_fd.hpp"

namespace cordon::sandbox {

class EtcWatch {
 public:
  /// What arm() watched: each entry with the inode it resolved to then.
  struct Mark {
    uint64_t generation = 0;  // 0: no mark (never unchanged)
    struct Entry {
      std::string path;
      dev_t dev = 0;
      ino_t ino = 0;
    };
    std::vector<Entry> entries;
  };

  /// Opens the inotify instance. Never fails: without one, every question answers "changed",
  /// which costs the scan the instance saves and nothing else.
  EtcWatch();

  /// Watches, for each of `paths` (absolute, under `base`): every existing directory from
  /// `base` down to it (a missing one's creation is an event of its parent), the path itself
  /// when it exists, and the way of a symlinked secret's target. Call it *before* looking at
  /// what it watches, and confirm() after: anything that changes from here on is noticed.
  [[nodiscard]] Mark arm(const std::string& base, const std::vector<std::string>& paths);

  /// After looking (the mount tree copied, the masks taken): the mark's generation when every
  /// watched entry still resolves to the inode it was watched on, else 0. A mount placed or
  /// taken off on the way in between raises no event, and the copy may show it: no mark.
  [[nodiscard]] uint64_t confirm(const Mark& mark) const;

  /// True when no watched entry had an event (a child created, removed, renamed, written, its
  /// attributes or link count changed; a watched directory moved or removed; the queue
  /// overflowed) since `generation` was handed out. A mount made afterwards is no event, and
  /// needs none: the parked sandbox's /etc is a private copy it cannot reach.
  [[nodiscard]] bool unchanged_since(uint64_t generation);

 private:
  void drain();
  bool add(const std::string& path, bool dir, Mark& mark);
  bool watch_way(const std::string& base, const std::string& path, bool allow_link, Mark& mark);
  bool follow_link(const std::string& base, const std::string& link, Mark& mark);

  UniqueFd fd_;
  uint64_t changes_ = 1;  // bumped by each drain that read an event; generations are never 0
  bool broken_ = false;   // a read failed for another reason than an empty queue
};

}  // namespace cordon::sandbox
