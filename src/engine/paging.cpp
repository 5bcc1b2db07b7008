#include "engine/paging.hpp"

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <span>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "base/sha256.hpp"
#include "base/utf8.hpp"

namespace cordon::engine {
namespace {

// The word-at-a-time ASCII path reads bytes in memory order; the lowest set bit is the first.
static_assert(std::endian::native == std::endian::little);

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();
// Index building reads big chunks (few syscalls over GBs); pages read small ones so a page
// at the end of a log reads little beyond its own bytes.
constexpr size_t kIndexChunk = size_t{1} << 20;
constexpr size_t kPageChunk = size_t{64} << 10;

Error internal(std::string what) { return Error(ErrorCode::kInternal, 0, std::move(what)); }

// pread exactly n bytes; a log never shrinks, so EOF before n bytes is an error.
Result<void> pread_exact(int fd, uint8_t* buf, size_t n, uint64_t offset, LogIndex& index) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd, buf + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      return sys_error("pread {} bytes at {}", n - done, offset + done);
    }
    if (got == 0) {
      return std::unexpected(Error::invalid(fmt::format(
          "log ends at {} bytes, before the {} its size says", offset + done, offset + n)));
    }
    done += static_cast<size_t>(got);
    index.count_read(static_cast<uint64_t>(got));
  }
  return {};
}

// A bounded window onto the log: view(pos) hands out buffered bytes from pos on, reading a
// fresh chunk when fewer than one whole UTF-8 sequence (4 bytes) remains buffered.
class ChunkReader {
 public:
  ChunkReader(int fd, LogIndex& index, size_t chunk) : fd_(fd), index_(index), buf_(chunk) {}

  Result<std::span<const uint8_t>> view(uint64_t pos, uint64_t end) {
    uint64_t buf_end = buf_off_ + buf_len_;
    if (pos >= buf_off_ && pos <= buf_end && (buf_end == end || buf_end - pos >= 4)) {
      return std::span<const uint8_t>(buf_.data() + (pos - buf_off_), buf_end - pos);
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf_.size(), end - pos));
    CORDON_CHECK(pread_exact(fd_, buf_.data(), n, pos, index_));
    buf_off_ = pos;
    buf_len_ = n;
    return std::span<const uint8_t>(buf_.data(), n);
  }

 private:
  int fd_;
  LogIndex& index_;
  std::vector<uint8_t> buf_;
  uint64_t buf_off_ = 0;
  uint64_t buf_len_ = 0;
};

struct Limits {
  uint64_t stop_byte = kNoLimit;  // stop at the first char boundary at or after this byte
  uint64_t max_chars = kNoLimit;  // stop when this many chars are behind
  uint64_t max_lines = kNoLimit;  // stop when this many lines have ended
};

enum class Stop { kLimit, kEnd, kNeedMore };

bool limit_hit(const Checkpoint& st, const Limits& lim) {
  return st.byte >= lim.stop_byte || st.chars >= lim.max_chars || st.lines >= lim.max_lines;
}

// The one scanner behind the index and every page: advances `st` over p[0..n) (p[0] is the
// byte at st.byte) unit by unit, applying the chars rule and the lines rule of paging.hpp.
// `final`: p ends where the input ends, so a truncated sequence is invalid bytes.
Stop scan(const uint8_t* p, size_t n, bool final, Checkpoint& st, const Limits& lim) {
  constexpr uint64_t kHigh = 0x8080808080808080ULL;
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL;
  constexpr uint64_t kNewlines = 0x0a0a0a0a0a0a0a0aULL;
  Checkpoint s = st;
  size_t i = 0;
  Stop stop;
  for (;;) {
    if (limit_hit(s, lim)) {
      stop = Stop::kLimit;
      break;
    }
    if (i == n) {
      stop = Stop::kEnd;
      break;
    }
    // Eight ASCII bytes at once, when no limit and no forced line break can fall inside them.
    if (n - i >= 8 && s.byte + 8 <= lim.stop_byte && s.chars + 8 <= lim.max_chars &&
        s.byte + 8 - s.line_start <= kMaxLineBytes) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & kHigh) == 0) {
        uint64_t t = w ^ kNewlines;
        // Exact zero-byte test (no borrow between bytes): high bit set where w has '\n'.
        uint64_t nl = ~(((t & kLow7) + kLow7) | t | kLow7);
        // One bit per newline at bits 7, 15, ...: the multiply sums them into the top byte
        // (std::popcount is a libgcc call without -mpopcnt, and dominated the profile).
        uint64_t count = nl == 0 ? 0 : ((nl >> 7) * 0x0101010101010101ULL) >> 56;
        if (s.lines + count < lim.max_lines) {
          if (count != 0) {
            s.lines += count;
            s.line_start = s.byte + static_cast<uint64_t>((63 - std::countl_zero(nl)) / 8) + 1;
          }
          i += 8;
          s.byte += 8;
          s.chars += 8;
          continue;
        }
      }
    }
    uint8_t b = p[i];
    if (b == '\n') {
      ++i;
      ++s.byte;
      ++s.chars;
      ++s.lines;
      s.line_start = s.byte;
      continue;
    }
    size_t len = b < 0x80 ? 1 : utf8_unit_length(p + i, n - i, final);
    if (len == 0) {
      stop = Stop::kNeedMore;
      break;
    }
    if (s.byte - s.line_start + len > kMaxLineBytes) {
      // Forced break before this char; decided only now that its length is known, which is
      // why a checkpoint's `lines` never includes a break at its own byte.
      ++s.lines;
      s.line_start = s.byte;
      continue;
    }
    i += len;
    s.byte += len;
    ++s.chars;
  }
  st = s;
  return stop;
}

