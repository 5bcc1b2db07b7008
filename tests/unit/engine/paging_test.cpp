#define BOOST_TEST_MODULE engine_paging
#include "engine/paging.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/base64.hpp"
#include "base/sha256.hpp"
#include "base/unique_fd.hpp"

using namespace cordon;
using namespace cordon::engine;

namespace {

// An anonymous log file on /tmp that a test appends to, like a running job's stdout.
class TempLog {
 public:
  TempLog() : fd_(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) {
    BOOST_REQUIRE_MESSAGE(fd_.valid(), "open O_TMPFILE /tmp: errno " << errno);
  }
  void append(std::string_view bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::pwrite(fd_.get(), bytes.data() + done, bytes.size() - done,
                           static_cast<off_t>(data_.size() + done));
      BOOST_REQUIRE_MESSAGE(n > 0, "pwrite: errno " << errno);
      done += static_cast<size_t>(n);
    }
    data_.append(bytes);
  }
  int fd() const { return fd_.get(); }
  uint64_t size() const { return data_.size(); }
  const std::string& data() const { return data_; }

 private:
  UniqueFd fd_;
  std::string data_;
};

// ---- Reference model: decodes the whole file by code-point arithmetic (a different method
// from the table in base/utf8.hpp) and derives chars and lines from the unit list.

struct RefUnit {
  uint64_t begin;
  uint64_t len;
  bool valid;
};

const std::string kFffd = "\xEF\xBF\xBD";

bool cont(uint8_t b) { return b >= 0x80 && b <= 0xBF; }

// Length of a complete valid sequence at s[i], or 0 if invalid (never "pending").
size_t ref_valid_len(const std::string& s, size_t i) {
  auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    return 1;
  }
  size_t n = b0 >= 0xC0 && b0 <= 0xDF   ? 2
             : b0 >= 0xE0 && b0 <= 0xEF ? 3
             : b0 >= 0xF0 && b0 <= 0xF7 ? 4
                                        : 0;
  if (n == 0 || i + n > s.size()) {
    return 0;
  }
  uint32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) {
    auto b = static_cast<uint8_t>(s[i + k]);
    if (!cont(b)) {
      return 0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
    return 0;
  }
  return n;
}

// True when s[i..] is a proper prefix of some valid sequence (only the second byte is
// constrained beyond "continuation", so trying every second byte is exhaustive).
bool ref_can_complete(const std::string& s, size_t i) {
  std::string prefix = s.substr(i);
  if (prefix.size() >= 4) {
    return false;
  }
  for (int second = 0x80; second <= 0xBF; ++second) {
    std::string t = prefix;
    if (t.size() == 1) {
      t.push_back(static_cast<char>(second));
    }
    while (t.size() < 4) {
      t.push_back('\x80');
      for (size_t n = prefix.size() + 1; n <= t.size(); ++n) {
        std::string cand = t.substr(0, n);
        if (ref_valid_len(cand, 0) == n) {
          return true;
        }
      }
    }
  }
  return false;
}

struct RefModel {
  std::vector<RefUnit> units;
  std::vector<std::pair<uint64_t, uint64_t>> lines;  // [first unit, end unit)
};

RefModel ref_model(const std::string& s, bool complete) {
  RefModel m;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = ref_valid_len(s, i);
    if (n == 0 && !complete && ref_can_complete(s, i)) {
      break;  // pending: a running log's unfinished last char
    }
    m.units.push_back({i, n == 0 ? 1 : n, n != 0});
    i += n == 0 ? 1 : n;
  }
  uint64_t first = 0;
  uint64_t line_bytes = 0;
  for (uint64_t u = 0; u < m.units.size(); ++u) {
    const RefUnit& unit = m.units[u];
    if (s[unit.begin] == '\n') {
      m.lines.push_back({first, u + 1});
      first = u + 1;
      line_bytes = 0;
      continue;
    }
    if (line_bytes + unit.len > kMaxLineBytes) {
      m.lines.push_back({first, u});
      first = u;
      line_bytes = 0;
    }
    line_bytes += unit.len;
  }
  if (complete && first < m.units.size()) {
    m.lines.push_back({first, m.units.size()});
  }
  return m;
}

