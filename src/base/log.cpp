#include "base/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <map>
#include <mutex>

namespace cordon::log {

namespace {

class SpdLogger final : public Logger {
 public:
  explicit SpdLogger(std::shared_ptr<spdlog::logger> l) : l_(std::move(l)) {}
  void write(Level level, std::string_view message) override {
    switch (level) {
      case Level::kInfo:
        l_->info("{}", message);
        break;
      case Level::kWarn:
        l_->warn("{}", message);
        break;
      case Level::kError:
        l_->error("{}", message);
        break;
    }
  }

 private:
  std::shared_ptr<spdlog::logger> l_;
};

}  // namespace

std::shared_ptr<Logger> stderr_logger(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Logger>> made;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = made.find(name); it != made.end()) {
    return it->second;
  }
  auto l = spdlog::get(name);
  if (!l) {
    l = spdlog::stderr_logger_mt(name);
  }
  spdlog::set_default_logger(l);
  auto wrapped = std::make_shared<SpdLogger>(l);
  made.emplace(name, wrapped);
  return wrapped;
}

void silence_all() { spdlog::set_level(spdlog::level::off); }

}  // namespace cordon::log
