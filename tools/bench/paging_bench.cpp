// Times paging a 1 GiB log: the last page by chars and by lines.
// - The bare LogIndex: cold (a fresh index built by the request: a full scan, what the engine
//   falls back to without a usable persisted index), cold with the log also dropped from the
//   page cache (POSIX_FADV_DONTNEED after an fsync), and warm (the same index again).
// - The CPU cost of LogIndex::feed (the index capture builds as it writes), per GiB, for this
//   log text and for zeros (what capture_bench's dd writes).
// - Through the engine API: a job prints the log (cat), the engine is closed and opened again
//   before each unit, and the first page after that restart is timed (the persisted index:
//   "engine restart"), also with the log and its index dropped from the page cache, and with
//   the index file removed (a scan: "engine restart, no idx"); then warm. Skipped with
//   --no-engine (it needs cordon-spawner, cordon-init and seccomp/ next to this binary).
//   paging_bench [--dir DIR] [--mib N] [--json FILE] [--no-engine]
//   (old form: paging_bench [dir] [MiB])
// Works in a temporary directory under <dir> (default /var/tmp; 1024 MiB) and removes it.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/strings.hpp"
#include "base/unique_fd.hpp"
#include "cordon/engine.hpp"
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

double thread_cpu_s() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// CPU seconds per GiB that LogIndex::feed spends on `block` fed `mib` times, 1 MiB a call
// (what the capture loop does with each buffer it wrote).
double feed_cpu_per_gib(const std::string& block, uint64_t mib, const std::string& label) {
  LogIndex index;
  double t0 = thread_cpu_s();
  for (uint64_t i = 0; i < mib; ++i) {
    if (!index.feed(i * block.size(), block)) {
      std::fprintf(stderr, "feed refused\n");
      return -1;
    }
  }
  double per_gib = (thread_cpu_s() - t0) / (static_cast<double>(mib) / 1024.0);
  std::printf("%-24s %10.3f CPU s per GiB  (checkpoints %zu)\n", label.c_str(), per_gib,
              index.checkpoints().size());
  g_ms[label + " cpu s per GiB"] = per_gib;
  return per_gib;
}

std::string self_dir() {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin(self, static_cast<size_t>(n > 0 ? n : 0));
  return bin.substr(0, bin.rfind('/'));
}

