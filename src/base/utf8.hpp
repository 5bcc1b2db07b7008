#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cordon {

// The decoding rule every offset in `chars` rests on. It must be a pure function of the bytes
// so offsets stay stable across pages, restarts and index rebuilds:
//   At position i, if the bytes starting at i form one well-formed UTF-8 sequence (Unicode
//   Table 3-7: no overlongs, no surrogates D800..DFFF, nothing above U+10FFFF, no C0/C1/F5..FF
//   leads), that sequence is one char. Otherwise the single byte at i is one char, U+FFFD,
//   and decoding resumes at i+1. So every byte of an overlong, a surrogate or a truncated
//   sequence is its own U+FFFD (stricter than WHATWG's "maximal subpart" rule, and simpler).
// A sequence is rejected at the first byte that cannot continue it, so a decision never needs
// bytes beyond the point where the sequence is already known to be bad.

inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

/// Length of the unit at p[0..avail): 1..4 for a well-formed sequence, 1 for an invalid byte
/// (p[0] >= 0x80), or 0 when p holds a proper prefix of a well-formed sequence and !final
/// (more bytes may complete it). With final, a truncated sequence is an invalid byte.
inline size_t utf8_unit_length(const uint8_t* p, size_t avail, bool final) {
  uint8_t b0 = p[0];
  if (b0 < 0x80) {
    return 1;
  }
  size_t need;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) {
      lo = 0xA0;  // below: overlong
    } else if (b0 == 0xED) {
      hi = 0x9F;  // above: surrogates
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) {
      lo = 0x90;  // below: overlong
    } else if (b0 == 0xF4) {
      hi = 0x8F;  // above: > U+10FFFF
    }
  } else {
    return 1;  // continuation byte, C0/C1 (always overlong) or F5..FF
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= avail) {
      return final ? 1 : 0;
    }
    uint8_t b = p[k];
    if (b < lo || b > hi) {
      return 1;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return need;
}

/// True when the unit of length `len` at p is an invalid byte (decoded as U+FFFD).
inline bool utf8_unit_invalid(const uint8_t* p, size_t len) { return len == 1 && p[0] >= 0x80; }

/// Offset of the first byte of `bytes` that is not part of well-formed UTF-8 (a truncated
/// tail counts), or nullopt when all of it is.
std::optional<size_t> first_invalid_utf8(std::string_view bytes);

/// Decodes `bytes` as if they were the whole input (truncated tail = one U+FFFD per byte) and
/// appends the result, every invalid byte replaced by U+FFFD, to `out`.
void append_utf8_sanitized(std::string_view bytes, std::string& out);

}  // namespace cordon
