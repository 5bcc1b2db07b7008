// Spawn-to-exit latency of `/bin/true`, side by side in one run (these machines drift, so
// only ratios measured interleaved are meaningful): a bare fork+exec (the floor), `unshare`
// with user/mount/pid/ipc/uts/net namespaces, bubblewrap with an equivalent isolation set,
// `cordon run` with its full default sandbox, and the engine library (start → settle).
//
//   build/spawn_bench [--runs N] [--spacing-ms MS] [--json FILE] [--compare-pool] [--only TEXT]
//
// --compare-pool adds a second engine with EngineOptions::warm_pool off, interleaved like the
// rest, so the warm pool's effect is measured in the same run. --only TEXT keeps the variants
// whose name contains TEXT (and the floor): a v1 cgroup migration is cheap for a grace period
// after any other one, so variants that migrate (cordon run, the unpooled engine, the pool's
// refill) make each other look cheaper when interleaved; run them alone to see each one's cost.
//
// Each round runs every variant once, in a random order, with `spacing` between spawns (20 ms:
// how agents use it; the v1 cgroup placement costs an RCU grace period at that spacing).

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cordon/engine.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double run_argv(const std::vector<std::string>& argv) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  auto t0 = Clock::now();
  pid_t pid;
  if (posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ) != 0) {
    std::fprintf(stderr, "spawn %s failed\n", av[0]);
    std::exit(1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  posix_spawn_file_actions_destroy(&fa);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "%s exited with status %d\n", av[0], st);
    std::exit(1);
  }
  return ms;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 500;
  int spacing_ms = 20;
  std::string json_out;
  bool compare_pool = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc)
      runs = std::atoi(argv[++i]);
    else if (a == "--spacing-ms" && i + 1 < argc)
      spacing_ms = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc)
      json_out = argv[++i];
    else if (a == "--compare-pool")
      compare_pool = true;
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: spawn_bench [--runs N] [--spacing-ms MS] [--json FILE] "
                   "[--compare-pool] [--only TEXT]\n");
      return 2;
    }
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin(self, static_cast<size_t>(n > 0 ? n : 0));
  std::string dir = bin.substr(0, bin.rfind('/'));
  std::string base = std::filesystem::temp_directory_path().string();
  char tmpl[] = "/var/tmp/cordon-bench.XXXXXX";
  std::string work = mkdtemp(tmpl);
  std::string root = work + "/root", state = work + "/state", state2 = work + "/state2";
  std::filesystem::create_directories(root);
  std::ofstream(work + "/policy.json")
      << "{\"allowedExecutables\": [\"/bin/true\", \"/usr/bin/true\"], \"cwdRoot\": \"" << root
      << "\"}";

  cordon::EngineOptions eo;
  eo.state_dir = state2;
  eo.policy_path = work + "/policy.json";
  eo.spawner_path = dir + "/cordon-spawner";
  eo.init_path = dir + "/cordon-init";
  eo.default_seccomp_profile = dir + "/seccomp/default.json";
  auto engine = cordon::Engine::open(eo);
  if (!engine) {
    std::fprintf(stderr, "engine: %s\n", engine.error().message().c_str());
    return 1;
  }

  std::map<std::string, std::function<double()>> variants = {
      {"fork+exec (floor)", [] { return run_argv({"/bin/true"}); }},
      {"unshare -U -m -p -i -u -n -f",
       [] {
         return run_argv({"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "--pid",
                          "--ipc", "--uts", "--net", "--fork", "/bin/true"});
       }},
      {"bubblewrap",
       [root] {
         return run_argv({"/usr/bin/bwrap",
                          "--unshare-all",
                          "--die-with-parent",
                          "--new-session",
                          "--ro-bind",
                          "/usr",
                          "/usr",
                          "--symlink",
                          "usr/bin",
                          "/bin",
                          "--symlink",
                          "usr/lib",
                          "/lib",
                          "--symlink",
                          "usr/lib64",
                          "/lib64",
                          "--proc",
                          "/proc",
                          "--dev",
                          "/dev",
                          "--tmpfs",
                          "/tmp",
                          "--bind",
                          root,
                          root,
                          "/bin/true"});
       }},
      {"cordon run (full sandbox, v1 limits)",
       [dir, root, state] {
         return run_argv(
             {dir + "/cordon", "run", "--root", root, "--state-dir", state, "--", "/bin/true"});
       }},
      {"engine library start->settle",
       [&engine] {
         auto t0 = Clock::now();
         auto s = (*engine)->start("bench", {.argv = {"/bin/true"}});
         if (!s) {
           std::fprintf(stderr, "start: %s\n", s.error().message().c_str());
           std::exit(1);
         }
         auto st = (*engine)->status("bench", s->task_id, std::chrono::seconds(30));
         double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
         if (!st || st->state != "exited") {
           std::fprintf(stderr, "engine job did not exit cleanly\n");
           std::exit(1);
         }
         (void)(*engine)->remove("bench", s->task_id);
         return ms;
       }},
  };
  std::unique_ptr<cordon::Engine> unpooled;
  if (compare_pool) {
    cordon::EngineOptions no_pool = eo;
    no_pool.state_dir = work + "/state3";
    no_pool.warm_pool = false;
    auto e = cordon::Engine::open(no_pool);
    if (!e) {
      std::fprintf(stderr, "engine: %s\n", e.error().message().c_str());
      return 1;
    }
    unpooled = std::move(*e);
    variants["engine library start->settle, no warm pool"] = [&unpooled] {
      auto t0 = Clock::now();
      auto s = unpooled->start("bench", {.argv = {"/bin/true"}});
      if (!s) {
        std::fprintf(stderr, "start: %s\n", s.error().message().c_str());
        std::exit(1);
      }
      auto st = unpooled->status("bench", s->task_id, std::chrono::seconds(30));
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!st || st->state != "exited") {
        std::fprintf(stderr, "engine job did not exit cleanly\n");
        std::exit(1);
      }
      (void)unpooled->remove("bench", s->task_id);
      return ms;
    };
  }
  std::vector<std::string> names;
  for (auto& [k, v] : variants) {
    if (only.empty() || k.find(only) != std::string::npos || k == "fork+exec (floor)") {
      names.push_back(k);
    }
  }
  std::map<std::string, std::vector<double>> samples;
  std::mt19937 rng(12345);
  // Warm-up round (page cache, profile compilation), not counted.
  for (auto& nm : names) variants[nm]();
  for (int r = 0; r < runs; ++r) {
    std::shuffle(names.begin(), names.end(), rng);
    for (auto& nm : names) {
      samples[nm].push_back(variants[nm]());
      std::this_thread::sleep_for(std::chrono::milliseconds(spacing_ms));
    }
  }
  double floor = percentile(samples["fork+exec (floor)"], 0.5);
  // Without bubblewrap in the run (--only) there is no x bwrap ratio.
  double bwrap = samples.contains("bubblewrap") ? percentile(samples["bubblewrap"], 0.5) : 0;
  std::printf("spawn-to-exit of /bin/true, %d interleaved runs each, %d ms apart\n", runs,
              spacing_ms);
  std::printf("%-40s %10s %10s %12s %12s\n", "variant", "median ms", "p99 ms", "x floor",
              "x bwrap");
  std::string json = "{\"runs\": " + std::to_string(runs) + ", \"variants\": {";
  bool first = true;
  for (auto& [nm, v] : samples) {
    double med = percentile(v, 0.5), p99 = percentile(v, 0.99);
    std::printf("%-40s %10.3f %10.3f %12.2f %12.2f\n", nm.c_str(), med, p99, med / floor,
                bwrap > 0 ? med / bwrap : 0.0);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\": {\"medianMs\": %.3f, \"p99Ms\": %.3f, \"xFloor\": %.3f, "
                  "\"xBwrap\": %.3f}",
                  first ? "" : ", ", nm.c_str(), med, p99, med / floor,
                  bwrap > 0 ? med / bwrap : 0.0);
    json += buf;
    first = false;
  }
  json += "}}\n";
  if (!json_out.empty()) std::ofstream(json_out) << json;
  engine->reset();
  unpooled.reset();
  std::filesystem::remove_all(work);
  return 0;
}
