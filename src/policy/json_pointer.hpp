#pragma once

// Shared by the JSON parsers of this layer (policy, seccomp profile): errors name the JSON
// pointer (RFC 6901) of the offending field.

#include <string>
#include <string_view>
#include <utility>

#include "base/error.hpp"

namespace cordon::policy {

/// `base` + "/" + `key`, with "~" and "/" in the key escaped as "~0" and "~1".
inline std::string json_pointer_key(const std::string& base, const std::string& key) {
  std::string out = base + "/";
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

/// "<what>: <pointer>: <message>", the root pointer spelled "/".
template <class... Args>
std::unexpected<Error> json_error(std::string_view what, const std::string& pointer,
                                  fmt::format_string<Args...> f, Args&&... args) {
  return invalid("{}: {}: {}", what, pointer.empty() ? "/" : pointer,
                 fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace cordon::policy
