// Concurrency: N (default 1000) sandboxed `sleep` jobs running at once through one engine
// (the approach of tests/integration/engine_scale_test.cpp): time until every start()
// returned and until every sandbox's `sleep` runs, the engine's and the spawner's RSS, the
// kernel memory per job (growth of Slab + KernelStack + PageTables + Percpu in /proc/meminfo
// divided by N: namespaces, cgroups, pipes, pidfds included), and the time to kill them all.
//
//   build/scale_bench [--jobs N] [--json FILE]
//
// /proc/meminfo is machine-wide: other work on the machine moves it too, so the per-job
// figure is only as quiet as the machine was. The engine holds ~13 fds per job here (hybrid
// cgroups), so N is bounded by RLIMIT_NOFILE / 13.

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cordon/engine.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "scale_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string self_dir() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin(self, static_cast<size_t>(n > 0 ? n : 0));
  return bin.substr(0, bin.rfind('/'));
}

// Slab + KernelStack + PageTables + Percpu, KiB.
long kernel_kib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long value = 0, sum = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "Slab:" || key == "KernelStack:" || key == "PageTables:" || key == "Percpu:") {
      sum += value;
    }
  }
  return sum;
}

std::string proc_field(const std::string& pid, const std::string& file, const std::string& key) {
  std::ifstream in("/proc/" + pid + "/" + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  }
  return {};
}

// Processes named `comm` (any name if empty) whose real uid is in [base, base + count).
size_t count_sandboxed(const std::string& comm, uint32_t base, uint32_t count) {
  size_t n = 0;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return 0;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string pid = e->d_name;
    std::string name = proc_field(pid, "status", "Name:\t");
    if (!comm.empty() && name != comm) continue;
    std::istringstream uids(proc_field(pid, "status", "Uid:"));
    uint64_t uid = 0;
    if (uids >> uid && uid >= base && uid < base + count) ++n;
  }
  ::closedir(d);
  return n;
}

