// Concurrency: N (default 1000) sandboxed `sleep` jobs running at once through one engine
// (the approach of tests/integration/engine_scale_test.cpp): time until every start()
// returned and until every sandbox's `sleep` runs, the engine's and the spawner's RSS, the
// kernel memory per job (growth of Slab + KernelStack + PageTables + Percpu in /proc/meminfo
// divided by N: namespaces, cgroups, pipes, pidfds included), and the time to kill them all.
//
//   build/scale_bench [--jobs N] [--rounds R] [--no-floor] [--json FILE] [--state-parent DIR]
//                     [--kill-each] [--direct-kill] [--hold-mntns] [--floor-only]
//                     [--pids-out FILE] [--before-kill CMD] [--after-kill CMD]
//
// --no-floor skips the kernel's floor for the start and the kill: the same number of processes,
// without cordon, forked until all run, then killed with cgroup.kill (plain sleeps; two sleeps
// in fresh namespaces per job); --floor-only measures only that floor (a cgroup each).
// --state-parent DIR (default /var/tmp) holds the engine's state dir (records, logs, leases)
// and the working root: the filesystem under it decides what a start's file creations cost
// (docs/performance.md, Concurrency: ext4 without a journal skips recently freed inodes).
// The kill is one Engine::kill_many() of every job. Kill-phase measurement modes
// (docs/performance.md, Concurrency):
//   --kill-each    one Engine::kill() per job instead;
//   --direct-kill  the bench writes every sandbox's cgroup.kill itself, none through the engine;
//   --hold-mntns   the bench holds every sandbox's mount namespace across the kill and drops
//                  them after the exits (timed apart): the exits without the mount teardown;
//   --before-kill / --after-kill  shell commands run right before the kill and after every
//                  sandboxed process is reaped (e.g. start and stop `perf record -a`);
//   --pids-out     the sandboxed pids and the kill's CLOCK_MONOTONIC bounds, to pick them out
//                  of a trace taken with `perf record -k CLOCK_MONOTONIC`.
//
// /proc/meminfo is machine-wide: other work on the machine moves it too, so the headline is
// backed by an attribution that is not: the slab caches that grew (/proc/slabinfo), meminfo's
// parts, and what came back after the kill, per job. Rounds (start N, kill N) repeat in one
// engine; the JSON's headline is the first round's. The per-job figure depends on the
// machine's history, not only on cordon: slab pages freed by earlier work are reused (growth
// reads low), and every memory cgroup holds a shrinker slot for every superblock that has
// existed at once since boot (the kernel never shrinks that table), so a machine that once
// ran 1000 sandboxes pays more per memory cgroup afterwards. The engine holds ~13 fds per
// job here (hybrid cgroups), so N is bounded by RLIMIT_NOFILE / 13.

#include <dirent.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

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

// The kernel's memory as /proc/meminfo and /proc/slabinfo show it, KiB.
struct KernelSnapshot {
  long slab = 0, sunreclaim = 0, kernel_stack = 0, page_tables = 0, percpu = 0;
  std::map<std::string, long> cache_kib;  // slab pages per cache (num_slabs * pagesperslab)
  std::map<std::string, long long> cache_object_bytes;  // objects in use * object size
  // Bytes of the objects in use, all caches: unlike pages, not lowered by objects landing in
  // slabs that earlier work left half empty, nor raised by fresh slabs' unused room.
  long long object_bytes = 0;
  // Issue 6's definition: Slab + KernelStack + PageTables + Percpu.
  long total() const { return slab + kernel_stack + page_tables + percpu; }
};

KernelSnapshot kernel_snapshot(bool with_caches) {
  KernelSnapshot k;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  long value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "Slab:") k.slab = value;
    if (key == "SUnreclaim:") k.sunreclaim = value;
    if (key == "KernelStack:") k.kernel_stack = value;
    if (key == "PageTables:") k.page_tables = value;
    if (key == "Percpu:") k.percpu = value;
  }
  if (!with_caches) return k;
  std::ifstream slabinfo("/proc/slabinfo");
  std::string line;
  long page_kib = ::sysconf(_SC_PAGESIZE) / 1024;
  while (std::getline(slabinfo, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("slabinfo", 0) == 0) continue;
    // name active_objs num_objs objsize objperslab pagesperslab : tunables l b s : slabdata
    // active_slabs num_slabs sharedavail
    std::istringstream f(line);
    std::string name, colon, word;
    long active = 0, num = 0, objsize = 0, per_slab = 0, pages_per_slab = 0;
    f >> name >> active >> num >> objsize >> per_slab >> pages_per_slab;
    long num_slabs = 0;
    for (int i = 0; i < 9 && f >> word; ++i) {
      if (i == 8) num_slabs = std::atol(word.c_str());
    }
    k.cache_kib[name] = num_slabs * pages_per_slab * page_kib;
    k.object_bytes += static_cast<long long>(active) * objsize;
    k.cache_object_bytes[name] = static_cast<long long>(active) * objsize;
  }
  return k;
}

