#pragma once

// Reading fields of JSON that cordon did not just build itself: records on disk (meta.json,
// which a full disk, an editor or an older version may have left different) and replies from
// a peer (a daemon on the other end of --connect). nlohmann's `value(key, fallback)` throws
// type_error when the key is there with another type, and `value` on a non-object throws too;
// cordon has no exceptions, so such data must never reach it. These never throw: a missing
// field, a field of another type and a non-object all give the fallback.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/utf8.hpp"

namespace cordon::json_fields {

inline const nlohmann::json* find(const nlohmann::json& o, std::string_view key) {
  if (!o.is_object()) {
    return nullptr;
  }
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

inline std::string str(const nlohmann::json& o, std::string_view key,
                       const std::string& fallback = "") {
  const nlohmann::json* v = find(o, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : fallback;
}

/// A non-negative integer; a negative or fractional number is not one.
inline uint64_t u64(const nlohmann::json& o, std::string_view key, uint64_t fallback = 0) {
  const nlohmann::json* v = find(o, key);
  return v != nullptr && v->is_number_unsigned() ? v->get<uint64_t>() : fallback;
}

inline bool boolean(const nlohmann::json& o, std::string_view key, bool fallback = false) {
  const nlohmann::json* v = find(o, key);
  return v != nullptr && v->is_boolean() ? v->get<bool>() : fallback;
}

/// The member if it is an object, else an empty object (a static one: no allocation).
inline const nlohmann::json& object(const nlohmann::json& o, std::string_view key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json* v = find(o, key);
  return v != nullptr && v->is_object() ? *v : kEmpty;
}

/// The member if it is an array, else an empty array.
inline const nlohmann::json& array(const nlohmann::json& o, std::string_view key) {
  static const nlohmann::json kEmpty = nlohmann::json::array();
  const nlohmann::json* v = find(o, key);
  return v != nullptr && v->is_array() ? *v : kEmpty;
}

/// JSON text of `j` that never throws. nlohmann's dump() throws type_error on a string that is
/// not UTF-8, and strings from outside reach cordon's JSON: a C++ caller's argv or cwd, a path
/// a symlink resolved to, an error that names one. Each invalid byte becomes U+FFFD in the
/// text (the command's own output is never JSON-encoded here: it stays bytes in its log).
inline std::string dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Where `j` holds a string or an object key that is not UTF-8, which JSON cannot carry
/// (dump() would send U+FFFD in its place): the field's path and the first bad byte, e.g.
/// "`argv[1]` (byte 0xe9 at offset 3)"; nullopt when all of it is text.
inline std::optional<std::string> first_non_utf8(const nlohmann::json& j,
                                                 const std::string& path = "") {
  auto where = [](const std::string& at, const std::string& s, size_t off) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(s[off]));
    return "`" + at + "` (byte " + byte + " at offset " + std::to_string(off) + ")";
  };
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (auto off = first_invalid_utf8(s)) {
      return where(path, s, *off);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      if (auto bad = first_non_utf8(j[i], path + "[" + std::to_string(i) + "]")) {
        return bad;
      }
    }
  } else if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      std::string at = path.empty() ? key : path + "." + key;
      if (auto off = first_invalid_utf8(key)) {
        return where(at + " (a key)", key, *off);
      }
      if (auto bad = first_non_utf8(value, at)) {
        return bad;
      }
    }
  }
  return std::nullopt;
}

}  // namespace cordon::json_fields
