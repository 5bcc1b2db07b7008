// Output capture throughput: a bulk writer (`dd bs=1M`) printing 1 GiB to stdout inside an
// engine job, captured to the job's stdout.log, against the same dd writing straight to a
// file on the same filesystem. Runs interleaved, the median of each is reported.
//
//   build/capture_bench [--mib N] [--runs N] [--dir DIR] [--json FILE]
//
// Fsync policy (src/engine/engine.cpp): nothing is fsynced while output streams; a job's logs
// are fsynced once when it settles (bank()), and meta.json is replaced atomically (temp, fsync,
// rename, directory fsync) at start and at settle. So two figures each: "streamed" (the last
// byte is in the log / dd exited) and "durable" (the job settled / dd's file fsynced). On a
// busy machine the wall-clock figures mostly measure contention (the sandboxed dd also shares
// the v1 cpu cgroup `cordon` with every other sandbox), so the engine's own CPU time per GiB
// captured is reported too: that one does not depend on the load.

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

#include "base/sha256.hpp"
#include "cordon/engine.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double secs_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "capture_bench: %s\n", what.c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string self_dir() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin(self, static_cast<size_t>(n > 0 ? n : 0));
  return bin.substr(0, bin.rfind('/'));
}

struct Times {
  double streamed = 0, durable = 0;  // seconds
  double cpu = 0;  // CPU seconds of the capturing side (the engine process / nothing for dd)
  double loop_cpu = 0, hash_cpu = 0;  // of the engine's event-loop and hashing threads
};

double cpu_seconds(int who) {
  struct rusage ru {};
  ::getrusage(who, &ru);
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

// CPU seconds of this process's threads named `name` (the engine names its threads): the
// event-loop thread's figure per GiB is the ceiling on one capture's speed, whatever else
// runs on the machine.
double thread_cpu(const std::string& name) {
  double total = 0;
  static const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string c;
    std::getline(comm, c);
    if (c != name) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string f;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
      if (i == 14) utime = std::stoull(f);
      if (i == 15) stime = std::stoull(f);
    }
    total += static_cast<double>(utime + stime) / tick;
  }
  return total;
}

// dd > file, outside any sandbox: the reference.
Times direct(const std::vector<std::string>& argv, const std::string& path) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  Times t;
  auto t0 = Clock::now();
  pid_t pid;
  if (posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ) != 0) die("spawn dd failed");
  int st = 0;
  ::waitpid(pid, &st, 0);
  t.streamed = secs_since(t0);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) die("fsync " + path + " failed");
  ::close(fd);
  t.durable = secs_since(t0);
  posix_spawn_file_actions_destroy(&fa);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("dd failed");
  ::unlink(path.c_str());
  return t;
}

// The floors, outside any sandbox and engine: the same dd writing into a pipe (grown to
// 1 MiB, as the engine grows a job's) that this thread reads in 256 KiB pieces and discards,
// or also hashes with cordon's SHA-256. No capture through a pipe can beat the first; the
// second is what hashing every byte costs on one thread.
double piped(const std::vector<std::string>& argv, bool hash) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) die("pipe2 failed");
  if (::fcntl(p[0], F_SETPIPE_SZ, 1 << 20) < 0) die("F_SETPIPE_SZ failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  auto t0 = Clock::now();
  pid_t pid;
  if (posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ) != 0) die("spawn dd failed");
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  std::vector<char> buf(256 << 10);
  cordon::Sha256 sha;
  for (;;) {
    ssize_t n = ::read(p[0], buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("read from the pipe failed");
    if (n == 0) break;
    if (hash) sha.update(buf.data(), static_cast<size_t>(n));
  }
  if (hash) (void)sha.finish();
  double t = secs_since(t0);
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("dd failed");
  return t;
}