long kernel_kib() { return kernel_snapshot(false).total(); }

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
    // /proc/<pid>/comm first: reading every process's status (formatted by the kernel) while
    // the jobs start took a large share of the CPU they start on.
    if (!comm.empty()) {
      std::ifstream c("/proc/" + pid + "/comm");
      std::string name;
      if (!std::getline(c, name) || name != comm) continue;
    }
    std::istringstream uids(proc_field(pid, "status", "Uid:"));
    uint64_t uid = 0;
    if (uids >> uid && uid >= base && uid < base + count) ++n;
  }
  ::closedir(d);
  return n;
}

// pidfds of every process whose real uid is in [base, base + count).
std::vector<int> sandboxed_pidfds(uint32_t base, uint32_t count, std::vector<int>* pids) {
  std::vector<int> fds;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return fds;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string pid = e->d_name;
    std::istringstream uids(proc_field(pid, "status", "Uid:"));
    uint64_t uid = 0;
    if (!(uids >> uid) || uid < base || uid >= base + count) continue;
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, std::atoi(pid.c_str()), 0));
    if (fd >= 0) fds.push_back(fd);
    if (fd >= 0 && pids != nullptr) pids->push_back(std::atoi(pid.c_str()));
  }
  ::closedir(d);
  return fds;
}

// Waits until every pidfd is readable (its process has exited), closing them; false after
// `limit_ms`. epoll, not poll(): re-polling every remaining pidfd after each wake-up is
// O(N^2) and took ~10 % of the CPU the dying sandboxes needed (2 cores), which the kernel
// floor's waitpid() does not pay.
bool wait_all_exited(std::vector<int>& fds, double limit_ms, Clock::time_point t0) {
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) die("epoll_create1");
  size_t left = 0;
  for (int fd : fds) {
    struct epoll_event ev {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl pidfd");
    ++left;
  }
  fds.clear();
  std::vector<struct epoll_event> ready(256);
  bool ok = true;
  while (left > 0) {
    if (ms_since(t0) > limit_ms) {
      ok = false;
      break;
    }
    int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 100);
    if (n < 0 && errno != EINTR) die("epoll_wait pidfds");
    for (int i = 0; i < n; ++i) {
      ::close(ready[static_cast<size_t>(i)].data.fd);  // also leaves the epoll set
      --left;
    }
  }
  ::close(ep);
  return ok;
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

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// Superblocks mounted in `pid`'s mount namespace that the host's (ours) does not have:
// each costs its own shrinker, and every memcg on the machine a slot for it.
size_t own_superblocks(const std::string& pid) {
  auto devs = [](const std::string& path) {
    std::set<std::string> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string id, parent, dev;
      f >> id >> parent >> dev;
      out.insert(dev);
    }
    return out;
  };
  auto host = devs("/proc/self/mountinfo");
  size_t n = 0;
  for (const auto& d : devs("/proc/" + pid + "/mountinfo")) n += host.count(d) == 0;
  return n;
}

// A pid of a process named `comm` whose real uid is in [base, base + count), or "".
std::string find_sandboxed(const std::string& comm, uint32_t base, uint32_t count) {
  std::string found;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return found;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string pid = e->d_name;
    if (proc_field(pid, "status", "Name:\t") != comm) continue;
    std::istringstream uids(proc_field(pid, "status", "Uid:"));
    uint64_t uid = 0;
    if (uids >> uid && uid >= base && uid < base + count) {
      found = pid;
      break;
    }
  }
  ::closedir(d);
  return found;
}

struct Round {
  KernelSnapshot before, running, after;
  double started_ms = 0, all_running_ms = 0, kill_calls_ms = 0, gone_ms = 0, reaped_ms = 0,
         settled_ms = 0;
  double mntns_release_ms = -1;  // --hold-mntns: closing the held mount namespaces
  double settle_ms = 0;          // after every job settled, until the kernel figure stopped falling
  long rss_kib = 0, spawner_rss_kib = 0;
  size_t fds = 0, tasks = 0, superblocks = 0;
  std::string load_before, load_after;
  long grown_kib() const { return running.total() - before.total(); }
  long back_kib() const { return running.total() - after.total(); }
  double per_job_kib(unsigned jobs) const { return static_cast<double>(grown_kib()) / jobs; }
};

