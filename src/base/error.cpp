#include "base/error.hpp"

#include <cstring>

namespace cordon {

std::string errno_name(int err) {
  const char* name = strerrorname_np(err);
  if (name != nullptr) {
    return name;
  }
  return fmt::format("errno {}", err);
}

std::string Error::message() const {
  if (code_ == ErrorCode::kSystem && sys_errno_ != 0) {
    return fmt::format("{}: {}", context_, errno_name(sys_errno_));
  }
  return context_;
}

}  // namespace cordon
