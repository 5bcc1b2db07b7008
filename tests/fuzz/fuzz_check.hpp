#pragma once

// What every harness asserts with: an invariant that does not hold prints what was expected
// and aborts, which libFuzzer reports as a crash with the input that caused it.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#define FUZZ_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "%s:%d: invariant `%s` violated: %s\n", __FILE__, __LINE__, #cond, \
                   fmt::format(__VA_ARGS__).c_str());                                         \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

namespace cordon::fuzz {

/// Bytes shown safely in a message.
inline std::string show(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

}  // namespace cordon::fuzz
