// UTF-8 paging (src/engine/paging.cpp) against a naive reference that decodes the whole log
// with the rule of base/utf8.hpp. The log is a memfd that grows in steps (a running job) and
// then completes; the index uses small checkpoint intervals so seeks start from checkpoints.
// For random pages in every unit: content, total, next_offset, has_more and the byte range
// equal the reference; walking all pages concatenates to the whole log (bytes) or to its
// sanitized text (chars, lines).

#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "base/utf8.hpp"
#include "engine/paging.hpp"
#include "fuzz/fuzz_check.hpp"

namespace {

using cordon::fuzz::show;
namespace eng = cordon::engine;

struct Unit {
  uint64_t begin, end;
  std::string text;  // the bytes, or U+FFFD for an invalid byte
};

struct Ref {
  std::vector<Unit> chars;
  std::vector<std::pair<uint64_t, uint64_t>> lines;  // byte ranges, `\n` included
  uint64_t decided = 0;
};

Ref reference(const std::string& log, bool complete) {
  Ref r;
  const auto* p = reinterpret_cast<const uint8_t*>(log.data());
  size_t i = 0;
  uint64_t line_start = 0;
  while (i < log.size()) {
    size_t len = cordon::utf8_unit_length(p + i, log.size() - i, complete);
    if (len == 0) {
      break;
    }
    std::string text =
        (p[i] < 0x80 || len > 1) ? log.substr(i, len) : std::string(cordon::kReplacementUtf8);
    if (i + len - line_start > eng::kMaxLineBytes) {
      r.lines.push_back({line_start, i});
      line_start = i;
    }
    r.chars.push_back({i, i + len, text});
    i += len;
    if (p[i - 1] == '\n' && len == 1) {
      r.lines.push_back({line_start, i});
      line_start = i;
    }
  }
  r.decided = i;
  if (complete && line_start < i) {
    r.lines.push_back({line_start, i});
  }
  return r;
}

void check_page(const std::string& log, bool complete, const Ref& ref, eng::LogIndex& index, int fd,
                eng::Unit unit, uint64_t offset, uint64_t limit) {
  eng::PageRequest req{offset, limit, unit};
  auto page = eng::read_page(fd, log.size(), complete, index, req);
  FUZZ_CHECK(page.has_value(), "read_page(unit {}, offset {}, limit {}) failed: {}",
             static_cast<int>(unit), offset, limit, page ? "" : page.error().message());
  const char* u = unit == eng::Unit::kBytes   ? "bytes"
                  : unit == eng::Unit::kChars ? "chars"
                                              : "lines";
  uint64_t total, next, bb, be;
  std::string content;
  if (unit == eng::Unit::kBytes) {
    total = log.size();
    bb = std::min<uint64_t>(offset, total);
    be = bb + std::min<uint64_t>(limit, total - bb);
    next = offset >= total ? offset : be;
    content = log.substr(bb, be - bb);
  } else {
    uint64_t data_end = complete ? log.size() : ref.decided;
    total = unit == eng::Unit::kChars ? ref.chars.size() : ref.lines.size();
    if (offset >= total) {
      next = offset;
      bb = be = data_end;
    } else {
      next = std::min(offset + limit, total);
      if (unit == eng::Unit::kChars) {
        bb = ref.chars[offset].begin;
        be = ref.chars[next - 1].end;
      } else {
        bb = ref.lines[offset].first;
        be = ref.lines[next - 1].second;
      }
      for (const auto& c : ref.chars) {
        if (c.begin >= bb && c.end <= be) {
          content += c.text;
        }
      }
    }
  }
  FUZZ_CHECK(page->total == total, "{} total {} want {} (complete {}) log `{}`", u, page->total,
             total, complete, show(log));
  FUZZ_CHECK(page->next_offset == next, "{} offset {} limit {}: next {} want {} log `{}`", u,
             offset, limit, page->next_offset, next, show(log));
  FUZZ_CHECK(page->byte_begin == bb && page->byte_end == be,
             "{} offset {} limit {}: bytes [{}, {}) want [{}, {}) log `{}`", u, offset, limit,
             page->byte_begin, page->byte_end, bb, be, show(log));
  FUZZ_CHECK(page->content == content, "{} offset {} limit {}: content `{}` want `{}`", u, offset,
             limit, show(page->content), show(content));
  FUZZ_CHECK(page->has_more == (next < total), "{} has_more", u);
  FUZZ_CHECK(page->offset == offset, "{} offset echoed as {}", u, page->offset);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  uint64_t interval = fdp.ConsumeIntegralInRange<uint64_t>(1, 40);
  std::vector<size_t> steps(fdp.ConsumeIntegralInRange<size_t>(0, 4));
  for (auto& s : steps) {
    s = fdp.ConsumeIntegralInRange<size_t>(0, 64);
  }
  std::vector<std::tuple<int, uint64_t, uint64_t>> reads(fdp.ConsumeIntegralInRange<size_t>(1, 6));
  for (auto& [u, o, l] : reads) {
    u = fdp.ConsumeIntegralInRange<int>(0, 2);
    o = fdp.ConsumeIntegralInRange<uint64_t>(0, 80);
    l = fdp.ConsumeIntegralInRange<uint64_t>(1, 24);
  }
  std::string log = fdp.ConsumeRemainingBytesAsString();

  int fd = ::memfd_create("paging-fuzz", MFD_CLOEXEC);
  FUZZ_CHECK(fd >= 0, "memfd_create");
  FUZZ_CHECK(::write(fd, log.data(), log.size()) == static_cast<ssize_t>(log.size()), "write");
  eng::LogIndex index(interval);
  static const eng::Unit kUnits[] = {eng::Unit::kChars, eng::Unit::kBytes, eng::Unit::kLines};

  // Growing: the log as a running job leaves it after each step, then complete.
  size_t seen = 0;
  steps.push_back(log.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    bool complete = k + 1 == steps.size();
    seen = complete ? log.size() : std::min(log.size(), seen + steps[k]);
    std::string prefix = log.substr(0, seen);
    Ref ref = reference(prefix, complete);
    for (const auto& [u, o, l] : reads) {
      check_page(prefix, complete, ref, index, fd, kUnits[u], o, l);
    }
  }
  // A fresh index on the complete log, walked page by page in every unit.
  Ref ref = reference(log, true);
  std::string sanitized;
  for (const auto& c : ref.chars) {
    sanitized += c.text;
  }
  for (eng::Unit unit : kUnits) {
    eng::LogIndex fresh(interval);
    std::string all;
    uint64_t off = 0;
    for (int guard = 0; guard < 100000; ++guard) {
      auto page = eng::read_page(fd, log.size(), true, fresh, {off, 13, unit});
      FUZZ_CHECK(page.has_value(), "walk: {}", page ? "" : page.error().message());
      all += page->content;
      if (!page->has_more) {
        break;
      }
      FUZZ_CHECK(page->next_offset > off, "walk does not advance at {}", off);
      off = page->next_offset;
    }
    FUZZ_CHECK(all == (unit == eng::Unit::kBytes ? log : sanitized), "walking unit {} gives `{}`",
               static_cast<int>(unit), show(all));
  }
  ::close(fd);
  return 0;
}
