#pragma once

// The OCI runtime-spec `linux.seccomp` object as cordon accepts it. Accepted keys:
//   top level: defaultAction, defaultErrnoRet, architectures, syscalls, flags (empty only)
//   syscalls[]: names, action, errnoRet, args, comment
//   args[]:     index, value, valueTwo, op
// Everything else is refused with the JSON pointer of the field: Docker's includes/excludes
// and archMap (conditions on capabilities and kernels that cordon does not evaluate), the
// SCMP_ACT_TRACE/SCMP_ACT_NOTIFY actions and listenerPath (no tracer or notify agent exists).

#include <string>
#include <string_view>

#include "base/error.hpp"
#include "sandbox/seccomp.hpp"

namespace cordon::policy {

/// Parses profile JSON; errors read "seccomp profile: /syscalls/3/action: unknown action ...".
[[nodiscard]] Result<sandbox::SeccompProfile> parse_seccomp_profile(std::string_view text);
/// Reads and parses a profile file; errors name the path.
[[nodiscard]] Result<sandbox::SeccompProfile> load_seccomp_profile(const std::string& path);

}  // namespace cordon::policy