// Runs the scanner over [st.byte, end) of the log. final_at_end: `end` is the end of input.
Result<Stop> run(ChunkReader& reader, Checkpoint& st, uint64_t end, bool final_at_end,
                 const Limits& lim) {
  for (;;) {
    CORDON_TRY(view, reader.view(st.byte, end));
    bool at_end = st.byte + view.size() == end;
    Stop stop = scan(view.data(), view.size(), final_at_end && at_end, st, lim);
    if (stop == Stop::kLimit || at_end) {
      return stop;
    }
    // kEnd or kNeedMore inside the log: the next view starts at st.byte with a fresh chunk.
  }
}

Result<std::string> read_sanitized(int fd, uint64_t begin, uint64_t end, LogIndex& index) {
  std::string raw(end - begin, '\0');
  CORDON_CHECK(pread_exact(fd, reinterpret_cast<uint8_t*>(raw.data()), raw.size(), begin, index));
  std::string out;
  append_utf8_sanitized(raw, out);
  return out;
}

}  // namespace

Result<Unit> parse_unit(std::string_view name) {
  if (name == "chars") {
    return Unit::kChars;
  }
  if (name == "bytes") {
    return Unit::kBytes;
  }
  if (name == "lines") {
    return Unit::kLines;
  }
  return invalid("unit `{}` is not one of chars, bytes, lines", name);
}

LogIndex::LogIndex(uint64_t interval) : interval_(std::max<uint64_t>(interval, 8)) {
  checkpoints_.push_back(Checkpoint{});
}

Result<void> LogIndex::extend(int fd, uint64_t file_size) {
  if (file_size < seen_bytes()) {
    return invalid("log is {} bytes, shorter than the {} already indexed", file_size, seen_bytes());
  }
  if (file_size == seen_bytes()) {
    return {};
  }
  // All or nothing: a read error half-way must not leave state_ past the old pending tail
  // while tail_len_ still counts it — feed() trusts seen_bytes() to know what it has.
  const Checkpoint saved_state = state_;
  const size_t saved_count = checkpoints_.size();
  const uint64_t saved_tail_len = tail_len_;
  auto scan = [&]() -> Result<void> {
    ChunkReader reader(fd, *this, kIndexChunk);
    for (;;) {
      Limits lim;
      lim.stop_byte = (checkpoints_.back().byte / interval_ + 1) * interval_;
      CORDON_TRY_CTX(stop, run(reader, state_, file_size, /*final_at_end=*/false, lim),
                     "index log");
      if (stop == Stop::kLimit) {
        checkpoints_.push_back(state_);
        continue;
      }
      uint64_t tail_len = file_size - state_.byte;
      if (tail_len > 0) {
        CORDON_TRY(view, reader.view(state_.byte, file_size));
        std::memcpy(tail_, view.data(), tail_len);
      }
      tail_len_ = tail_len;
      return {};
    }
  };
  auto scanned = scan();
  if (!scanned) {
    state_ = saved_state;
    checkpoints_.resize(saved_count);
    tail_len_ = saved_tail_len;
  }
  return scanned;
}

