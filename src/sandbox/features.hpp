#pragma once

// Kernel and host features the sandbox depends on, each probed for real (a syscall tried,
// not a version compared), with the guarantee it provides. `cordon doctor` prints these.

#include <string>
#include <vector>

namespace cordon::sandbox {

struct FeatureCheck {
  std::string name;
  bool ok = false;
  bool required = true;   // a run refuses without it
  std::string detail;     // what was found ("ABI 7", "EPERM from clone3")
  std::string guarantee;  // what it provides
};

/// Probes every feature; `state_dir` is used for the idmapped-mount probe's scratch dir.
std::vector<FeatureCheck> probe_features(const std::string& state_dir);

}  // namespace cordon::sandbox
