#pragma once

// Pages of a command's output log by bytes, chars or lines, fast at any offset of a multi-GB
// log that may still be growing. Pure file I/O: bounded preads, never mmap, never whole files.
//
// Units (all pure functions of the log's bytes, so an offset means the same thing on every
// call, after a restart and after an index rebuild):
// - bytes: raw bytes. Pages concatenate to the file byte for byte (base64 them for JSON).
// - chars: UTF-8 units under the rule in base/utf8.hpp: a well-formed sequence is one char,
//   every other byte is one char returned as U+FFFD. A page never ends inside a sequence.
//   Running job (complete=false): a trailing proper prefix of a valid sequence (at most 3
//   bytes) is not counted yet; it waits for the next page. complete=true: each of its bytes
//   is one U+FFFD.
// - lines: a line ends after a `\n` (CR is ordinary content, so CRLF stays as is). A line
//   whose content (without its `\n`) would exceed kMaxLineBytes is broken before the char
//   that would make it too long; the rest continues as the next line, so no line is longer
//   than kMaxLineBytes + 1 bytes and nothing is lost. Running job: an unterminated last line
//   is not counted or returned until it ends (or the job completes), so a line is never split
//   across pages. Content is the lines, `\n` included, decoded as in `chars`. A lines page
//   holds at most `limit` lines and at most kMaxLinesPageBytes log bytes (always at least
//   one line).
// Offsets at or past the end give an empty page with next_offset = offset (a poller keeps
// its place while the log grows). total and has_more describe the log as far as known now.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace cordon::engine {

enum class Unit { kChars, kBytes, kLines };

inline constexpr uint64_t kDefaultPageLimit = 50000;
inline constexpr uint64_t kMaxPageLimit = 200000;
inline constexpr uint64_t kMaxLineBytes = uint64_t{1} << 20;
// The longest line, its '\n' included: a page always holds at least one whole line. A lines
// page was 4 MiB of log: of control bytes, each escaped to 6 characters in JSON and the page
// sent twice in an MCP result, a ~50 MB reply built whole in the server (a review, session
// 32: 32 of them held by a slow reader).
inline constexpr uint64_t kMaxLinesPageBytes = kMaxLineBytes + 1;
inline constexpr uint64_t kDefaultCheckpointInterval = uint64_t{1} << 20;

struct PageRequest {
  uint64_t offset = 0;
  uint64_t limit = kDefaultPageLimit;
  Unit unit = Unit::kChars;
};

struct Page {
  std::string content;       // raw bytes for kBytes; valid UTF-8 for kChars and kLines
  uint64_t offset = 0;       // the requested offset, in the unit
  uint64_t total = 0;        // the log's size in the unit, as far as known now
  uint64_t next_offset = 0;  // offset of the first unit after this page
  bool has_more = false;     // next_offset < total
  uint64_t byte_begin = 0;   // the log bytes the page covers, [byte_begin, byte_end),
  uint64_t byte_end = 0;     // so a caller can switch units
};

/// The scanner's position: everything before `byte` is decided.
struct Checkpoint {
  uint64_t byte = 0;        // a char boundary
  uint64_t chars = 0;       // chars before `byte`
  uint64_t lines = 0;       // lines ended before `byte` (a forced break at `byte` not yet)
  uint64_t line_start = 0;  // where the line containing `byte` began
};

/// Parses "chars" / "bytes" / "lines"; an Error of kind kInvalid otherwise.
[[nodiscard]] Result<Unit> parse_unit(std::string_view name);

/// A sparse checkpoint index of one append-only log: one Checkpoint per `interval` bytes
/// (32 bytes each: a 1 GiB log costs ~1024 checkpoints, 32 KiB). Extended incrementally as
/// the log grows; a page seeks to the nearest checkpoint and scans at most one interval.
class LogIndex {
 public:
  explicit LogIndex(uint64_t interval = kDefaultCheckpointInterval);

  /// Scans [indexed, file_size) with bounded preads. Fails if the log got shorter than
  /// what was already indexed (logs are append-only; a shrunk log means a different file).
  [[nodiscard]] Result<void> extend(int fd, uint64_t file_size);

  /// Indexes bytes the caller already holds in memory (a capture loop that just wrote them):
  /// `bytes` sit at log offset `offset`. Produces exactly the checkpoints extend() would over
  /// the same file, however the log is cut into feeds. Bytes below seen_bytes() (already
  /// indexed by extend()) are skipped; a gap above it is refused and leaves the index as it
  /// was, for extend() to fill from the file.
  [[nodiscard]] Result<void> feed(uint64_t offset, std::string_view bytes);

  /// The index as a small binary record (index_file.md layout in paging.cpp): interval, log
  /// size, every checkpoint, the scanner's final state and pending tail, and a SHA-256 of all
  /// of it. For persisting the index of a settled log next to it.
  std::string serialize() const;
  /// An index from serialize()'s record, for a log of `log_size` bytes paged with `interval`.
  /// Checks everything that can be checked without reading the log (version, interval, size,
  /// digest, checkpoints monotonic and on their interval grid, counts bounded by the bytes);
  /// an Error of kind kInvalid for anything else, so the caller scans instead.
  [[nodiscard]] static Result<LogIndex> deserialize(std::string_view record, uint64_t log_size,
                                                    uint64_t interval = kDefaultCheckpointInterval);

  /// Bytes whose decoding is final: file_size minus a pending incomplete tail (<= 3 bytes).
  uint64_t decided_bytes() const { return state_.byte; }
  /// Bytes seen by extend(), pending tail included.
  uint64_t seen_bytes() const { return state_.byte + tail_len_; }
  /// Totals in chars and lines; complete=true also counts the pending tail (one U+FFFD per
  /// byte) and an unterminated last line.
  uint64_t total_chars(bool complete) const;
  uint64_t total_lines(bool complete) const;

  /// The last checkpoint with chars <= c.
  const Checkpoint& checkpoint_for_char(uint64_t c) const;
  /// The last checkpoint with lines < l (the first one for l == 0): line l starts after it.
  const Checkpoint& checkpoint_for_line(uint64_t l) const;
  const std::vector<Checkpoint>& checkpoints() const { return checkpoints_; }
  uint64_t interval() const { return interval_; }

  /// Bytes pread through this index (extend and read_page), so tests can prove a page read
  /// stays bounded without tracing syscalls.
  uint64_t bytes_read() const { return bytes_read_; }
  void count_read(uint64_t n) { bytes_read_ += n; }

 private:
  Checkpoint final_state() const;
  // feed() of bytes at seen_bytes() with no pending tail; keeps a new incomplete tail.
  void consume(const uint8_t* p, size_t n);

  uint64_t interval_;
  Checkpoint state_;
  uint8_t tail_[4] = {};
  uint64_t tail_len_ = 0;
  std::vector<Checkpoint> checkpoints_;
  uint64_t bytes_read_ = 0;
};

/// Reads one page of the log open on `fd` whose current size is `file_size`; `complete` says
/// the writer is done (the job settled). Extends `index` first for chars and lines. Refuses a
/// limit of 0 or above kMaxPageLimit; fails on a read error or a log shorter than file_size.
[[nodiscard]] Result<Page> read_page(int fd, uint64_t file_size, bool complete, LogIndex& index,
                                     const PageRequest& request);

}  // namespace cordon::engine