namespace {

// Newlines in p[0..n), and whether any byte has its high bit set: one pass, 16 bytes a step
// (SSE2 is part of x86-64). The fast path of feed(): most output is ASCII. Per-byte counters
// are summed every 255 steps, before they can wrap.
struct AsciiCount {
  uint64_t newlines = 0;
  bool high = false;
};

AsciiCount count_ascii(const uint8_t* p, size_t n) {
  AsciiCount out;
  size_t i = 0;
#ifdef __SSE2__
  const __m128i nl = _mm_set1_epi8('\n');
  const __m128i zero = _mm_setzero_si128();
  __m128i ors = zero;
  __m128i sums = zero;
  while (n - i >= 16) {
    __m128i acc = zero;
    size_t steps = std::min<size_t>((n - i) / 16, 255);
    for (size_t k = 0; k < steps; ++k, i += 16) {
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
      ors = _mm_or_si128(ors, v);
      acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(v, nl));  // a match is -1
    }
    sums = _mm_add_epi64(sums, _mm_sad_epu8(acc, zero));
  }
  out.newlines = static_cast<uint64_t>(_mm_cvtsi128_si64(sums)) +
                 static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(sums, sums)));
  out.high = _mm_movemask_epi8(ors) != 0;
#endif
  uint8_t rest = 0;
  for (; i < n; ++i) {
    rest |= p[i];
    out.newlines += p[i] == '\n' ? 1 : 0;
  }
  out.high = out.high || (rest & 0x80) != 0;
  return out;
}

// Units in p[i..block_end) under the decoding rule of base/utf8.hpp, runs of ASCII 16 bytes
// at a time. A sequence that starts before block_end may end past it (up to n). Returns where
// decoding stopped: at or past block_end, or earlier with `incomplete` when the input ends
// inside a sequence (a proper prefix, less than 4 bytes before n).
size_t decode_units(const uint8_t* p, size_t i, size_t block_end, size_t n, uint64_t& chars,
                    bool& incomplete) {
  while (i < block_end) {
    if (p[i] < 0x80) {
#ifdef __SSE2__
      if (block_end - i >= 16) {
        unsigned mask = static_cast<unsigned>(
            _mm_movemask_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
        size_t ascii = mask == 0 ? 16 : static_cast<size_t>(std::countr_zero(mask));
        i += ascii;
        chars += ascii;
        continue;
      }
#endif
      ++i;
      ++chars;
      continue;
    }
    size_t len = utf8_unit_length(p + i, n - i, /*final=*/false);
    if (len == 0) {
      incomplete = true;
      return i;
    }
    i += len;
    ++chars;
  }
  return i;
}

// Bytes feed() classifies at once: small enough that one stray non-ASCII byte sends little
// through the exact scanner, big enough that the per-block work is noise.
constexpr size_t kFeedBlock = size_t{4} << 10;

}  // namespace

Result<void> LogIndex::feed(uint64_t offset, std::string_view bytes) {
  const uint64_t seen = seen_bytes();
  if (offset > seen) {
    return invalid("feed at {} leaves a gap after the {} bytes indexed", offset, seen);
  }
  uint64_t skip = std::min<uint64_t>(seen - offset, bytes.size());
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + skip;
  size_t n = bytes.size() - static_cast<size_t>(skip);
  // A pending tail (a proper prefix of a sequence, at most 3 bytes) is resolved on a small
  // buffer of it and up to 4 new bytes: enough to decide its first char.
  while (tail_len_ > 0 && n > 0) {
    size_t k = std::min<size_t>(n, 4);
    uint8_t buf[8];
    std::memcpy(buf, tail_, tail_len_);
    std::memcpy(buf + tail_len_, p, k);
    const size_t len = static_cast<size_t>(tail_len_) + k;
    tail_len_ = 0;
    consume(buf, len);  // leaves what is still undecided as the tail
    p += k;
    n -= k;
  }
  if (n > 0) {
    consume(p, n);
  }
  return {};
}

