#pragma once
// Whether the host's /etc secrets may have changed since a sandbox was parked, asked without
// scanning them: an inotify instance watches every directory on the way to each secret, and
// each secret itself. A parked sandbox's job used to lstat every candidate secret (~20 calls,
// ~0.2 ms of the start here); now one read of the instance answers "nothing happened", and
// only an answer of "something happened" pays for that scan (PreparedSandbox::
// shape_still_holds). docs/security.md, docs/performance.md.

#include <cstdint>
#include <string>
#include <vector>

#include "base/unique_fd.hpp"

namespace cordon::sandbox {

class EtcWatch {
 public:
  /// Opens the inotify instance. Never fails: without one, every question answers "changed",
  /// which costs the scan the instance saves and nothing else.
  EtcWatch();

  /// Watches, for each of `paths` (absolute, under `base`): every existing directory from
  /// `base` down to it (a missing one's creation shows in its parent), the path itself when it
  /// exists, and the same for its target when it is a symlink into `base`. Call it *before*
  /// looking at what it watches: anything that changes afterwards is noticed. Returns a mark
  /// for unchanged_since(); 0 (never unchanged) when a watch could not be made.
  [[nodiscard]] uint64_t arm(const std::string& base, const std::vector<std::string>& paths);

  /// True when no watched entry had an event (a child created, removed, renamed, written, its
  /// attributes or link count changed; a watched directory moved or removed; the queue
  /// overflowed) since `mark` was handed out. A change made by a mount is no event: see
  /// docs/security.md for why the parked sandbox's own tree makes that harmless.
  [[nodiscard]] bool unchanged_since(uint64_t mark);

 private:
  void drain();
  bool watch(const std::string& path, uint32_t extra);
  bool watch_way(const std::string& base, const std::string& path);

  UniqueFd fd_;
  uint64_t changes_ = 1;  // bumped by each drain that read an event; marks are never 0
  bool broken_ = false;   // a read failed for another reason than an empty queue
};

}  // namespace cordon::sandbox