std::string ref_text(const std::string& s, const RefModel& m, uint64_t from, uint64_t to) {
  std::string out;
  for (uint64_t u = from; u < to; ++u) {
    if (m.units[u].valid) {
      out.append(s, m.units[u].begin, m.units[u].len);  // no temporary: lines here reach 1 MiB
    } else {
      out += kFffd;
    }
  }
  return out;
}

struct RefPage {
  std::string content;
  uint64_t total;
  uint64_t next;
};

RefPage ref_page(const std::string& s, const RefModel& m, Unit unit, uint64_t offset,
                 uint64_t limit) {
  if (unit == Unit::kChars) {
    uint64_t total = m.units.size();
    if (offset >= total) {
      return {"", total, offset};
    }
    uint64_t end = std::min(total, offset + limit);
    return {ref_text(s, m, offset, end), total, end};
  }
  uint64_t total = m.lines.size();
  if (offset >= total) {
    return {"", total, offset};
  }
  uint64_t end = offset;
  uint64_t bytes = 0;
  while (end < total && end < offset + limit) {
    auto [a, b] = m.lines[end];
    uint64_t len = a == b ? 0 : m.units[b - 1].begin + m.units[b - 1].len - m.units[a].begin;
    if (end > offset && bytes + len > kMaxLinesPageBytes) {
      break;
    }
    bytes += len;
    ++end;
  }
  return {ref_text(s, m, m.lines[offset].first, m.lines[end - 1].second), total, end};
}

Page page_of(const TempLog& log, bool complete, LogIndex& index, Unit unit, uint64_t offset,
             uint64_t limit) {
  auto page = read_page(log.fd(), log.size(), complete, index, {offset, limit, unit});
  if (!page) {
    BOOST_FAIL(page.error().message());  // Boost formats a _MESSAGE even on success
  }
  return std::move(*page);
}

// Checks one page against the model; returns false (after reporting) on a mismatch.
bool matches(const TempLog& log, const RefModel& m, bool complete, LogIndex& index, Unit unit,
             uint64_t offset, uint64_t limit) {
  Page got = page_of(log, complete, index, unit, offset, limit);
  RefPage want = ref_page(log.data(), m, unit, offset, limit);
  bool ok = got.content == want.content && got.total == want.total &&
            got.next_offset == want.next && got.has_more == (want.next < want.total) &&
            got.offset == offset;
  if (!ok) {
    BOOST_ERROR("unit " << static_cast<int>(unit) << " offset " << offset << " limit " << limit
                        << " complete " << complete << ": total " << got.total << " vs "
                        << want.total << ", next " << got.next_offset << " vs " << want.next
                        << ", content size " << got.content.size() << " vs "
                        << want.content.size());
  }
  return ok;
}

