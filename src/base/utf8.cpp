#include "base/utf8.hpp"

namespace cordon {

std::optional<size_t> first_invalid_utf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    size_t len = utf8_unit_length(p + i, n - i, /*final=*/true);
    if (utf8_unit_invalid(p + i, len)) {
      return i;
    }
    i += len;
  }
  return std::nullopt;
}

void append_utf8_sanitized(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t n = bytes.size();
  out.reserve(out.size() + n);
  size_t run = 0;  // start of the pending run of valid bytes, copied in one append
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t len = utf8_unit_length(p + i, n - i, /*final=*/true);
    if (utf8_unit_invalid(p + i, len)) {
      out.append(bytes.substr(run, i - run));
      out.append(kReplacementUtf8);
      run = i + 1;
    }
    i += len;
  }
  out.append(bytes.substr(run, n - run));
}

}  // namespace cordon
