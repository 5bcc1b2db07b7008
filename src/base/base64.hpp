#pragma once

#include <string>
#include <string_view>

namespace cordon {

/// RFC 4648 base64 (standard alphabet, `=` padding, no line breaks). Byte pages encode
/// independently, so each page of a byte-exact transfer is its own padded string.
std::string base64_encode(std::string_view bytes);

}  // namespace cordon
