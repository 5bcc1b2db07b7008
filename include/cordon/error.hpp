#pragma once

#include <cerrno>
#include <expected>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace cordon {

/// What kind of failure an Error is; callers branch on this, people read message().
enum class ErrorCode {
  kSystem,       // a syscall failed; sys_errno says how
  kInvalid,      // the caller's input is malformed
  kRefused,      // the input is well-formed but the contract forbids it
  kUnsupported,  // this kernel or host lacks a feature a guarantee needs
  kNotFound,
  kInternal,
};

/// An error as data: a code, the errno the kernel gave (0 if none) and a context chain
/// that grows on the way up ("create cgroup `/x`: mkdir: EACCES").
class Error {
 public:
  Error(ErrorCode code, int sys_errno, std::string context)
      : code_(code), sys_errno_(sys_errno), context_(std::move(context)) {}

  /// A failed syscall: `what` names the syscall (and its argument), errno is captured by caller.
  static Error sys(int err, std::string what) { return {ErrorCode::kSystem, err, std::move(what)}; }
  static Error invalid(std::string what) { return {ErrorCode::kInvalid, 0, std::move(what)}; }
  static Error refused(std::string what) { return {ErrorCode::kRefused, 0, std::move(what)}; }
  static Error unsupported(std::string what) {
    return {ErrorCode::kUnsupported, 0, std::move(what)};
  }

  template <class... Args>
  Error&& wrap(fmt::format_string<Args...> f, Args&&... args) && {
    context_ = fmt::format(f, std::forward<Args>(args)...) + ": " + context_;
    return std::move(*this);
  }
  template <class... Args>
  Error wrap(fmt::format_string<Args...> f, Args&&... args) const& {
    Error copy = *this;
    return std::move(copy).wrap(f, std::forward<Args>(args)...);
  }

  ErrorCode code() const { return code_; }
  int sys_errno() const { return sys_errno_; }
  const std::string& context() const { return context_; }
  /// "context: ENAME" for system errors, the context alone otherwise.
  std::string message() const;

 private:
  ErrorCode code_;
  int sys_errno_;
  std::string context_;
};

template <class T>
using Result = std::expected<T, Error>;

/// Captures errno right after a failed syscall: `return sys_error("mkdir `{}`", path);`
template <class... Args>
[[nodiscard]] std::unexpected<Error> sys_error(fmt::format_string<Args...> f, Args&&... args) {
  int err = errno;
  return std::unexpected(Error::sys(err, fmt::format(f, std::forward<Args>(args)...)));
}

template <class... Args>
[[nodiscard]] std::unexpected<Error> errno_error(int err, fmt::format_string<Args...> f,
                                                 Args&&... args) {
  return std::unexpected(Error::sys(err, fmt::format(f, std::forward<Args>(args)...)));
}

template <class... Args>
[[nodiscard]] std::unexpected<Error> refusal(fmt::format_string<Args...> f, Args&&... args) {
  return std::unexpected(Error::refused(fmt::format(f, std::forward<Args>(args)...)));
}

template <class... Args>
[[nodiscard]] std::unexpected<Error> invalid(fmt::format_string<Args...> f, Args&&... args) {
  return std::unexpected(Error::invalid(fmt::format(f, std::forward<Args>(args)...)));
}

template <class... Args>
[[nodiscard]] std::unexpected<Error> unsupported(fmt::format_string<Args...> f, Args&&... args) {
  return std::unexpected(Error::unsupported(fmt::format(f, std::forward<Args>(args)...)));
}

/// The symbolic name of an errno value ("EACCES"), or its number when it has none.
std::string errno_name(int err);

}  // namespace cordon

// Propagates an error with added context: CORDON_TRY(fd, open_dir(p), "open root `{}`", p);
#define CORDON_TRY_CTX(var, expr, ...)                                          \
  auto var##_result_ = (expr);                                                  \
  if (!var##_result_) {                                                         \
    return std::unexpected(std::move(var##_result_.error()).wrap(__VA_ARGS__)); \
  }                                                                             \
  auto var = std::move(*var##_result_)

#define CORDON_TRY(var, expr)                                 \
  auto var##_result_ = (expr);                                \
  if (!var##_result_) {                                       \
    return std::unexpected(std::move(var##_result_.error())); \
  }                                                           \
  auto var = std::move(*var##_result_)

// For Result<void> and results whose value is not needed.
#define CORDON_CHECK(expr)                                             \
  do {                                                                 \
    auto cordon_check_result_ = (expr);                                \
    if (!cordon_check_result_) {                                       \
      return std::unexpected(std::move(cordon_check_result_.error())); \
    }                                                                  \
  } while (0)

#define CORDON_CHECK_CTX(expr, ...)                                                      \
  do {                                                                                   \
    auto cordon_check_result_ = (expr);                                                  \
    if (!cordon_check_result_) {                                                         \
      return std::unexpected(std::move(cordon_check_result_.error()).wrap(__VA_ARGS__)); \
    }                                                                                    \
  } while (0)
