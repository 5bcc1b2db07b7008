#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cordon {

/// Parses a size such as "512M", "2G", "1048576" (binary units); nullopt when malformed.
std::optional<uint64_t> parse_size(std::string_view text);
/// Parses a non-negative decimal integer that fits in uint64_t.
std::optional<uint64_t> parse_uint(std::string_view text);
/// Parses a non-negative decimal number such as "1.5"; nullopt when malformed.
std::optional<double> parse_decimal(std::string_view text);
/// The most read_small_file() reads unless told otherwise: records and kernel files are far
/// smaller.
inline constexpr size_t kSmallFileMax = 64u << 20;
/// Reads a whole regular file (procfs, sysfs and cgroup files count: their size is 0); nullopt
/// (errno set) on failure, for anything else (a FIFO, whose open would wait for a writer: EINVAL)
/// and for a file over `max_bytes` (EFBIG).
std::optional<std::string> read_small_file(const std::string& path,
                                           size_t max_bytes = kSmallFileMax);
/// Lexically normalises an absolute path: collapses "//", "." and "..". Empty when relative.
std::string normalize_path(std::string_view path);
/// True when `path` equals `dir` or lies beneath it (both normalised, absolute).
bool path_within(std::string_view path, std::string_view dir);
/// A field of /proc/self/mountinfo as written: it escapes space, tab, newline and backslash
/// as \ooo.
std::string unescape_mount_field(std::string_view field);
/// Splits on one character, keeping empty fields.
std::vector<std::string> split(std::string_view text, char sep);
/// `text` with every control character shown as an escape, for text someone else wrote (a
/// command's output, a caller's token) that goes to a terminal: C0 bytes but those in `keep`,
/// DEL and bytes that are not UTF-8 as `\xNN`, the C1 code points U+0080..U+009F and the bidi
/// embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069) as `\uNNNN`. So an ESC
/// or CSI in it cannot drive the terminal (OSC 52 writes the clipboard, OSC 0 the title), and
/// an argv cannot be made to read as another. Allocates; never fails.
std::string escape_controls(std::string_view text, std::string_view keep = "\t\n");

}  // namespace cordon