// The same dd inside an engine job; "streamed" is when stdout.log holds every byte (polled
// every 1 ms: the engine has no event for it), "durable" when the job settled.
Times captured(cordon::Engine& engine, const std::string& state,
               const std::vector<std::string>& argv, uint64_t bytes) {
  Times t;
  double cpu0 = cpu_seconds(RUSAGE_SELF);
  double loop0 = thread_cpu("cordon-loop"), hash0 = thread_cpu("cordon-hash");
  auto t0 = Clock::now();
  auto s = engine.start("bench", {.argv = argv});
  if (!s) die("start: " + s.error().message());
  std::string log = state + "/jobs/" + s->task_id + "/stdout.log";
  struct stat sb {};
  while (::stat(log.c_str(), &sb) != 0 || static_cast<uint64_t>(sb.st_size) < bytes) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (secs_since(t0) > 300) die("the log never reached its size");
    if (static_cast<uint64_t>(sb.st_size) < bytes && (sb.st_mode & 0222) == 0) {
      auto st = engine.status("bench", s->task_id);  // banked (read-only) short of the size
      die("the capture job settled early: " + (st ? st->state + " " + st->error : ""));
    }
  }
  t.streamed = secs_since(t0);
  auto st = engine.status("bench", s->task_id, std::chrono::seconds(120));
  t.durable = secs_since(t0);
  t.cpu = cpu_seconds(RUSAGE_SELF) - cpu0;
  t.loop_cpu = thread_cpu("cordon-loop") - loop0;
  t.hash_cpu = thread_cpu("cordon-hash") - hash0;
  if (!st || st->state != "exited" || st->stdout_bytes != bytes) {
    die("capture job did not exit cleanly: " + (st ? st->state + " " + st->error : ""));
  }
  (void)engine.remove("bench", s->task_id);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 1024;
  int runs = 3;
  std::string base = "/var/tmp", json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--dir" && i + 1 < argc) {
      base = argv[++i];
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: capture_bench [--mib N] [--runs N] [--dir DIR] [--json F]\n");
      return 2;
    }
  }
  if (mib == 0 || runs < 1) die("--mib and --runs must be positive");
  std::string tmpl = base + "/cordon-capture.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) die("mkdtemp in " + base + " failed");
  std::string work = tmpl, dir = self_dir();
  std::string root = work + "/root", state = work + "/state";
  std::filesystem::create_directories(root);
  std::ofstream(work + "/policy.json")
      << "{\"allowedExecutables\": [\"/bin/dd\", \"/usr/bin/dd\"], \"cwdRoot\": \"" << root
      << "\", \"maxOutputBytes\": " << (mib << 20) + (1 << 20) << "}";
  cordon::EngineOptions eo;
  eo.state_dir = state;
  eo.policy_path = work + "/policy.json";
  eo.spawner_path = dir + "/cordon-spawner";
  eo.init_path = dir + "/cordon-init";
  eo.default_seccomp_profile = dir + "/seccomp/default.json";
  auto engine = cordon::Engine::open(eo);
  if (!engine) die("engine: " + engine.error().message());

  const uint64_t bytes = mib << 20;
  std::vector<std::string> dd = {"/usr/bin/dd", "if=/dev/zero", "bs=1M",
                                 "count=" + std::to_string(mib), "status=none"};
  std::vector<double> eng_s, eng_d, eng_cpu, eng_loop, eng_hash, ref_s, ref_d, pipe_s, hash_s;
  captured(**engine, state, {"/usr/bin/dd", "if=/dev/zero", "bs=1M", "count=1", "status=none"},
           1 << 20);  // warm-up
  for (int r = 0; r < runs; ++r) {
    for (int k = 0; k < 2; ++k) {  // alternate which goes first
      if ((r + k) % 2 == 0) {
        Times t = captured(**engine, state, dd, bytes);
        eng_s.push_back(t.streamed);
        eng_d.push_back(t.durable);
        eng_cpu.push_back(t.cpu);
        eng_loop.push_back(t.loop_cpu);
        eng_hash.push_back(t.hash_cpu);
      } else {
        Times t = direct(dd, work + "/direct.out");
        ref_s.push_back(t.streamed);
        ref_d.push_back(t.durable);
      }
    }
    pipe_s.push_back(piped(dd, false));
    hash_s.push_back(piped(dd, true));
  }
  double gb = static_cast<double>(bytes) / 1e9;
  double es = gb / median(eng_s), ed = gb / median(eng_d), rs = gb / median(ref_s),
         rd = gb / median(ref_d);
  std::printf("capture of %llu MiB from dd bs=1M, %d runs each, median (GB = 1e9 bytes)\n",
              static_cast<unsigned long long>(mib), runs);
  std::printf("%-44s %10s %10s\n", "", "streamed", "durable");
  std::printf("%-44s %8.2f/s %8.2f/s\n", "engine job, stdout captured to its log  GB", es, ed);
  std::printf("%-44s %8.2f/s %8.2f/s\n", "dd writing straight to a file (no sandbox) GB", rs, rd);
  std::printf("%-44s %10.2f %10.2f\n", "ratio engine / direct", es / rs, ed / rd);
  const double ps = gb / median(pipe_s), hs = gb / median(hash_s);
  std::printf("floors, no sandbox, no engine, nothing written:\n");
  std::printf("%-44s %8.2f/s\n", "dd | a reader that discards (the pipe) GB", ps);
  std::printf("%-44s %8.2f/s\n", "dd | read + SHA-256 on one thread GB", hs);
  double cpu_per_gib = median(eng_cpu) / (static_cast<double>(bytes) / (1 << 30));
  const double gib = static_cast<double>(bytes) / (1 << 30);
  double loop_per_gib = median(eng_loop) / gib, hash_per_gib = median(eng_hash) / gib;
  std::printf("engine CPU per GiB captured: %.2f s (read, SHA-256, write; load-independent)\n",
              cpu_per_gib);
  std::printf(
      "  of which the event-loop thread %.2f s (read, write: a ceiling of %.2f GB/s per core), "
      "the hash thread %.2f s\n",
      loop_per_gib, loop_per_gib > 0 ? (1 << 30) / 1e9 / loop_per_gib : 0.0, hash_per_gib);
  std::printf(
      "fsync policy: none while streaming; logs fsynced once at settle; meta.json atomic "
      "(fsync+rename) at start and settle. durable = settled / dd file fsynced.\n");
  if (!json_out.empty()) {
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "{\"mib\": %llu, \"runs\": %d, \"engineStreamedGBps\": %.4f, "
                  "\"engineDurableGBps\": %.4f, \"directStreamedGBps\": %.4f, "
                  "\"directDurableGBps\": %.4f, \"streamedRatio\": %.4f, \"durableRatio\": "
                  "%.4f, \"engineCpuSecondsPerGiB\": %.4f, \"loopCpuSecondsPerGiB\": %.4f, "
                  "\"hashCpuSecondsPerGiB\": %.4f, \"pipeFloorGBps\": %.4f, "
                  "\"pipeHashFloorGBps\": %.4f}\n",
                  static_cast<unsigned long long>(mib), runs, es, ed, rs, rd, es / rs, ed / rd,
                  cpu_per_gib, loop_per_gib, hash_per_gib, ps, hs);
    std::ofstream(json_out) << buf;
  }
  engine->reset();
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  return 0;
}