void LogIndex::consume(const uint8_t* p, size_t n) {
  const uint64_t base = state_.byte;
  for (;;) {
    const size_t i = static_cast<size_t>(state_.byte - base);
    if (i == n) {
      return;
    }
    const uint64_t boundary = (checkpoints_.back().byte / interval_ + 1) * interval_;
    const size_t block =
        static_cast<size_t>(std::min<uint64_t>({n - i, kFeedBlock, boundary - state_.byte}));
    // No forced break possible (the line so far plus the block and a sequence straddling its
    // end stays within kMaxLineBytes): lines are the newlines (a `\n` is never inside a
    // multibyte sequence), and chars are every byte of an ASCII block, or the units a quick
    // decode of the block finds.
    if (state_.line_start + kMaxLineBytes >= state_.byte + block + 3) {
      AsciiCount c = count_ascii(p + i, block);
      size_t end = i + block;
      uint64_t chars = block;
      bool incomplete = false;
      if (c.high) {
        chars = 0;
        end = decode_units(p, i, i + block, n, chars, incomplete);
      }
      if (c.newlines > 0) {
        const void* last = ::memrchr(p + i, '\n', block);
        state_.line_start = base + static_cast<uint64_t>(static_cast<const uint8_t*>(last) - p) + 1;
        state_.lines += c.newlines;
      }
      state_.byte = base + end;
      state_.chars += chars;
      if (state_.byte >= boundary) {
        // As extend() does: its scan stops at the first char boundary at or after the grid.
        checkpoints_.push_back(state_);
      }
      if (incomplete) {
        // The input ends inside a sequence: keep its bytes until more arrive.
        tail_len_ = n - end;
        std::memcpy(tail_, p + end, tail_len_);
        return;
      }
      continue;
    }
    // Anything else goes through the exact scanner, one block (plus room for the sequence
    // that straddles its end) at a time.
    const size_t len = std::min<size_t>(n - i, block + 3);
    Limits lim;
    lim.stop_byte = boundary;
    Stop stop = scan(p + i, len, /*final=*/false, state_, lim);
    if (stop == Stop::kLimit) {
      checkpoints_.push_back(state_);
      continue;
    }
    if (stop == Stop::kNeedMore && i + len == n) {
      // The input ends inside a sequence: keep its bytes until more arrive.
      tail_len_ = base + n - state_.byte;
      std::memcpy(tail_, p + (state_.byte - base), tail_len_);
      return;
    }
    // kEnd, or kNeedMore before the input's end: go on from where the scanner stopped.
  }
}

// The persisted index: little-endian u64 words.
//   magic "CRDNIDX1", version, interval, log size, checkpoint count N,
//   N x {byte, chars, lines, line_start}, final state {byte, chars, lines, line_start},
//   pending tail length, pending tail (4 bytes, zero padded to 8), then the SHA-256 of all the
//   words before it. 32 bytes per checkpoint: a 1 GiB log's record is about 32 KiB.
namespace {

constexpr char kIndexMagic[8] = {'C', 'R', 'D', 'N', 'I', 'D', 'X', '1'};
constexpr uint64_t kIndexVersion = 1;
constexpr size_t kIndexHeaderWords = 5;       // magic .. count
constexpr size_t kIndexTrailerWords = 4 + 2;  // final state, tail length, tail

void put_u64(std::string& out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  out.append(b, 8);
}

uint64_t get_u64(std::string_view in, size_t word) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(in[word * 8 + static_cast<size_t>(i)]);
  }
  return v;
}

void put_checkpoint(std::string& out, const Checkpoint& c) {
  put_u64(out, c.byte);
  put_u64(out, c.chars);
  put_u64(out, c.lines);
  put_u64(out, c.line_start);
}

Checkpoint get_checkpoint(std::string_view in, size_t word) {
  return {get_u64(in, word), get_u64(in, word + 1), get_u64(in, word + 2), get_u64(in, word + 3)};
}

// `next` can follow `prev` in a log: what the scanner's rules allow between two of its states.
// Not a proof that the counts are right (that takes reading the log), but no record that
// passes can make a page read outside the log or loop: every offset stays ordered and bounded.
bool plausible_step(const Checkpoint& prev, const Checkpoint& next) {
  if (next.byte < prev.byte) {
    return false;
  }
  const uint64_t bytes = next.byte - prev.byte;
  // A char is 1 to 4 bytes; each ended line ends at its own byte (a `\n` or the char a forced
  // break comes before).
  return next.chars >= prev.chars && next.chars - prev.chars <= bytes &&
         (next.chars - prev.chars) * 4 >= bytes && next.lines >= prev.lines &&
         next.lines - prev.lines <= bytes && next.line_start <= next.byte &&
         next.byte - next.line_start <= kMaxLineBytes &&
         (next.lines == prev.lines
              ? next.line_start == prev.line_start
              : next.line_start >= prev.byte && next.line_start > prev.line_start);
}

}  // namespace

