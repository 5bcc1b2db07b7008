#include "base/strings.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "base/unique_fd.hpp"
#include "base/utf8.hpp"

namespace cordon {

std::optional<uint64_t> parse_uint(std::string_view text) {
  if (text.empty()) {
    return std::nullopt;
  }
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

std::optional<uint64_t> parse_size(std::string_view text) {
  if (text.empty()) {
    return std::nullopt;
  }
  uint64_t mult = 1;
  char last = text.back();
  switch (last) {
    case 'k':
    case 'K':
      mult = 1ULL << 10;
      break;
    case 'm':
    case 'M':
      mult = 1ULL << 20;
      break;
    case 'g':
    case 'G':
      mult = 1ULL << 30;
      break;
    case 't':
    case 'T':
      mult = 1ULL << 40;
      break;
    default:
      break;
  }
  if (mult != 1) {
    text.remove_suffix(1);
  }
  auto value = parse_uint(text);
  if (!value || (*value != 0 && UINT64_MAX / *value < mult)) {
    return std::nullopt;
  }
  return *value * mult;
}

std::optional<double> parse_decimal(std::string_view text) {
  if (text.empty()) {
    return std::nullopt;
  }
  size_t dot = text.find('.');
  auto whole = parse_uint(text.substr(0, dot));
  if (!whole && dot != 0) {
    return std::nullopt;
  }
  double value = whole ? static_cast<double>(*whole) : 0.0;
  if (dot != std::string_view::npos) {
    std::string_view frac = text.substr(dot + 1);
    if (frac.empty() || frac.size() > 6) {
      return std::nullopt;
    }
    auto f = parse_uint(frac);
    if (!f) {
      return std::nullopt;
    }
    value += static_cast<double>(*f) / std::pow(10.0, static_cast<double>(frac.size()));
  }
  return value;
}

std::optional<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (no effect on a regular file).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) {
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    errno = EINVAL;
    return std::nullopt;
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return std::nullopt;
    }
    if (n == 0) {
      break;
    }
    if (static_cast<size_t>(n) > max_bytes - out.size()) {
      errno = EFBIG;
      return std::nullopt;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string normalize_path(std::string_view path) {
  if (path.empty() || path[0] != '/') {
    return {};
  }
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) {
      j = path.size();
    }
    std::string_view part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) {
        parts.pop_back();
      }
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  std::string out;
  for (auto p : parts) {
    out += '/';
    out += p;
  }
  return out.empty() ? "/" : out;
}

bool path_within(std::string_view path, std::string_view dir) {
  if (dir == "/") {
    return !path.empty() && path[0] == '/';
  }
  if (path.size() < dir.size() || path.substr(0, dir.size()) != dir) {
    return false;
  }
  return path.size() == dir.size() || path[dir.size()] == '/';
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    size_t j = text.find(sep, i);
    if (j == std::string_view::npos) {
      out.emplace_back(text.substr(i));
      return out;
    }
    out.emplace_back(text.substr(i, j - i));
    i = j + 1;
  }
}

std::string escape_controls(std::string_view text, std::string_view keep) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  size_t n = text.size();
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n;) {
    uint8_t b = p[i];
    if (b < 0x80) {
      if ((b < 0x20 || b == 0x7f) && keep.find(static_cast<char>(b)) == std::string_view::npos) {
        out += fmt::format("\\x{:02x}", b);
      } else {
        out += static_cast<char>(b);
      }
      ++i;
      continue;
    }
    size_t len = utf8_unit_length(p + i, n - i, /*final=*/true);
    if (utf8_unit_invalid(p + i, len)) {
      out += fmt::format("\\x{:02x}", b);  // a lone 0x9b is CSI to an 8-bit terminal
    } else if (b == 0xc2 && p[i + 1] <= 0x9f) {
      out += fmt::format("\\u{:04x}", p[i + 1]);  // U+0080..U+009F: C1 controls
    } else if (len == 3 && b == 0xe2 &&
               ((p[i + 1] == 0x80 && p[i + 2] >= 0xaa && p[i + 2] <= 0xae) ||
                (p[i + 1] == 0x81 && p[i + 2] >= 0xa6 && p[i + 2] <= 0xa9))) {
      // U+202A..U+202E and U+2066..U+2069: the bidi embeddings, overrides and isolates, which
      // reorder what follows on screen (an argv that reads as another; "Trojan Source").
      out += fmt::format("\\u{:04x}",
                         ((p[i] & 0x0fu) << 12) | ((p[i + 1] & 0x3fu) << 6) | (p[i + 2] & 0x3fu));
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string unescape_mount_field(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' &&
        s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace cordon