// VmRSS (KiB) of our child named `comm` (the spawner), -1 if none.
long child_rss_kib(const std::string& comm) {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return -1;
  long rss = -1;
  std::string me = std::to_string(::getpid());
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string pid = e->d_name;
    if (proc_field(pid, "status", "PPid:\t") != me) continue;
    if (proc_field(pid, "status", "Name:\t") != comm) continue;
    rss = std::atol(proc_field(pid, "status", "VmRSS:").c_str());
  }
  ::closedir(d);
  return rss;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned jobs = 1000;
  std::string json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--jobs" && i + 1 < argc) {
      jobs = static_cast<unsigned>(std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: scale_bench [--jobs N] [--json FILE]\n");
      return 2;
    }
  }
  if (jobs < 1 || jobs > 1016) die("--jobs must be 1..1016 (the policy's perSession bound)");
  struct rlimit nofile {};
  ::getrlimit(RLIMIT_NOFILE, &nofile);

  char tmpl[] = "/var/tmp/cordon-scale.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) die("mkdtemp failed");
  std::string work = tmpl, dir = self_dir();
  std::string root = work + "/root";
  std::filesystem::create_directories(root);
  std::ofstream(work + "/policy.json")
      << "{\"allowedExecutables\": [\"/bin/sleep\", \"/usr/bin/sleep\"], \"cwdRoot\": \"" << root
      << "\", \"concurrency\": {\"perSession\": " << jobs + 8 << ", \"total\": " << jobs + 8
      << "}}";
  cordon::EngineOptions eo;
  eo.state_dir = work + "/state";
  eo.policy_path = work + "/policy.json";
  eo.spawner_path = dir + "/cordon-spawner";
  eo.init_path = dir + "/cordon-init";
  eo.default_seccomp_profile = dir + "/seccomp/default.json";
  // A block of host uids of its own, so counting the sandboxes never sees anyone else's.
  eo.host_id_base = 0x7A000000u + static_cast<uint32_t>(::getpid() % 64) * 4096u;
  eo.host_id_count = jobs + 16;
  auto opened = cordon::Engine::open(eo);
  if (!opened) die("engine: " + opened.error().message());
  auto& engine = **opened;
  {  // warm-up: seccomp compile, page cache
    auto s = engine.start("warm", {.argv = {"/bin/sleep", "0"}});
    if (!s) die("start: " + s.error().message());
    (void)engine.status("warm", s->task_id, std::chrono::seconds(30));
  }

  long rss_before = std::atol(proc_field("self", "status", "VmRSS:").c_str());
  long kern_before = kernel_kib();
  std::vector<std::string> ids;
  auto t0 = Clock::now();
  for (unsigned i = 0; i < jobs; ++i) {
    auto s = engine.start("s", {.argv = {"/bin/sleep", "1000"}});
    if (!s || s->state != "running") {
      die("job " + std::to_string(i) + ": " +
          (s ? s->state + " " + s->error : s.error().message()));
    }
    ids.push_back(s->task_id);
  }
  double started_ms = ms_since(t0);
  size_t running = 0;
  while ((running = count_sandboxed("sleep", eo.host_id_base, eo.host_id_count)) < jobs) {
    if (ms_since(t0) > 60000) die("only " + std::to_string(running) + " sleeps run after 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  double all_running_ms = ms_since(t0);
  long kern_after = kernel_kib();
  long rss_after = std::atol(proc_field("self", "status", "VmRSS:").c_str());
  long spawner_rss = child_rss_kib("cordon-spawner");
  size_t fds = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++fds;

  auto t1 = Clock::now();
  for (const auto& id : ids) {
    auto k = engine.kill("s", id, SIGKILL);
    if (!k) die("kill: " + k.error().message());
  }
  double kill_calls_ms = ms_since(t1);
  size_t left = 0;
  while ((left = count_sandboxed("", eo.host_id_base, eo.host_id_count)) > 0) {
    if (ms_since(t1) > 120000) die(std::to_string(left) + " sandboxed processes left after 120 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  double gone_ms = ms_since(t1);
  auto w = engine.wait("s", ids, std::chrono::seconds(300), true);
  double kill_ms = ms_since(t1);
  if (!w) die("wait: " + w.error().message());
  for (const auto& st : *w) {
    if (st.state != "killed") die(st.task_id + " ended " + st.state);
  }
  long kern_end = kernel_kib();
  double per_job_kib = static_cast<double>(kern_after - kern_before) / jobs;

  std::printf("%u concurrent sandboxed `sleep 1000` jobs through one engine (own netns each)\n",
              jobs);
  std::printf("  all start() calls returned           %9.0f ms\n", started_ms);
  std::printf("  all %u sleeps running                %9.0f ms\n", jobs, all_running_ms);
  std::printf("  engine RSS                           %9.1f MiB (before the jobs %.1f MiB)\n",
              rss_after / 1024.0, rss_before / 1024.0);
  std::printf("  spawner RSS                          %9.1f MiB\n", spawner_rss / 1024.0);
  std::printf("  engine fds                           %9zu (RLIMIT_NOFILE %llu)\n", fds,
              static_cast<unsigned long long>(nofile.rlim_cur));
  std::printf(
      "  kernel memory per job                %9.0f KiB (Slab+KernelStack+PageTables+"
      "Percpu grew %ld MiB; %ld MiB back after the kill)\n",
      per_job_kib, (kern_after - kern_before) / 1024, (kern_after - kern_end) / 1024);
  std::printf("  kill all: kill() returned for all       %9.0f ms\n", kill_calls_ms);
  std::printf("  kill all: no sandboxed process left     %9.0f ms\n", gone_ms);
  std::printf("  kill all: every job settled             %9.0f ms\n", kill_ms);
  if (!json_out.empty()) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"jobs\": %u, \"allStartedMs\": %.1f, \"allRunningMs\": %.1f, "
                  "\"engineRssKiB\": %ld, \"spawnerRssKiB\": %ld, \"engineFds\": %zu, "
                  "\"kernelKiBPerJob\": %.1f, \"killCallsMs\": %.1f, \"killAllGoneMs\": %.1f, "
                  "\"killAllSettledMs\": %.1f}\n",
                  jobs, started_ms, all_running_ms, rss_after, spawner_rss, fds, per_job_kib,
                  kill_calls_ms, gone_ms, kill_ms);
    std::ofstream(json_out) << buf;
  }
  opened->reset();
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  return 0;
}