std::string LogIndex::serialize() const {
  std::string out;
  out.reserve((kIndexHeaderWords + 4 * checkpoints_.size() + kIndexTrailerWords) * 8 + 32);
  out.append(kIndexMagic, 8);
  put_u64(out, kIndexVersion);
  put_u64(out, interval_);
  put_u64(out, seen_bytes());
  put_u64(out, checkpoints_.size());
  for (const Checkpoint& c : checkpoints_) {
    put_checkpoint(out, c);
  }
  put_checkpoint(out, state_);
  put_u64(out, tail_len_);
  uint8_t tail[8] = {};
  std::memcpy(tail, tail_, sizeof tail_);
  out.append(reinterpret_cast<const char*>(tail), 8);
  Sha256 sha;
  sha.update(out.data(), out.size());
  auto digest = sha.finish();
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return out;
}

Result<LogIndex> LogIndex::deserialize(std::string_view record, uint64_t log_size,
                                       uint64_t interval) {
  auto bad = [](std::string_view why) {
    return std::unexpected(Error::invalid(fmt::format("index record {}", why)));
  };
  constexpr size_t kDigest = 32;
  if (record.size() < (kIndexHeaderWords + kIndexTrailerWords) * 8 + kDigest ||
      (record.size() - kDigest) % 8 != 0) {
    return bad("is truncated");
  }
  if (std::memcmp(record.data(), kIndexMagic, 8) != 0) {
    return bad("has no index magic");
  }
  std::string_view body = record.substr(0, record.size() - kDigest);
  Sha256 sha;
  sha.update(body.data(), body.size());
  auto digest = sha.finish();
  if (std::memcmp(digest.data(), record.data() + body.size(), kDigest) != 0) {
    return bad("does not match its digest");
  }
  if (get_u64(body, 1) != kIndexVersion) {
    return bad("has another version");
  }
  LogIndex index(interval);
  if (get_u64(body, 2) != index.interval_) {
    return bad("has another checkpoint interval");
  }
  if (get_u64(body, 3) != log_size) {
    return bad("is for a log of another size");
  }
  const uint64_t count = get_u64(body, 4);
  const size_t words = body.size() / 8;
  if (count == 0 || count > log_size / index.interval_ + 1 ||
      words != kIndexHeaderWords + 4 * count + kIndexTrailerWords) {
    return bad("has the wrong number of checkpoints");
  }
  index.checkpoints_.clear();
  index.checkpoints_.reserve(static_cast<size_t>(count));
  Checkpoint prev;
  for (size_t i = 0; i < count; ++i) {
    Checkpoint c = get_checkpoint(body, kIndexHeaderWords + 4 * i);
    if (i == 0) {
      if (c.byte != 0 || c.chars != 0 || c.lines != 0 || c.line_start != 0) {
        return bad("does not start at the log's start");
      }
    } else {
      // The first char boundary at or after the next multiple of the interval.
      const uint64_t grid = (prev.byte / index.interval_ + 1) * index.interval_;
      if (c.byte < grid || c.byte > grid + 3 || !plausible_step(prev, c)) {
        return bad(fmt::format("has an impossible checkpoint {}", i));
      }
    }
    index.checkpoints_.push_back(c);
    prev = c;
  }
  const size_t tail_word = kIndexHeaderWords + 4 * static_cast<size_t>(count);
  index.state_ = get_checkpoint(body, tail_word);
  index.tail_len_ = get_u64(body, tail_word + 4);
  const uint64_t next_grid = (prev.byte / index.interval_ + 1) * index.interval_;
  if (!plausible_step(prev, index.state_) || index.state_.byte >= next_grid ||
      index.tail_len_ > 3 || index.state_.byte + index.tail_len_ != log_size) {
    return bad("has an impossible final state");
  }
  std::memcpy(index.tail_, body.data() + (tail_word + 5) * 8, sizeof index.tail_);
  if (index.tail_len_ > 0 && utf8_unit_length(index.tail_, index.tail_len_, false) != 0) {
    return bad("has a pending tail that is not a sequence's start");
  }
  return index;
}

Checkpoint LogIndex::final_state() const {
  Checkpoint s = state_;
  scan(tail_, tail_len_, /*final=*/true, s, Limits{});
  return s;
}