// Random log text: ASCII, newlines, CRLF, valid multibyte chars and every kind of bad byte.
std::string random_log(std::mt19937_64& rng, size_t approx) {
  static const std::vector<std::string> kPieces = {
      "a",
      "hello ",
      "\n",
      "\n",
      "\r\n",
      "\xC3\xA9",
      "\xE2\x82\xAC",
      "\xF0\x9F\x98\x80",
      "\xED\x9F\xBF",
      "\xEF\xBF\xBF",
      "\xF4\x8F\xBF\xBF",  // valid edges
      "\x80",
      "\xBF",
      "\xC0\xAF",
      "\xC1",
      "\xE0\x80\xAF",
      "\xED\xA0\x80",
      "\xF4\x90\x80\x80",
      "\xF5",
      "\xFF",
      "\xE2\x82",
      "\xF0\x9F\x98",
      "\xC3",
      "\xE2",
      "\xF0",  // invalid/truncated
  };
  std::string s;
  while (s.size() < approx) {
    s += kPieces[rng() % kPieces.size()];
    if (rng() % 4 == 0) {
      s.append(rng() % 40, static_cast<char>('a' + rng() % 26));
    }
  }
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(byte_pages_concatenate_to_the_file) {
  std::mt19937_64 rng(1);
  TempLog log;
  std::string data(300001, '\0');
  for (char& c : data) {
    c = static_cast<char>(rng());
  }
  log.append(data);
  LogIndex index;
  for (uint64_t limit : std::initializer_list<uint64_t>{1ULL, 7ULL, 4093ULL, 65537ULL, 200000ULL}) {
    std::string joined;
    std::string b64;
    uint64_t offset = 0;
    for (;;) {
      Page p = page_of(log, true, index, Unit::kBytes, offset, limit);
      BOOST_REQUIRE_EQUAL(p.total, data.size());
      joined += p.content;
      b64 = base64_encode(p.content);
      BOOST_TEST(b64.size() == (p.content.size() + 2) / 3 * 4);
      offset = p.next_offset;
      if (!p.has_more) {
        break;
      }
    }
    BOOST_TEST((joined == data), "limit " << limit);
  }
}

BOOST_AUTO_TEST_CASE(refuses_limits_outside_bounds) {
  TempLog log;
  log.append("abc");
  LogIndex index;
  for (Unit u : {Unit::kBytes, Unit::kChars, Unit::kLines}) {
    for (uint64_t limit : std::initializer_list<uint64_t>{0ULL, kMaxPageLimit + 1}) {
      auto p = read_page(log.fd(), log.size(), true, index, {0, limit, u});
      BOOST_REQUIRE(!p.has_value());
      BOOST_TEST(static_cast<int>(p.error().code()) == static_cast<int>(ErrorCode::kRefused));
    }
    BOOST_TEST(read_page(log.fd(), log.size(), true, index, {0, kMaxPageLimit, u}).has_value());
  }
  BOOST_TEST(PageRequest{}.limit == 50000u);
  BOOST_TEST((PageRequest{}.unit == Unit::kChars));
  BOOST_TEST((parse_unit("lines").value() == Unit::kLines));
  BOOST_TEST(!parse_unit("words").has_value());
}

BOOST_AUTO_TEST_CASE(offsets_past_the_end_give_empty_pages) {
  TempLog log;
  log.append("h\xC3\xA9llo\nworld\n");
  LogIndex index;
  struct Case {
    Unit unit;
    uint64_t total;
  };
  for (Case c : {Case{Unit::kBytes, 13}, Case{Unit::kChars, 12}, Case{Unit::kLines, 2}}) {
    for (uint64_t off : std::initializer_list<uint64_t>{c.total, c.total + 1, c.total + 1000000}) {
      Page p = page_of(log, true, index, c.unit, off, 10);
      BOOST_TEST(p.content.empty());
      BOOST_TEST(p.total == c.total);
      BOOST_TEST(p.next_offset == off);
      BOOST_TEST(!p.has_more);
    }
  }
}

BOOST_AUTO_TEST_CASE(chars_count_multibyte_and_replace_each_invalid_byte) {
  TempLog log;
  // é (2) € (3) 😀 (4), then an overlong, a surrogate, a stray continuation, > U+10FFFF.
  log.append("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80|\xC0\xAF|\xED\xA0\x80|\x80|\xF4\x90\x80\x80");
  LogIndex index;
  Page p = page_of(log, true, index, Unit::kChars, 0, 1000);
  const std::string r = kFffd;
  BOOST_TEST(p.content == "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80|" + r + r + "|" + r + r + r + "|" +
                              r + "|" + r + r + r + r);
  BOOST_TEST(p.total == 3u + 1 + 2 + 1 + 3 + 1 + 1 + 1 + 4);
  // A page of one char is one whole sequence, never part of one.
  BOOST_TEST(page_of(log, true, index, Unit::kChars, 1, 1).content == "\xE2\x82\xAC");
  BOOST_TEST(page_of(log, true, index, Unit::kChars, 2, 1).content == "\xF0\x9F\x98\x80");
  Page one = page_of(log, true, index, Unit::kChars, 2, 1);
  BOOST_TEST(one.byte_begin == 5u);
  BOOST_TEST(one.byte_end == 9u);
}

BOOST_AUTO_TEST_CASE(running_log_holds_back_an_incomplete_last_char) {
  TempLog log;
  log.append("ab\xE2\x82");
  LogIndex index;
  Page running = page_of(log, false, index, Unit::kChars, 0, 100);
  BOOST_TEST(running.content == "ab");
  BOOST_TEST(running.total == 2u);
  BOOST_TEST(running.next_offset == 2u);
  BOOST_TEST(!running.has_more);
  BOOST_TEST(page_of(log, false, index, Unit::kChars, 2, 100).content.empty());
  // Had the job ended here, each byte of the truncated sequence is one U+FFFD.
  Page ended = page_of(log, true, index, Unit::kChars, 0, 100);
  BOOST_TEST(ended.content == "ab" + kFffd + kFffd);
  BOOST_TEST(ended.total == 4u);
  // The writer finishes the char: the next page picks it up whole.
  log.append("\xAC!");
  Page next = page_of(log, false, index, Unit::kChars, 2, 100);
  BOOST_TEST(next.content == "\xE2\x82\xAC!");
  BOOST_TEST(next.total == 4u);
  // A prefix that can never become valid is decided at once, even while running.
  TempLog bad;
  bad.append("x\xE0\x80");
  LogIndex bad_index;
  BOOST_TEST(page_of(bad, false, bad_index, Unit::kChars, 0, 100).content == "x" + kFffd + kFffd);
}

BOOST_AUTO_TEST_CASE(lines_keep_newlines_crlf_and_empty_lines) {
  TempLog log;
  log.append("one\r\n\ntwo\nlast");
  LogIndex index;
  Page all = page_of(log, true, index, Unit::kLines, 0, 100);
  BOOST_TEST(all.content == "one\r\n\ntwo\nlast");
  BOOST_TEST(all.total == 4u);
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 1, 1).content == "\n");
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 3, 1).content == "last");
  // Running: the unterminated last line is not a line yet.
  Page running = page_of(log, false, index, Unit::kLines, 0, 100);
  BOOST_TEST(running.content == "one\r\n\ntwo\n");
  BOOST_TEST(running.total == 3u);
  BOOST_TEST(running.next_offset == 3u);
  BOOST_TEST(page_of(log, false, index, Unit::kLines, 3, 100).content.empty());
  log.append("\n");
  BOOST_TEST(page_of(log, false, index, Unit::kLines, 3, 100).content == "last\n");
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 0, 100).total == 4u);
}

