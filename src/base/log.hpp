#pragma once
// The process's named stderr loggers (spdlog underneath). Only log.cpp includes spdlog: its
// header-only build cost ~18 s of compile time in each file that did (two did; sanitized
// build), for six calls. Messages are formatted here with fmt and handed over whole.

#include <fmt/format.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace cordon::log {

enum class Level { kInfo, kWarn, kError };

class Logger {
 public:
  virtual ~Logger() = default;
  template <class... Args>
  void info(fmt::format_string<Args...> f, Args&&... args) {
    write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
  }
  template <class... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) {
    write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
  }
  template <class... Args>
  void error(fmt::format_string<Args...> f, Args&&... args) {
    write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
  }
  virtual void write(Level level, std::string_view message) = 0;
};

/// The process's one stderr logger called `name`, made on first use by any thread (spdlog
/// throws when a second logger takes a name: two daemon connections that made it at once
/// ended the daemon). It also becomes the default logger, so nothing logs to stdout.
[[nodiscard]] std::shared_ptr<Logger> stderr_logger(const std::string& name);

/// Turns every logger off, those made later too (the fuzz harnesses: their inputs make the
/// engine warn on nearly every call).
void silence_all();

}  // namespace cordon::log
