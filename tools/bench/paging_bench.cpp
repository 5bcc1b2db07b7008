// Times paging a 1 GiB log: the last page by chars and by lines, cold (a fresh index built
// by the request: what an engine does after a restart, since the checkpoint index lives in
// memory only), cold with the log also dropped from the page cache (POSIX_FADV_DONTNEED after
// an fsync), and warm (the same index again).
//   paging_bench [--dir DIR] [--mib N] [--json FILE]     (old form: paging_bench [dir] [MiB])
// Writes <dir>/paging_bench.log (default /var/tmp, 1024 MiB) and removes it at the end.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/strings.hpp"
#include "base/unique_fd.hpp"
#include "engine/paging.hpp"

namespace {

using cordon::engine::LogIndex;
using cordon::engine::Page;
using cordon::engine::Unit;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::map<std::string, double> g_ms;  // label -> the slowest of its runs, for --json

bool timed_last_page(int fd, uint64_t size, LogIndex& index, Unit unit, const std::string& label) {
  auto t0 = std::chrono::steady_clock::now();
  uint64_t read_before = index.bytes_read();
  // The total first (it extends the index), then the page that ends the log.
  auto probe = cordon::engine::read_page(fd, size, true, index, {0, 1, unit});
  if (!probe) {
    std::fprintf(stderr, "%s: %s\n", label.c_str(), probe.error().message().c_str());
    return false;
  }
  uint64_t limit = unit == Unit::kChars ? 50000 : 500;
  uint64_t offset = probe->total > limit ? probe->total - limit : 0;
  auto page = cordon::engine::read_page(fd, size, true, index, {offset, limit, unit});
  if (!page) {
    std::fprintf(stderr, "%s: %s\n", label.c_str(), page.error().message().c_str());
    return false;
  }
  double ms = ms_since(t0);
  g_ms[label] = std::max(g_ms[label], ms);
  std::printf("%-24s %10.3f ms  total %llu  page %zu bytes  read %llu bytes  checkpoints %zu\n",
              label.c_str(), ms, static_cast<unsigned long long>(page->total), page->content.size(),
              static_cast<unsigned long long>(index.bytes_read() - read_before),
              index.checkpoints().size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp", json_out;
  uint64_t mib = 1024;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--mib" && i + 1 < argc) {
      positional.resize(2, "");
      positional[1] = argv[++i];
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (a.rfind("--", 0) != 0) {
      positional.push_back(a);
    } else {
      positional = {"", "", "", ""};  // force the usage message
    }
  }
  if (positional.size() > 2) {
    std::fprintf(stderr, "usage: paging_bench [--dir DIR] [--mib N] [--json FILE]\n");
    return 2;
  }
  if (!positional.empty() && !positional[0].empty()) {
    dir = positional[0];
  }
  if (positional.size() == 2) {
    auto parsed = cordon::parse_uint(positional[1]);
    if (!parsed || *parsed == 0) {
      std::fprintf(stderr, "usage: paging_bench [--dir DIR] [--mib N] [--json FILE]\n");
      return 2;
    }
    mib = *parsed;
  }
  std::string path = dir + "/paging_bench.log";
  cordon::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) {
    std::perror(("open " + path).c_str());
    return 1;
  }
  // Log-like text: mostly ASCII lines with some multibyte chars and an occasional bad byte.
  std::string block;
  for (int i = 0; block.size() < (1u << 20); ++i) {
    block += "[" + std::to_string(i) + "] compiling unit \xE2\x86\x92 ok \xF0\x9F\x9A\x80";
    block += i % 97 == 0 ? "\xFF\n" : " some more build output to look like a real log\n";
  }
  block.resize(1u << 20);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t size = 0;
  for (uint64_t i = 0; i < mib; ++i) {
    ssize_t n = ::pwrite(fd.get(), block.data(), block.size(), static_cast<off_t>(size));
    if (n != static_cast<ssize_t>(block.size())) {
      std::perror("pwrite");
      ::unlink(path.c_str());
      return 1;
    }
    size += block.size();
  }
  std::printf("wrote %llu MiB in %.0f ms\n", static_cast<unsigned long long>(mib), ms_since(t0));

  if (::fsync(fd.get()) != 0) {
    std::perror("fsync");
  }

  bool ok = true;
  for (Unit unit : {Unit::kChars, Unit::kLines}) {
    std::string name = unit == Unit::kChars ? "chars" : "lines";
    {  // the index and the page cache both cold: a restart after the log left memory
      (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
      LogIndex index;
      ok = ok && timed_last_page(fd.get(), size, index, unit, name + " cold, disk cold");
    }
    LogIndex index;
    ok = ok && timed_last_page(fd.get(), size, index, unit, name + " cold");
    for (int i = 0; i < 3; ++i) {  // warm: the index exists, only the last interval is read
      ok = ok && timed_last_page(fd.get(), size, index, unit, name + " warm");
    }
  }
  ::unlink(path.c_str());
  if (!json_out.empty()) {
    std::string json = "{\"mib\": " + std::to_string(mib);
    for (const auto& [label, ms] : g_ms) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ", \"%s\": %.3f", label.c_str(), ms);
      json += buf;
    }
    std::ofstream(json_out) << json << "}\n";
  }
  return ok ? 0 : 1;
}