BOOST_AUTO_TEST_CASE(lines_longer_than_the_cap_are_broken_before_a_char) {
  TempLog log;
  std::string s(kMaxLineBytes - 1, 'x');
  s += "\xE2\x82\xAC\n";                 // would end at cap + 2: breaks before the euro
  s += std::string(kMaxLineBytes, 'y');  // exactly the cap, then '\n': one line
  s += "\n";
  s += std::string(2 * kMaxLineBytes + 5, 'z');
  log.append(s);
  LogIndex index(4096);
  for (bool complete : {false, true}) {
    RefModel m = ref_model(s, complete);
    for (uint64_t off = 0; off < 6; ++off) {
      for (uint64_t limit : std::initializer_list<uint64_t>{1ULL, 2ULL, 100ULL}) {
        matches(log, m, complete, index, Unit::kLines, off, limit);
      }
    }
  }
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 0, 1).content ==
             std::string(kMaxLineBytes - 1, 'x'));
  Page second = page_of(log, true, index, Unit::kLines, 1, 1);
  BOOST_TEST(second.content == "\xE2\x82\xAC\n");
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 2, 1).content.size() == kMaxLineBytes + 1);
  // The 2 MiB + 5 tail: two full pieces, then 5 bytes once complete.
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 5, 1).content == "zzzzz");
  BOOST_TEST(page_of(log, true, index, Unit::kLines, 0, 100).total == 6u);
  BOOST_TEST(page_of(log, false, index, Unit::kLines, 0, 100).total == 5u);
  // A page's byte budget holds whole lines and at least one.
  Page many = page_of(log, true, index, Unit::kLines, 0, 100);
  BOOST_TEST(many.byte_end - many.byte_begin <= kMaxLinesPageBytes);
  BOOST_TEST(many.has_more);
}