void drop_cache(const std::string& path) {
  cordon::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd) {
    (void)::fsync(fd.get());
    (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

// The last page through Engine::output: the total first (a one-unit page), then the page.
bool engine_last_page(cordon::Engine& engine, const std::string& id, Unit unit,
                      const std::string& label) {
  auto u = unit == Unit::kChars ? cordon::OutputUnit::kChars : cordon::OutputUnit::kLines;
  auto t0 = std::chrono::steady_clock::now();
  auto probe = engine.output("bench", id, {.offset = 0, .limit = 1, .unit = u});
  if (!probe) {
    std::fprintf(stderr, "%s: %s\n", label.c_str(), probe.error().message().c_str());
    return false;
  }
  uint64_t limit = unit == Unit::kChars ? 50000 : 500;
  uint64_t offset = probe->total_size > limit ? probe->total_size - limit : 0;
  auto page = engine.output("bench", id, {.offset = offset, .limit = limit, .unit = u});
  if (!page) {
    std::fprintf(stderr, "%s: %s\n", label.c_str(), page.error().message().c_str());
    return false;
  }
  double ms = ms_since(t0);
  g_ms[label] = std::max(g_ms[label], ms);
  std::printf("%-36s %10.3f ms  total %llu  page %zu bytes\n", label.c_str(), ms,
              static_cast<unsigned long long>(page->total_size), page->content.size());
  return true;
}

// The engine part: capture the log through a job, then time first pages after restarts.
bool engine_bench(const std::string& work, const std::string& root, uint64_t size) {
  std::string dir = self_dir();
  std::string state = work + "/state";
  std::ofstream(work + "/policy.json")
      << "{\"allowedExecutables\": [\"/bin/cat\", \"/usr/bin/cat\"], \"cwdRoot\": \"" << root
      << "\", \"maxOutputBytes\": " << size + (1 << 20) << "}";
  cordon::EngineOptions eo;
  eo.state_dir = state;
  eo.policy_path = work + "/policy.json";
  eo.spawner_path = dir + "/cordon-spawner";
  eo.init_path = dir + "/cordon-init";
  eo.default_seccomp_profile = dir + "/seccomp/default.json";
  std::string id;
  {
    auto engine = cordon::Engine::open(eo);
    if (!engine) {
      std::fprintf(stderr, "engine: %s\n", engine.error().message().c_str());
      return false;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto s = (*engine)->start("bench", {.argv = {"/bin/cat", "paging_bench.log"}});
    if (!s) {
      std::fprintf(stderr, "start: %s\n", s.error().message().c_str());
      return false;
    }
    id = s->task_id;
    auto st = (*engine)->status("bench", id, std::chrono::minutes(30));
    if (!st || st->state != "exited" || st->stdout_bytes != size) {
      std::fprintf(stderr, "capture job: %s %s\n", st ? st->state.c_str() : "?",
                   st ? st->error.c_str() : st.error().message().c_str());
      return false;
    }
    std::printf("captured %llu MiB through the engine in %.0f ms\n",
                static_cast<unsigned long long>(size >> 20), ms_since(t0));
  }
  const std::string log = state + "/jobs/" + id + "/stdout.log";
  const std::string idx = state + "/jobs/" + id + "/stdout.idx";
  struct stat st {};
  if (::stat(idx.c_str(), &st) != 0) {
    std::fprintf(stderr, "no %s after the job settled\n", idx.c_str());
    return false;
  }
  std::printf("persisted index: %lld bytes\n", static_cast<long long>(st.st_size));
  bool ok = true;
  for (Unit unit : {Unit::kChars, Unit::kLines}) {
    std::string name = unit == Unit::kChars ? "chars" : "lines";
    for (bool disk_cold : {true, false}) {
      if (disk_cold) {
        drop_cache(log);
        drop_cache(idx);
      }
      auto engine = cordon::Engine::open(eo);  // a restart: nothing of the log in memory
      if (!engine) {
        std::fprintf(stderr, "engine: %s\n", engine.error().message().c_str());
        return false;
      }
      ok = ok && engine_last_page(**engine, id, unit,
                                  name + " engine restart" + (disk_cold ? ", disk cold" : ""));
      if (!disk_cold) {
        for (int i = 0; i < 3; ++i) {
          ok = ok && engine_last_page(**engine, id, unit, name + " engine warm");
        }
      }
    }
  }
  // Without the index file: the first page after a restart scans, as before it existed.
  std::filesystem::copy_file(idx, idx + ".keep");
  ::unlink(idx.c_str());
  for (Unit unit : {Unit::kChars, Unit::kLines}) {
    std::string name = unit == Unit::kChars ? "chars" : "lines";
    auto engine = cordon::Engine::open(eo);
    if (!engine) {
      return false;
    }
    ok = ok && engine_last_page(**engine, id, unit, name + " engine restart, no idx");
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp", json_out;
  bool with_engine = true;
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
    } else if (a == "--no-engine") {
      with_engine = false;
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
  std::string work = dir + "/cordon-paging.XXXXXX";
  if (::mkdtemp(work.data()) == nullptr) {
    std::perror(("mkdtemp in " + dir).c_str());
    return 1;
  }
  const std::string root = work + "/root";
  std::filesystem::create_directories(root);
  std::string path = root + "/paging_bench.log";
  cordon::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
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
      std::filesystem::remove_all(work);
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
  feed_cpu_per_gib(block, mib, "feed, this log");
  feed_cpu_per_gib(std::string(block.size(), '\0'), mib, "feed, zeros");
  if (with_engine) {
    ok = engine_bench(work, root, size) && ok;
  }
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
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
