#pragma once

#include <utility>

namespace cordon {

/// Runs a callable when the scope ends unless release()d.
template <class F>
class ScopeExit {
 public:
  explicit ScopeExit(F f) : f_(std::move(f)) {}
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;
  ~ScopeExit() {
    if (armed_) {
      f_();
    }
  }
  void release() { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace cordon