BOOST_AUTO_TEST_CASE(checkpoints_inside_multibyte_sequences_land_on_char_boundaries) {
  TempLog log;
  std::string s;
  for (int i = 0; i < 1000; ++i) {
    s += i % 3 == 0 ? "\xF0\x9F\x98\x80" : i % 3 == 1 ? "\xE2\x82\xAC\n" : "\xC3\xA9";
  }
  log.append(s);
  for (uint64_t interval : std::initializer_list<uint64_t>{8ULL, 9ULL, 10ULL, 11ULL, 13ULL}) {
    LogIndex index(interval);
    BOOST_REQUIRE(index.extend(log.fd(), log.size()).has_value());
    BOOST_TEST(index.checkpoints().size() > s.size() / interval / 2);
    for (const Checkpoint& cp : index.checkpoints()) {
      // A char boundary: never a continuation byte.
      BOOST_TEST((cp.byte == s.size() || (static_cast<uint8_t>(s[cp.byte]) & 0xC0) != 0x80));
      BOOST_TEST(cp.byte % interval < 4);
    }
    RefModel m = ref_model(s, true);
    for (uint64_t off = 0; off < 700; off += 13) {
      matches(log, m, true, index, Unit::kChars, off, 5);
      matches(log, m, true, index, Unit::kLines, off / 3, 2);
    }
  }
}