// One round: start `jobs` sleeps, measure with all of them running, kill all, wait until the
// kernel has given the memory back (namespaces and their objects are freed after RCU grace
// periods and by workqueues, so the figure keeps falling after the last process is gone).
// Shell commands run (synchronously) right before the kill and once every sandboxed process
// is reaped, to wrap the kill phase alone in a profiler (e.g. start `perf record -a` in the
// background, stop it by its pid).
// `pids_out`: where to write the sandboxed pids and the kill phase's CLOCK_MONOTONIC bounds
// (for `perf record -k CLOCK_MONOTONIC`), to pick this bench's processes out of a trace.
// `hold_mntns`: the bench holds each sandbox's mount namespace (an nsfs fd) across the kill
// and drops them after every process exited, timing that separately: the exits then do not
// tear the mount trees down themselves (umount_tree, the RCU grace period of
// namespace_unlock(), the superblocks' kill_sb) — a measurement of what that part costs.
struct KillHooks {
  std::string before, after, pids_out;
  bool hold_mntns = false;
  // `direct_kill`: write every sandbox's v2 cgroup.kill from the bench, all before the engine
  // hears of it (what an engine kill-many can at best do), instead of N Engine::kill() calls,
  // each of which takes the engine's lock behind the event loop settling the first to die.
  bool direct_kill = false;
  // `kill_each`: one Engine::kill() per job (as before Engine::kill_many existed).
  bool kill_each = false;
};

std::string cgroup2_mount();
std::string own_cgroup_dir(const std::string& controller);
bool write_text(const std::string& path, const std::string& text);

double monotonic_s() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void run_hook(const std::string& cmd) {
  if (cmd.empty()) return;
  std::fflush(nullptr);
  if (std::system(cmd.c_str()) != 0) die("hook failed: " + cmd);
}

