#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cordon {

/// RFC 4648 base64 (standard alphabet, `=` padding, no line breaks). Byte pages encode
/// independently, so each page of a byte-exact transfer is its own padded string.
std::string base64_encode(std::string_view bytes);
/// The bytes of a base64_encode string; nullopt for anything else (a character outside the
/// alphabet, a length not a multiple of 4, misplaced padding, non-zero bits under the padding).
/// For peer data (a daemon's byte pages), so it accepts only the canonical form.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace cordon