BOOST_AUTO_TEST_CASE(random_logs_match_the_reference_model) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 40; ++round) {
    TempLog log;
    log.append(random_log(rng, 1 + rng() % 6000));
    uint64_t interval = 8 + rng() % 300;
    LogIndex index(interval);
    for (bool complete : {true, false}) {
      RefModel m = ref_model(log.data(), complete);
      for (Unit unit : {Unit::kChars, Unit::kLines}) {
        // Walk the whole log page by page with an odd limit, then jump around.
        uint64_t limit = 1 + rng() % 97;
        uint64_t offset = 0;
        for (int guard = 0; guard < 100000; ++guard) {
          if (!matches(log, m, complete, index, unit, offset, limit)) {
            break;
          }
          Page p = page_of(log, complete, index, unit, offset, limit);
          if (!p.has_more) {
            break;
          }
          offset = p.next_offset;
        }
        uint64_t total = unit == Unit::kChars ? m.units.size() : m.lines.size();
        for (int k = 0; k < 30; ++k) {
          matches(log, m, complete, index, unit, rng() % (total + 3), 1 + rng() % 500);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(growing_log_index_matches_a_fresh_index) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 10; ++round) {
    std::string full = random_log(rng, 20000);
    TempLog log;
    LogIndex grown(64);
    size_t at = 0;
    while (at < full.size()) {
      // Cut anywhere, including inside multibyte sequences.
      size_t n = std::min(full.size() - at, 1 + rng() % 3000);
      log.append(std::string_view(full).substr(at, n));
      at += n;
      BOOST_REQUIRE(grown.extend(log.fd(), log.size()).has_value());
      LogIndex fresh(64);
      BOOST_REQUIRE(fresh.extend(log.fd(), log.size()).has_value());
      BOOST_REQUIRE_EQUAL(grown.checkpoints().size(), fresh.checkpoints().size());
      for (size_t i = 0; i < fresh.checkpoints().size(); ++i) {
        const Checkpoint& a = grown.checkpoints()[i];
        const Checkpoint& b = fresh.checkpoints()[i];
        BOOST_TEST((a.byte == b.byte && a.chars == b.chars && a.lines == b.lines &&
                    a.line_start == b.line_start));
      }
      for (bool complete : {false, true}) {
        BOOST_TEST(grown.total_chars(complete) == fresh.total_chars(complete));
        BOOST_TEST(grown.total_lines(complete) == fresh.total_lines(complete));
        RefModel m = ref_model(log.data(), complete);
        BOOST_TEST(grown.total_chars(complete) == m.units.size());
        BOOST_TEST(grown.total_lines(complete) == m.lines.size());
        uint64_t c = m.units.empty() ? 0 : rng() % m.units.size();
        matches(log, m, complete, grown, Unit::kChars, c, 1 + rng() % 200);
        uint64_t l = m.lines.empty() ? 0 : rng() % m.lines.size();
        matches(log, m, complete, grown, Unit::kLines, l, 1 + rng() % 20);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(refuses_a_log_that_shrank) {
  TempLog log;
  log.append("hello\n");
  LogIndex index;
  BOOST_REQUIRE(index.extend(log.fd(), log.size()).has_value());
  BOOST_TEST(!index.extend(log.fd(), 3).has_value());
  // A size beyond what the file holds is a read error, not garbage.
  LogIndex other;
  BOOST_TEST(!read_page(log.fd(), 100, true, other, {0, 10, Unit::kChars}).has_value());
}

BOOST_AUTO_TEST_CASE(page_at_the_end_of_64mib_reads_a_bounded_number_of_bytes) {
  TempLog log;
  std::string block;
  while (block.size() < (1u << 20)) {
    block += "line \xE2\x82\xAC \xF0\x9F\x98\x80 some ascii text to make it longer\n";
  }
  for (int i = 0; i < 64; ++i) {
    log.append(block);
  }
  LogIndex index;
  BOOST_REQUIRE(index.extend(log.fd(), log.size()).has_value());
  BOOST_TEST(index.bytes_read() == log.size());
  BOOST_TEST(index.checkpoints().size() <= 66u);
  const uint64_t bound = kDefaultCheckpointInterval + 2 * (64u << 10) + 2 * 4 * 50000;
  for (Unit unit : {Unit::kChars, Unit::kLines}) {
    uint64_t total = unit == Unit::kChars ? index.total_chars(true) : index.total_lines(true);
    for (uint64_t offset : std::initializer_list<uint64_t>{total - 100, total / 2, total - 1}) {
      uint64_t before = index.bytes_read();
      Page p = page_of(log, true, index, unit, offset, unit == Unit::kChars ? 50000 : 500);
      uint64_t used = index.bytes_read() - before;
      BOOST_TEST(used <= bound, "offset " << offset << " read " << used);
      BOOST_TEST(!p.content.empty());
    }
  }
  // The last page's content is the file's tail, checked against the bytes themselves.
  Page last = page_of(log, true, index, Unit::kLines, index.total_lines(true) - 1, 1);
  BOOST_TEST(last.content == log.data().substr(log.data().rfind('\n', log.size() - 2) + 1));
}

namespace {

// Every checkpoint and every total of `fed` equals those of `scanned`.
void same_index(const LogIndex& fed, const LogIndex& scanned) {
  BOOST_REQUIRE_EQUAL(fed.checkpoints().size(), scanned.checkpoints().size());
  for (size_t i = 0; i < fed.checkpoints().size(); ++i) {
    const Checkpoint& a = fed.checkpoints()[i];
    const Checkpoint& b = scanned.checkpoints()[i];
    BOOST_TEST_CONTEXT("checkpoint " << i) {
      BOOST_TEST(a.byte == b.byte);
      BOOST_TEST(a.chars == b.chars);
      BOOST_TEST(a.lines == b.lines);
      BOOST_TEST(a.line_start == b.line_start);
    }
  }
  BOOST_TEST(fed.decided_bytes() == scanned.decided_bytes());
  BOOST_TEST(fed.seen_bytes() == scanned.seen_bytes());
  for (bool complete : {false, true}) {
    BOOST_TEST(fed.total_chars(complete) == scanned.total_chars(complete));
    BOOST_TEST(fed.total_lines(complete) == scanned.total_lines(complete));
  }
}

// Feeds `data` in random cuts (1 byte to a few blocks, so cuts fall inside sequences, CRLFs
// and the feed's own 4 KiB blocks) and compares with extend() over the file after each feed.
void feed_matches_extend(std::mt19937_64& rng, const std::string& data, uint64_t interval,
                         size_t max_cut) {
  TempLog log;
  LogIndex fed(interval);
  LogIndex scanned(interval);
  size_t at = 0;
  int feeds = 0;
  while (at < data.size()) {
    size_t n = std::min(data.size() - at, 1 + rng() % max_cut);
    std::string_view piece = std::string_view(data).substr(at, n);
    log.append(piece);
    BOOST_REQUIRE(fed.feed(at, piece).has_value());
    at += n;
    // Comparing after every feed is quadratic; often enough to catch a wrong pending tail.
    if (++feeds % 7 == 0 || at == data.size()) {
      BOOST_REQUIRE(scanned.extend(log.fd(), log.size()).has_value());
      same_index(fed, scanned);
    }
  }
  // And the fed index pages the file like the reference model says. The model keeps a
  // string per char: on the multi-MiB logs of long lines it alone took minutes (and more
  // under the sanitizers), so there the comparison with extend() above is the reference.
  if (data.size() > (size_t{1} << 20)) {
    return;
  }
  for (bool complete : {false, true}) {
    RefModel m = ref_model(log.data(), complete);
    BOOST_TEST(fed.total_chars(complete) == m.units.size());
    BOOST_TEST(fed.total_lines(complete) == m.lines.size());
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(feed_builds_the_checkpoints_extend_builds) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 30; ++round) {
    // Mixed logs: multibyte, invalid bytes, truncated sequences, CRLF, empty lines.
    feed_matches_extend(rng, random_log(rng, 2000 + rng() % 30000), 8 + rng() % 5000,
                        1 + rng() % 9000);
  }
  for (int round = 0; round < 10; ++round) {
    // Mostly ASCII, the feed's fast path, with a stray multibyte char or bad byte.
    std::string data;
    while (data.size() < 200000) {
      data += rng() % 3 == 0 ? "a line of plain build output\n" : "x";
      if (rng() % 500 == 0) {
        data += rng() % 2 ? "\xE2\x82\xAC" : "\xFF";
      }
    }
    feed_matches_extend(rng, data, 64 + rng() % 70000, 1 + rng() % 20000);
  }
}

BOOST_AUTO_TEST_CASE(feed_breaks_lines_longer_than_the_cap_like_extend) {
  std::mt19937_64 rng(12);
  // Lines of 1-3.5 MiB, ASCII and with multibyte chars around where the forced breaks land.
  std::string data = "short\n" + std::string(kMaxLineBytes - 1, 'a') + "\xE2\x82\xAC" +
                     std::string(kMaxLineBytes + 5, 'b') + "\n";
  data += std::string(kMaxLineBytes, 'c') + "\n" + std::string(kMaxLineBytes + 1, 'd') + "\r\n";
  for (int i = 0; i < 3; ++i) {
    data += random_log(rng, 300000);
    data += std::string(kMaxLineBytes * 1 + rng() % 1000, 'e');
    data += "\xF0\x9F\x98\x80\xC3\xA9";
  }
  for (uint64_t interval : {uint64_t{4096}, uint64_t{65536} + 3, kDefaultCheckpointInterval}) {
    feed_matches_extend(rng, data, interval, 1 + rng() % 300000);
  }
}

BOOST_AUTO_TEST_CASE(feed_skips_what_extend_indexed_and_refuses_a_gap) {
  std::mt19937_64 rng(13);
  std::string data = random_log(rng, 50000);
  TempLog log;
  log.append(std::string_view(data).substr(0, 30001));
  LogIndex index(256);
  BOOST_REQUIRE(index.extend(log.fd(), log.size()).has_value());  // a pager got there first
  // The capture loop feeds from where it wrote, overlapping what the pager indexed.
  BOOST_REQUIRE(index.feed(20000, std::string_view(data).substr(20000, 15000)).has_value());
  // A gap would make every later count wrong: refused, and nothing changes.
  LogIndex before = index;
  BOOST_TEST(!index.feed(40000, std::string_view(data).substr(40000)).has_value());
  same_index(index, before);
  BOOST_REQUIRE(index.feed(35000, std::string_view(data).substr(35000)).has_value());
  log.append(std::string_view(data).substr(30001));
  LogIndex scanned(256);
  BOOST_REQUIRE(scanned.extend(log.fd(), log.size()).has_value());
  same_index(index, scanned);
}

namespace {

// A record whose digest is right for whatever its words say: what a hostile (not merely
// corrupt) index file would look like.
std::string redigest(std::string record) {
  record.resize(record.size() - 32);
  Sha256 sha;
  sha.update(record);
  auto d = sha.finish();
  record.append(reinterpret_cast<const char*>(d.data()), d.size());
  return record;
}

void set_word(std::string& record, size_t word, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) {
    record[word * 8 + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }
}

uint64_t get_word(const std::string& record, size_t word) {
  uint64_t v = 0;
  for (size_t i = 8; i-- > 0;) {
    v = (v << 8) | static_cast<uint8_t>(record[word * 8 + i]);
  }
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_serialized_index_loads_back_identical) {
  std::mt19937_64 rng(21);
  for (int round = 0; round < 20; ++round) {
    TempLog log;
    log.append(random_log(rng, 1000 + rng() % 40000));
    if (round % 3 == 0) {
      log.append("\xF0\x9F\x98");  // a pending tail
    }
    const uint64_t interval = 8 + rng() % 4000;
    LogIndex index(interval);
    BOOST_REQUIRE(index.extend(log.fd(), log.size()).has_value());
    auto loaded = LogIndex::deserialize(index.serialize(), log.size(), interval);
    BOOST_REQUIRE_MESSAGE(loaded.has_value(), (loaded ? "" : loaded.error().message()));
    same_index(*loaded, index);
    // It pages like the index it came from.
    RefModel m = ref_model(log.data(), true);
    matches(log, m, true, *loaded, Unit::kChars, rng() % m.units.size(), 50);
    matches(log, m, true, *loaded, Unit::kLines, rng() % m.lines.size(), 5);
    // Only for the log and the interval it was made for.
    BOOST_TEST(!LogIndex::deserialize(index.serialize(), log.size() + 1, interval).has_value());
    BOOST_TEST(!LogIndex::deserialize(index.serialize(), log.size(), interval + 1).has_value());
  }
}

BOOST_AUTO_TEST_CASE(a_corrupt_or_hostile_index_record_is_refused) {
  std::mt19937_64 rng(22);
  TempLog log;
  log.append(random_log(rng, 20000));
  const uint64_t interval = 512;
  LogIndex index(interval);
  BOOST_REQUIRE(index.extend(log.fd(), log.size()).has_value());
  const std::string good = index.serialize();
  const size_t count = index.checkpoints().size();
  BOOST_REQUIRE(count > 10);
  auto refused = [&](const std::string& record) {
    return !LogIndex::deserialize(record, log.size(), interval).has_value();
  };
  BOOST_TEST(!refused(good));
  // Corrupt: every truncation, every single flipped bit (the digest catches them).
  for (size_t n = 0; n < good.size(); ++n) {
    BOOST_TEST(refused(good.substr(0, n)), "truncated to " << n);
  }
  for (size_t bit = 0; bit < good.size() * 8; bit += 7) {
    std::string r = good;
    r[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    BOOST_TEST(refused(r), "bit " << bit);
  }
  // Hostile: the digest recomputed over changed words. Words: 0 magic, 1 version,
  // 2 interval, 3 size, 4 count, then 4 per checkpoint {byte, chars, lines, line_start},
  // then the final state, the tail length and the tail.
  const size_t cp = 5;
  const size_t fin = cp + 4 * count;
  struct Edit {
    const char* what;
    size_t word;
    uint64_t value;
  };
  const std::vector<Edit> edits = {
      {"version", 1, 2},
      {"interval", 2, interval * 2},
      {"size", 3, log.size() + 1},
      {"count too big", 4, uint64_t{1} << 60},
      {"count one less", 4, count - 1},
      {"first checkpoint not at 0", cp, 1},
      {"checkpoint off its grid", cp + 4 * 3, get_word(good, cp + 4 * 3) + interval},
      {"checkpoint going back", cp + 4 * 5, get_word(good, cp + 4 * 4)},
      {"chars going back", cp + 4 * 6 + 1, get_word(good, cp + 4 * 5 + 1) - 1},
      {"more chars than bytes", cp + 4 * 6 + 1, get_word(good, cp + 4 * 6 + 1) + 4 * interval},
      {"lines going back", cp + 4 * 7 + 2, 0},
      {"more lines than bytes", cp + 4 * 7 + 2, get_word(good, cp + 4 * 7 + 2) + 4 * interval},
      {"line start past the byte", cp + 4 * 8 + 3, get_word(good, cp + 4 * 8) + 1},
      {"final state past the log", fin, log.size() + 10},
      {"final chars huge", fin + 1, ~uint64_t{0}},
      {"tail too long", fin + 4, 9},
  };
  for (const Edit& e : edits) {
    std::string r = good;
    set_word(r, e.word, e.value);
    BOOST_TEST(refused(redigest(r)), e.what);
  }
  // Checkpoints all zero after the first, with a consistent count: refused, not trusted.
  std::string zeros = good;
  for (size_t w = cp + 4; w < fin; ++w) {
    set_word(zeros, w, 0);
  }
  BOOST_TEST(refused(redigest(zeros)));
}