uint64_t LogIndex::total_chars(bool complete) const {
  return complete ? final_state().chars : state_.chars;
}

uint64_t LogIndex::total_lines(bool complete) const {
  if (!complete) {
    return state_.lines;
  }
  Checkpoint s = final_state();
  return s.lines + (s.byte > s.line_start ? 1 : 0);
}

const Checkpoint& LogIndex::checkpoint_for_char(uint64_t c) const {
  auto it = std::upper_bound(checkpoints_.begin(), checkpoints_.end(), c,
                             [](uint64_t v, const Checkpoint& cp) { return v < cp.chars; });
  return *std::prev(it);  // checkpoints_[0].chars == 0 <= c
}

const Checkpoint& LogIndex::checkpoint_for_line(uint64_t l) const {
  auto it = std::lower_bound(checkpoints_.begin(), checkpoints_.end(), l,
                             [](const Checkpoint& cp, uint64_t v) { return cp.lines < v; });
  return it == checkpoints_.begin() ? *it : *std::prev(it);
}

Result<Page> read_page(int fd, uint64_t file_size, bool complete, LogIndex& index,
                       const PageRequest& request) {
  if (request.limit == 0 || request.limit > kMaxPageLimit) {
    return refusal("page limit {} is outside 1..{}", request.limit, kMaxPageLimit);
  }
  Page page;
  page.offset = request.offset;
  const uint64_t offset = request.offset;

  if (request.unit == Unit::kBytes) {
    page.total = file_size;
    uint64_t begin = std::min(offset, file_size);
    uint64_t end = begin + std::min(request.limit, file_size - begin);
    page.content.resize(end - begin);
    CORDON_CHECK_CTX(pread_exact(fd, reinterpret_cast<uint8_t*>(page.content.data()),
                                 page.content.size(), begin, index),
                     "read byte page at {}", offset);
    page.byte_begin = begin;
    page.byte_end = end;
    page.next_offset = offset >= file_size ? offset : end;
    page.has_more = page.next_offset < page.total;
    return page;
  }

  CORDON_CHECK(index.extend(fd, file_size));
  // Running: only decided bytes are paged; the pending tail waits. Complete: everything.
  const uint64_t data_end = complete ? file_size : index.decided_bytes();
  ChunkReader reader(fd, index, kPageChunk);
  const bool chars = request.unit == Unit::kChars;
  page.total = chars ? index.total_chars(complete) : index.total_lines(complete);
  if (offset >= page.total) {
    page.next_offset = offset;
    page.byte_begin = page.byte_end = data_end;
    return page;
  }

  Checkpoint st = chars ? index.checkpoint_for_char(offset) : index.checkpoint_for_line(offset);
  Limits seek;
  (chars ? seek.max_chars : seek.max_lines) = offset;
  CORDON_TRY_CTX(found, run(reader, st, data_end, true, seek), "seek to {} {}", offset,
                 chars ? "chars" : "lines");
  if (found != Stop::kLimit) {
    return std::unexpected(internal(
        fmt::format("offset {} below total {} not found at byte {}", offset, page.total, st.byte)));
  }
  const uint64_t begin = st.byte;
  uint64_t end;
  if (chars) {
    Limits lim;
    lim.max_chars = offset + request.limit;
    CORDON_CHECK_CTX(run(reader, st, data_end, true, lim), "read chars page at {}", offset);
    end = st.byte;
    page.next_offset = st.chars;
  } else {
    Limits lim;
    lim.max_lines = offset + request.limit;
    lim.stop_byte = begin + kMaxLinesPageBytes;
    CORDON_TRY_CTX(stop, run(reader, st, data_end, true, lim), "read lines page at {}", offset);
    if (stop == Stop::kEnd && complete && st.byte > st.line_start) {
      end = st.byte;  // the unterminated last line of a finished log
      page.next_offset = st.lines + 1;
    } else {
      end = st.line_start;  // whole lines only
      page.next_offset = st.lines;
    }
    if (page.next_offset == offset) {
      return std::unexpected(internal(fmt::format("line {} longer than a page", offset)));
    }
  }
  CORDON_TRY_CTX(content, read_sanitized(fd, begin, end, index), "read page bytes {}..{}", begin,
                 end);
  page.content = std::move(content);
  page.byte_begin = begin;
  page.byte_end = end;
  page.has_more = page.next_offset < page.total;
  return page;
}

}  // namespace cordon::engine