Round run_round(cordon::Engine& engine, unsigned jobs, uint32_t base, uint32_t count,
                const KillHooks& hooks) {
  Round k;
  k.load_before = loadavg();
  k.before = kernel_snapshot(true);
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
  k.started_ms = ms_since(t0);
  size_t running = 0;
  while ((running = count_sandboxed("sleep", base, count)) < jobs) {
    if (ms_since(t0) > 60000) die("only " + std::to_string(running) + " sleeps run after 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  k.all_running_ms = ms_since(t0);
  k.running = kernel_snapshot(true);
  k.rss_kib = std::atol(proc_field("self", "status", "VmRSS:").c_str());
  k.spawner_rss_kib = child_rss_kib("cordon-spawner");
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++k.fds;
  k.tasks = count_sandboxed("", base, count);
  k.superblocks = own_superblocks(find_sandboxed("sleep", base, count));

  // Exits are watched through pidfds (scanning /proc for 2000 processes takes tens of ms);
  // "reaped" is when /proc shows none of them any more (zombies too).
  std::vector<int> pids;
  std::vector<int> pidfds = sandboxed_pidfds(base, count, &pids);
  std::vector<int> mntns;
  if (hooks.hold_mntns) {
    for (int pid : pids) {
      int fd = ::open(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) mntns.push_back(fd);
    }
  }
  std::vector<std::string> kill_files;
  if (hooks.direct_kill) {
    std::set<std::string> dirs;
    std::string mount = cgroup2_mount();
    for (int pid : pids) {
      std::string rel = proc_field(std::to_string(pid), "cgroup", "0::");
      if (!rel.empty()) dirs.insert(mount + rel + "/cgroup.kill");
    }
    kill_files.assign(dirs.begin(), dirs.end());
  }
  run_hook(hooks.before);
  double mono_kill = monotonic_s();
  auto t1 = Clock::now();
  for (const auto& f : kill_files) {
    if (!write_text(f, "1")) die("write " + f);
  }
  if (hooks.kill_each && !hooks.direct_kill) {
    for (const auto& id : ids) {
      auto r = engine.kill("s", id, SIGKILL);
      if (!r) die("kill: " + r.error().message());
    }
  } else if (!hooks.direct_kill) {
    auto r = engine.kill_many("s", ids, SIGKILL);
    if (!r) die("kill_many: " + r.error().message());
  }
  k.kill_calls_ms = ms_since(t1);
  if (!wait_all_exited(pidfds, 120000, t1)) die("sandboxed processes left after 120 s");
  k.gone_ms = ms_since(t1);
  if (hooks.hold_mntns) {
    auto t3 = Clock::now();
    for (int fd : mntns) ::close(fd);
    k.mntns_release_ms = ms_since(t3);
  }
  if (!hooks.pids_out.empty()) {
    std::ofstream out(hooks.pids_out);
    char bounds[96];
    std::snprintf(bounds, sizeof bounds, "kill %.6f gone %.6f\n", mono_kill, monotonic_s());
    out << bounds;
    for (int pid : pids) out << pid << "\n";
  }
  size_t left = 0;
  while ((left = count_sandboxed("", base, count)) > 0) {
    if (ms_since(t1) > 120000) die(std::to_string(left) + " sandboxed processes left after 120 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  k.reaped_ms = ms_since(t1);
  run_hook(hooks.after);
  auto w = engine.wait("s", ids, std::chrono::seconds(300), true);
  k.settled_ms = ms_since(t1);
  if (!w) die("wait: " + w.error().message());
  for (const auto& st : *w) {
    // Killed behind the engine's back, a job settles as its command's death by SIGKILL.
    if (st.state != "killed" && !hooks.direct_kill) die(st.task_id + " ended " + st.state);
  }
  // Until the figure is back within 5 % of the growth, or has not fallen for 3 s, or 20 s.
  auto t2 = Clock::now();
  long low = kernel_kib();
  auto low_at = Clock::now();
  long near = k.before.total() + (k.running.total() - k.before.total()) / 20;
  while (low > near && ms_since(low_at) < 3000 && ms_since(t2) < 20000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    long now = kernel_kib();
    if (now < low - 256) {
      low = now;
      low_at = Clock::now();
    }
  }
  k.settle_ms = std::chrono::duration<double, std::milli>(low_at - t2).count();
  k.after = kernel_snapshot(true);
  k.load_after = loadavg();
  return k;
}

// Where the growth went: meminfo's parts and the slab caches that grew most, per job, and
// what each gave back after the kill. Slab pages are counted as meminfo counts them; large
// kmalloc()s (over 8 KiB, e.g. 1 MiB pipes' buffer arrays) bypass the caches and show only
// in meminfo's Slab, as "large kmalloc".
void print_round_detail(const Round& k, unsigned jobs) {
  auto per = [&](long kib) { return static_cast<double>(kib) / jobs; };
  std::printf("kernel memory per job, KiB: all running - before (given back after the kill)\n");
  auto row = [&](const char* name, long b, long r, long a) {
    std::printf("  %-28s %8.1f (%.1f)\n", name, per(r - b), per(r - a));
  };
  row("Slab", k.before.slab, k.running.slab, k.after.slab);
  row("  of it unreclaimable", k.before.sunreclaim, k.running.sunreclaim, k.after.sunreclaim);
  row("KernelStack", k.before.kernel_stack, k.running.kernel_stack, k.after.kernel_stack);
  row("PageTables", k.before.page_tables, k.running.page_tables, k.after.page_tables);
  row("Percpu", k.before.percpu, k.running.percpu, k.after.percpu);
  row("total (issue 6)", k.before.total(), k.running.total(), k.after.total());
  std::vector<std::pair<long, std::string>> grown;
  long caches = 0;
  for (const auto& [name, kib] : k.running.cache_kib) {
    auto b = k.before.cache_kib.find(name);
    long d = kib - (b == k.before.cache_kib.end() ? 0 : b->second);
    caches += d;
    grown.emplace_back(d, name);
  }
  std::sort(grown.rbegin(), grown.rend());
  std::printf("  slab caches that grew most:\n");
  for (size_t i = 0; i < grown.size() && i < 14; ++i) {
    const auto& [d, name] = grown[i];
    auto a = k.after.cache_kib.find(name);
    long after = a == k.after.cache_kib.end() ? 0 : a->second;
    std::printf("    %-26s %8.1f (%.1f)\n", name.c_str(), per(d),
                per(k.running.cache_kib.at(name) - after));
  }
  std::printf("    %-26s %8.1f\n", "large kmalloc (no cache)",
              per(k.running.slab - k.before.slab - caches));
  std::printf("  slab objects in use (all caches) %8.1f (%.1f)\n",
              per(static_cast<long>((k.running.object_bytes - k.before.object_bytes) / 1024)),
              per(static_cast<long>((k.running.object_bytes - k.after.object_bytes) / 1024)));
}

// --- What an empty memory cgroup costs here ---------------------------------------------------

// Every memory cgroup gets the kernel's shrinker table (mm/shrinker.c: one 1 KiB kmalloc per
// 64 shrinker ids), sized by the most shrinkers — one per superblock — that ever existed at once
// since boot; the table never shrinks. Each job has a memory cgroup, so on a machine whose
// history once held many superblocks, every job pays for that history. Measured directly:
// `n` empty v1 memory cgroups made next to the engine's and removed again. Returns KiB per
// cgroup {all slab objects, kmalloc-1k objects}, or {-1, -1} without a v1 memory hierarchy.
std::pair<double, double> empty_memcg_kib(unsigned n) {
  const std::string own = own_cgroup_dir("memory");
  if (own.empty()) return {-1, -1};
  std::string base = own + "/cordon-memcg-probe-" + std::to_string(::getpid()) + "-";
  KernelSnapshot before = kernel_snapshot(true);
  unsigned made = 0;
  for (; made < n; ++made) {
    if (::mkdir((base + std::to_string(made)).c_str(), 0755) != 0) break;
  }
  KernelSnapshot with = kernel_snapshot(true);
  for (unsigned i = 0; i < made; ++i) {
    if (::rmdir((base + std::to_string(i)).c_str()) != 0) {
      std::fprintf(stderr, "rmdir %s%u: %s\n", base.c_str(), i, std::strerror(errno));
    }
  }
  if (made == 0) return {-1, -1};
  auto cache = [](const KernelSnapshot& k, const char* name) {
    auto it = k.cache_object_bytes.find(name);
    return it == k.cache_object_bytes.end() ? 0LL : it->second;
  };
  return {
      static_cast<double>(with.object_bytes - before.object_bytes) / 1024.0 / made,
      static_cast<double>(cache(with, "kmalloc-1k") - cache(before, "kmalloc-1k")) / 1024.0 / made};
}

// --- The kernel's floor for the same teardown (no cordon): N processes killed at once -------

// Where the cgroup2 hierarchy is mounted ("" if nowhere).
std::string cgroup2_mount() {
  std::string mount;
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mi, line)) {
    if (line.find(" - cgroup2 ") == std::string::npos) continue;
    std::istringstream f(line);
    std::string id, parent, dev, root;
    f >> id >> parent >> dev >> root >> mount;
    break;
  }
  return mount;
}

// This process's cgroup directory in the hierarchy of `controller` (a v1 controller such as
// "memory"), or in the cgroup2 hierarchy for ""; "" when there is none or the mount shows
// another subtree than ours.
std::string own_cgroup_dir(const std::string& controller) {
  std::string mount, root;
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mi, line)) {
    size_t dash = line.find(controller.empty() ? " - cgroup2 " : " - cgroup ");
    if (dash == std::string::npos) continue;
    if (!controller.empty()) {
      std::istringstream t(line.substr(dash + 3));
      std::string fstype, source, options;
      t >> fstype >> source >> options;
      if (("," + options + ",").find("," + controller + ",") == std::string::npos) continue;
    }
    std::istringstream f(line);
    std::string id, parent, dev;
    f >> id >> parent >> dev >> root >> mount;
    break;
  }
  std::string rel;
  std::ifstream cg("/proc/self/cgroup");
  while (std::getline(cg, line)) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string controllers = line.substr(a + 1, b - a - 1);
    bool ours = controller.empty()
                    ? controllers.empty()
                    : ("," + controllers + ",").find("," + controller + ",") != std::string::npos;
    if (ours) rel = line.substr(b + 1);
  }
  if (mount.empty() || rel.empty()) return {};
  if (root != "/") {  // a bind of a subtree: our path must lie below it
    if (rel != root && rel.rfind(root + "/", 0) != 0) return {};
    rel = rel.substr(root.size());
  }
  return rel.empty() || rel == "/" ? mount : mount + rel;
}

std::string own_v2_dir() { return own_cgroup_dir(""); }

bool write_text(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// In a child of its own (it becomes the subreaper of everything it starts, so the bench's
// own children are never reaped by it): `n` sandboxes-without-cordon, each `tasks` sleeping
// processes in fresh pid, net, mount, ipc and uts namespaces when `namespaces`, each in a v2
// cgroup of its own (`per_job_cgroup`) or all in one; then one cgroup.kill per cgroup and the
// time until every process is reaped. Also the time from the first fork until every sleep
// runs: the kernel's floor for starting as many sandboxes (each child makes its own
// namespaces, so both CPUs do). Negative numbers on failure.
struct KernelFloor {
  double start_ms = -1, kill_ms = -1;
};
KernelFloor kernel_floor(unsigned n, bool namespaces, bool per_job_cgroup,
                         const std::string& pids_out = {}) {
  int rep[2];
  if (::pipe2(rep, O_CLOEXEC) != 0) return {};
  std::fflush(nullptr);  // the child may exit through die(): nothing buffered twice
  pid_t helper = ::fork();
  if (helper < 0) return {};
  if (helper == 0) {
    ::close(rep[0]);
    KernelFloor result;
    std::string base = own_v2_dir();
    std::string top = base + "/cordon-scale-floor." + std::to_string(::getpid());
    std::vector<std::string> dirs;
    if (!base.empty() && ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0 &&
        ::mkdir(top.c_str(), 0755) == 0) {
      for (unsigned i = 0; i < (per_job_cgroup ? n : 1); ++i) {
        dirs.push_back(top + "/" + std::to_string(i));
        if (::mkdir(dirs.back().c_str(), 0755) != 0) die("mkdir " + dirs.back());
      }
      size_t want = 0;
      auto t_fork = Clock::now();
      for (unsigned i = 0; i < n; ++i) {
        pid_t c = ::fork();
        if (c < 0) die("fork");
        if (c == 0) {
          const std::string& dir = dirs[per_job_cgroup ? i : 0];
          if (!write_text(dir + "/cgroup.procs", "0")) ::_exit(120);
          if (namespaces) {
            if (::unshare(CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC |
                          CLONE_NEWUTS) != 0) {
              ::_exit(121);
            }
            // pid 1 of the new namespace and one more, as a sandbox's init and command.
            if (::fork() != 0) ::_exit(0);  // reparented to the helper (subreaper)
            if (::fork() < 0) ::_exit(122);
          }
          ::execl("/bin/sleep", "sleep", "1000", static_cast<char*>(nullptr));
          ::_exit(127);
        }
        want += namespaces ? 2 : 1;
      }
      // Every sleep running: count the members of the cgroups.
      auto t0 = Clock::now();
      for (;;) {
        size_t members = 0;
        for (const auto& d : dirs) {
          std::ifstream procs(d + "/cgroup.procs");
          std::string pid;
          while (procs >> pid) {
            std::ifstream comm("/proc/" + pid + "/comm");
            std::string name;
            comm >> name;
            members += name == "sleep";
          }
        }
        if (members >= want) break;
        if (ms_since(t0) > 60000) die("floor: not all sleeps run after 60 s");
        // Reap the intermediate forks as they go.
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      result.start_ms = ms_since(t_fork);
      std::vector<std::string> pids;
      if (!pids_out.empty()) {
        for (const auto& d : dirs) {
          std::ifstream procs(d + "/cgroup.procs");
          std::string pid;
          while (procs >> pid) pids.push_back(pid);
        }
      }
      double mono_kill = monotonic_s();
      auto t1 = Clock::now();
      for (const auto& d : dirs) write_text(d + "/cgroup.kill", "1");
      while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
      }
      result.kill_ms = ms_since(t1);
      if (!pids_out.empty()) {
        std::ofstream out(pids_out);
        char bounds[96];
        std::snprintf(bounds, sizeof bounds, "kill %.6f gone %.6f\n", mono_kill, monotonic_s());
        out << bounds;
        for (const auto& pid : pids) out << pid << "\n";
      }
      for (const auto& d : dirs) ::rmdir(d.c_str());
      ::rmdir(top.c_str());
    }
    (void)!::write(rep[1], &result, sizeof result);
    ::_exit(0);
  }
  ::close(rep[1]);
  KernelFloor got;
  if (::read(rep[0], &got, sizeof got) != sizeof got) got = {};
  ::close(rep[0]);
  ::waitpid(helper, nullptr, 0);
  return got;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned jobs = 1000, n_rounds = 1;
  bool with_floor = true, floor_only = false;
  std::string json_out;
  std::string state_parent = "/var/tmp";
  KillHooks hooks;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--jobs" && i + 1 < argc) {
      jobs = static_cast<unsigned>(std::atoi(argv[++i]));
    } else if (a == "--floor-only") {
      floor_only = true;
    } else if (a == "--before-kill" && i + 1 < argc) {
      hooks.before = argv[++i];
    } else if (a == "--kill-each") {
      hooks.kill_each = true;
    } else if (a == "--direct-kill") {
      hooks.direct_kill = true;
    } else if (a == "--hold-mntns") {
      hooks.hold_mntns = true;
    } else if (a == "--pids-out" && i + 1 < argc) {
      hooks.pids_out = argv[++i];
    } else if (a == "--after-kill" && i + 1 < argc) {
      hooks.after = argv[++i];
    } else if (a == "--no-floor") {
      with_floor = false;
    } else if (a == "--rounds" && i + 1 < argc) {
      n_rounds = static_cast<unsigned>(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (a == "--state-parent" && i + 1 < argc) {
      state_parent = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: scale_bench [--jobs N] [--rounds R] [--no-floor] [--json FILE] "
                   "[--state-parent DIR] "
                   "[--kill-each] [--direct-kill] [--hold-mntns] [--floor-only] [--pids-out FILE] "
                   "[--before-kill CMD] [--after-kill CMD]\n");
      return 2;
    }
  }
  if (jobs < 1 || jobs > 1016) die("--jobs must be 1..1016 (the policy's perSession bound)");
  if (floor_only) {
    KernelFloor f = kernel_floor(jobs, true, true, hooks.pids_out);
    std::printf(
        "kernel floor, %u x 2 sleeps in own pid+net+mnt+ipc+uts ns, a cgroup each: all running "
        "after %.0f ms, all reaped %.0f ms after cgroup.kill\n",
        jobs, f.start_ms, f.kill_ms);
    return 0;
  }
  struct rlimit nofile {};
  ::getrlimit(RLIMIT_NOFILE, &nofile);

  std::string tmpl = state_parent + "/cordon-scale.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) die("mkdtemp in " + state_parent + " failed");
  std::string work = tmpl.c_str(), dir = self_dir();
  std::string root = work + "/root";
  std::filesystem::create_directories(root);
  std::ofstream(work + "/policy.json")
      << "{\"allowedExecutables\": [\"/bin/sleep\", \"/usr/bin/sleep\"], \"cwdRoot\": "
      << nlohmann::json(root).dump() << ", \"concurrency\": {\"perSession\": " << jobs + 8
      << ", \"total\": " << jobs + 8 << "}}";
  cordon::EngineOptions eo;
  eo.state_dir = work + "/state";
  eo.policy_path = work + "/policy.json";
  eo.spawner_path = dir + "/cordon-spawner";
  eo.init_path = dir + "/cordon-init";
  eo.default_seccomp_profile = dir + "/seccomp/default.json";
  // A block of host uids of its own, so counting the sandboxes never sees anyone else's.
  eo.host_id_base = 0x7A000000u + static_cast<uint32_t>(::getpid() % 64) * 4096u;
  eo.host_id_count = jobs + 16;
  // Without the warm pool: its parked sandboxes (4, built after a settle) would count as
  // sandboxed processes that never exit, and in the kernel figure; 1000 concurrent starts
  // are about the unpooled spawn anyway.
  eo.warm_pool = false;
  auto opened = cordon::Engine::open(eo);
  if (!opened) die("engine: " + opened.error().message());
  auto& engine = **opened;
  {  // warm-up: seccomp compile, page cache
    auto s = engine.start("warm", {.argv = {"/bin/sleep", "0"}});
    if (!s) die("start: " + s.error().message());
    (void)engine.status("warm", s->task_id, std::chrono::seconds(30));
  }

  const auto [memcg_kib, memcg_1k_kib] = empty_memcg_kib(16);
  long rss_before = std::atol(proc_field("self", "status", "VmRSS:").c_str());
  std::vector<Round> rounds;
  for (unsigned r = 0; r < n_rounds; ++r) {
    rounds.push_back(run_round(engine, jobs, eo.host_id_base, eo.host_id_count, hooks));
    const Round& k = rounds.back();
    if (r == 0) {
      print_round_detail(k, jobs);
    }
  }
  long rss_after = rounds.front().rss_kib;
  const Round& first = rounds.front();
  double per_job_kib = first.per_job_kib(jobs);

  std::printf(
      "%u concurrent sandboxed `sleep 1000` jobs through one engine (own netns each), state "
      "under %s\n",
      jobs, state_parent.c_str());
  std::printf("  load average before / after          %s / %s\n", first.load_before.c_str(),
              rounds.back().load_after.c_str());
  std::printf("  all start() calls returned           %9.0f ms\n", first.started_ms);
  std::printf("  all %u sleeps running                %9.0f ms\n", jobs, first.all_running_ms);
  std::printf("  engine RSS                           %9.1f MiB (before the jobs %.1f MiB)\n",
              rss_after / 1024.0, rss_before / 1024.0);
  std::printf("  spawner RSS                          %9.1f MiB\n", first.spawner_rss_kib / 1024.0);
  std::printf("  engine fds                           %9zu (RLIMIT_NOFILE %llu)\n", first.fds,
              static_cast<unsigned long long>(nofile.rlim_cur));
  std::printf("  tasks per sandbox                    %9.2f (superblocks of its own: %zu)\n",
              static_cast<double>(first.tasks) / jobs, first.superblocks);
  std::printf(
      "  kernel memory per job                %9.0f KiB (Slab+KernelStack+PageTables+"
      "Percpu grew %ld MiB; %ld MiB back %0.f ms after the last job settled)\n",
      per_job_kib, first.grown_kib() / 1024, first.back_kib() / 1024, first.settle_ms);
  for (const auto& k : rounds) {
    if (k.back_kib() * 10 < k.grown_kib() * 8) {
      std::printf(
          "  WARNING: only %ld of %ld MiB came back after the kill: other work on the machine "
          "moved /proc/meminfo during this round; trust the slab diff, not the headline\n",
          k.back_kib() / 1024, k.grown_kib() / 1024);
    }
  }
  if (memcg_kib >= 0) {
    std::printf(
        "  an empty memory cgroup, for comparison  %9.0f KiB (slab objects; kmalloc-1k %.0f: the "
        "shrinker table, sized by the most superblocks this kernel ever had at once)\n",
        memcg_kib, memcg_1k_kib);
  }
  for (size_t r = 1; r < rounds.size(); ++r) {
    std::printf("  kernel memory per job, round %zu       %9.0f KiB (%ld MiB back after %.0f ms)\n",
                r + 1, rounds[r].per_job_kib(jobs), rounds[r].back_kib() / 1024,
                rounds[r].settle_ms);
  }
  std::printf("  kill all: %-28s %9.0f ms\n",
              hooks.direct_kill ? "cgroup.kill written for all"
              : hooks.kill_each ? "kill() returned for all"
                                : "kill_many() returned",
              first.kill_calls_ms);
  std::printf("  kill all: every sandboxed process exited %8.0f ms (pidfds)\n", first.gone_ms);
  if (first.mntns_release_ms >= 0) {
    std::printf("  kill all: held mount namespaces closed   %9.0f ms (after the exits)\n",
                first.mntns_release_ms);
  }
  std::printf("  kill all: no sandboxed process left     %9.0f ms (reaped: /proc shows none)\n",
              first.reaped_ms);
  std::printf("  kill all: every job settled             %9.0f ms\n", first.settled_ms);
  KernelFloor plain, ns, ns_own;
  if (with_floor) {
    plain = kernel_floor(jobs, false, false);
    ns = kernel_floor(jobs, true, false);
    ns_own = kernel_floor(jobs, true, true);
    std::printf(
        "kernel floor, no cordon: %u x, forked until all run, then killed with cgroup.kill until "
        "all are reaped\n",
        jobs);
    std::printf("                                                all running   all reaped\n");
    std::printf("  1 sleep each, one cgroup                     %9.0f ms %9.0f ms\n",
                plain.start_ms, plain.kill_ms);
    std::printf("  2 sleeps in own pid+net+mnt+ipc+uts ns, one cgroup %5.0f ms %9.0f ms\n",
                ns.start_ms, ns.kill_ms);
    std::printf("  the same, a cgroup each (%u cgroup.kill)    %9.0f ms %9.0f ms\n", jobs,
                ns_own.start_ms, ns_own.kill_ms);
  }
  double floor_plain = plain.kill_ms, floor_ns = ns.kill_ms, floor_ns_own = ns_own.kill_ms;
  if (!json_out.empty()) {
    std::string per_round;
    for (const auto& k : rounds) {
      per_round += (per_round.empty() ? "" : ", ") + std::to_string(k.per_job_kib(jobs));
    }
    char buf[2048];
    std::snprintf(buf, sizeof buf,
                  "{\"jobs\": %u, \"allStartedMs\": %.1f, \"allRunningMs\": %.1f, "
                  "\"engineRssKiB\": %ld, \"spawnerRssKiB\": %ld, \"engineFds\": %zu, "
                  "\"kernelKiBPerJob\": %.1f, \"kernelKiBPerJobRounds\": [%s], "
                  "\"kernelKiBBackAfterKill\": %ld, \"tasksPerSandbox\": %.2f, "
                  "\"superblocksPerSandbox\": %zu, \"killCallsMs\": %.1f, "
                  "\"killAllGoneMs\": %.1f, \"killAllReapedMs\": %.1f, \"killAllSettledMs\": %.1f, "
                  "\"floorKillPlainMs\": %.1f, \"floorKillNamespacesMs\": %.1f, "
                  "\"floorKillNamespacesOwnCgroupMs\": %.1f, "
                  "\"floorStartNamespacesOwnCgroupMs\": %.1f, \"loadBefore\": \"%s\", "
                  "\"stateParent\": %s, \"emptyMemcgKiB\": %.1f, "
                  "\"emptyMemcgKmalloc1kKiB\": %.1f}\n",
                  jobs, first.started_ms, first.all_running_ms, rss_after, first.spawner_rss_kib,
                  first.fds, per_job_kib, per_round.c_str(), first.back_kib(),
                  static_cast<double>(first.tasks) / jobs, first.superblocks, first.kill_calls_ms,
                  first.gone_ms, first.reaped_ms, first.settled_ms, floor_plain, floor_ns,
                  floor_ns_own, ns_own.start_ms, first.load_before.c_str(),
                  nlohmann::json(state_parent).dump().c_str(), memcg_kib, memcg_1k_kib);
    std::ofstream(json_out) << buf;
  }
  opened->reset();
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  return 0;
}
