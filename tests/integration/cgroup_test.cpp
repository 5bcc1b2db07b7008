#define BOOST_TEST_MODULE cgroup
#include "sandbox/cgroup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "base/strings.hpp"
#include "base/unique_fd.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;
using namespace cordon::sandbox;

namespace {

constexpr int kWaitMs = 20000;  // a bound for every wait, so a broken test fails, not hangs

template <class R>
std::string why(const R& r) {
  return r.has_value() ? std::string() : r.error().message();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  return read_small_file(path).value_or("<unreadable>");
}

std::string trimmed(const std::string& path) {
  std::string s = read_text(path);
  while (!s.empty() && s.back() == '\n') {
    s.pop_back();
  }
  return s;
}

struct Pipe {
  UniqueFd r, w;
  Pipe() {
    int fds[2];
    BOOST_REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r.reset(fds[0]);
    w.reset(fds[1]);
  }
};

struct Child {
  pid_t pid = -1;
  UniqueFd pidfd;
};

// clone3 with CLONE_PIDFD and, when cgroup_fd >= 0, CLONE_INTO_CGROUP: the child is born in
// the job cgroup, as cordon's spawner does it. The child runs fn() and _exits with its value.
template <class F>
Child spawn(int cgroup_fd, F fn) {
  int pidfd = -1;
  struct clone_args args {};
  args.flags = CLONE_PIDFD | (cgroup_fd >= 0 ? CLONE_INTO_CGROUP : 0);
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  args.cgroup = cgroup_fd >= 0 ? static_cast<uint64_t>(cgroup_fd) : 0;
  long pid = sys::clone3(&args);
  if (pid == 0) {
    ::_exit(fn());
  }
  BOOST_REQUIRE_MESSAGE(pid > 0, "clone3: " << std::strerror(errno));
  Child c;
  c.pid = static_cast<pid_t>(pid);
  c.pidfd.reset(pidfd);
  return c;
}

bool readable_within(int fd, int ms) {
  struct pollfd p {
    fd, POLLIN, 0
  };
  return ::poll(&p, 1, ms) == 1;
}

siginfo_t wait_exit(const Child& c) {
  BOOST_REQUIRE_MESSAGE(readable_within(c.pidfd.get(), kWaitMs), "child did not exit");
  siginfo_t info{};
  BOOST_REQUIRE(::waitid(P_PIDFD, static_cast<id_t>(c.pidfd.get()), &info, WEXITED) == 0);
  return info;
}

void read_byte(int fd) {
  BOOST_REQUIRE_MESSAGE(readable_within(fd, kWaitMs), "no byte from child");
  char b;
  BOOST_REQUIRE(::read(fd, &b, 1) == 1);
}

// The cgroup line of `pid` for a hierarchy ("0:" for v2, "memory" for v1).
std::string cgroup_of(pid_t pid, const std::string& which) {
  for (const std::string& line :
       split(read_text("/proc/" + std::to_string(pid) + "/cgroup"), '\n')) {
    auto parts = split(line, ':');
    if (parts.size() < 3) {
      continue;
    }
    bool v2 = which == "0:" && parts[0] == "0";
    bool v1 = which != "0:" && parts[1] == which;
    if (v2 || v1) {
      return parts[2];
    }
  }
  return "";
}

std::string replace_last(const std::string& path, const std::string& name) {
  return path.substr(0, path.rfind('/') + 1) + name;
}

// Real cgroups, under test-only parents "<own cgroup>/cordon-test-<pid>-<n>" instead of
// ".../cordon", so parallel runs never share a parent. Teardown removes whatever a failing
// test left, then the parents.
struct Host {
  CgroupLayout layout;
  std::vector<std::string> parents;

  Host() {
    static int counter = 0;
    auto real = detect_cgroup_layout();
    BOOST_TEST_REQUIRE(real.has_value(), why(real));
    layout = *real;
    std::string name =
        "cordon-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    for (std::string* p : {&layout.v2_parent, &layout.v1_memory_parent, &layout.v1_pids_parent,
                           &layout.v1_cpu_parent}) {
      if (p->empty()) {
        continue;
      }
      *p = replace_last(*p, name);
      if (std::find(parents.begin(), parents.end(), *p) == parents.end()) {
        parents.push_back(*p);
      }
    }
    auto ok = prepare_parents(layout);
    BOOST_TEST_REQUIRE(ok.has_value(), why(ok));
  }

  ~Host() {
    for (const std::string& parent : parents) {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
        if (e.is_directory(ec)) {
          auto left = JobCgroup::adopt({e.path().string()});
          if (left) {
            BOOST_TEST_WARN(false, "cleaning up leftover cgroup " << e.path());
            BOOST_TEST(left->destroy().has_value());
          }
        }
      }
      BOOST_TEST(::rmdir(parent.c_str()) == 0, "rmdir " << parent << ": " << std::strerror(errno));
    }
  }
};

struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cgroup_it.XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    BOOST_REQUIRE(made != nullptr);
    path = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

BOOST_FIXTURE_TEST_CASE(limits_placement_kill_and_destroy_on_real_cgroups, Host) {
  auto job = JobCgroup::create(layout, "limits", {64ULL << 20, 16, 0.5});
  BOOST_TEST_REQUIRE(job.has_value(), why(job));
  std::vector<std::string> paths = job->paths();
  BOOST_TEST_REQUIRE(paths.size() == (layout.mode == CgroupMode::kHybrid ? 4u : 1u));
  for (const std::string& p : paths) {
    BOOST_TEST(exists(p), p);
  }

  // The limits as the kernel reports them.
  if (layout.mode == CgroupMode::kHybrid) {
    std::string mem = layout.v1_memory_parent + "/limits";
    BOOST_TEST(trimmed(mem + "/memory.limit_in_bytes") == std::to_string(64ULL << 20));
    if (exists(mem + "/memory.memsw.limit_in_bytes")) {
      BOOST_TEST(trimmed(mem + "/memory.memsw.limit_in_bytes") == std::to_string(64ULL << 20));
    }
    BOOST_TEST(trimmed(layout.v1_pids_parent + "/limits/pids.max") == "16");
    BOOST_TEST(trimmed(layout.v1_cpu_parent + "/limits/cpu.cfs_period_us") == "100000");
    BOOST_TEST(trimmed(layout.v1_cpu_parent + "/limits/cpu.cfs_quota_us") == "50000");
  } else {
    std::string dir = layout.v2_parent + "/limits";
    BOOST_TEST(trimmed(dir + "/memory.max") == std::to_string(64ULL << 20));
    BOOST_TEST(trimmed(dir + "/pids.max") == "16");
    BOOST_TEST(trimmed(dir + "/cpu.max") == "50000 100000");
  }

  // A child born in the v2 job cgroup that burns some CPU, reports, then blocks on a pipe.
  Pipe ready, block;
  Child child = spawn(job->v2_dirfd(), [&] {
    volatile uint64_t x = 0;
    for (uint64_t i = 0; i < 50'000'000; ++i) {
      x = x + i;
    }
    char b = 'r';
    (void)!::write(ready.w.get(), &b, 1);
    (void)!::read(block.r.get(), &b, 1);
    return 0;
  });
  read_byte(ready.r.get());
  std::string suffix = "/" + layout.v2_parent.substr(layout.v2_parent.rfind('/') + 1) + "/limits";
  BOOST_TEST(cgroup_of(child.pid, "0:").ends_with(suffix), cgroup_of(child.pid, "0:"));
  auto placed = job->place_v1(child.pid);
  BOOST_TEST_REQUIRE(placed.has_value(), why(placed));
  if (layout.mode == CgroupMode::kHybrid) {
    for (const char* h : {"memory", "pids", "cpu"}) {
      BOOST_TEST(cgroup_of(child.pid, h).ends_with(suffix), h << ": " << cgroup_of(child.pid, h));
    }
  }
  auto populated = job->populated();
  BOOST_TEST_REQUIRE(populated.has_value(), why(populated));
  BOOST_TEST(*populated);
  auto usage = job->usage();
  BOOST_TEST_REQUIRE(usage.has_value(), why(usage));
  BOOST_TEST(usage->cpu_usec > 0u);
  BOOST_TEST(usage->oom_kills == 0u);
  BOOST_TEST(usage->pids_max_hits == 0u);

  auto killed = job->kill();
  BOOST_TEST_REQUIRE(killed.has_value(), why(killed));
  siginfo_t info = wait_exit(child);
  BOOST_TEST(info.si_code == CLD_KILLED);
  BOOST_TEST(info.si_status == SIGKILL);

  auto destroyed = job->destroy();
  BOOST_TEST_REQUIRE(destroyed.has_value(), why(destroyed));
  for (const std::string& p : paths) {
    BOOST_TEST(!exists(p), p);
  }
  BOOST_TEST(job->paths().empty());
}

BOOST_FIXTURE_TEST_CASE(memory_hog_is_oom_killed_and_counted, Host) {
  auto job = JobCgroup::create(layout, "oom", {32ULL << 20, 0, 0});
  BOOST_TEST_REQUIRE(job.has_value(), why(job));
  Pipe go;
  Child child = spawn(job->v2_dirfd(), [&] {
    char b;
    if (::read(go.r.get(), &b, 1) != 1) {
      return 2;
    }
    for (int i = 0; i < 512; ++i) {  // 512 MiB, each page touched
      char* p = static_cast<char*>(::malloc(1 << 20));
      if (p == nullptr) {
        return 3;
      }
      std::memset(p, i, 1 << 20);
      // Clang may elide a malloc whose memory is never read (it did, in the sanitizer
      // build: the hog allocated nothing and exited 0); the barrier makes the pages real.
      asm volatile("" : : "r"(p) : "memory");
    }
    return 0;
  });
  auto placed = job->place_v1(child.pid);  // before it allocates: v1 charges only new pages
  BOOST_TEST_REQUIRE(placed.has_value(), why(placed));
  BOOST_TEST_REQUIRE(::write(go.w.get(), "g", 1) == 1);
  siginfo_t info = wait_exit(child);
  BOOST_TEST(info.si_code == CLD_KILLED);
  BOOST_TEST(info.si_status == SIGKILL);
  auto usage = job->usage();
  BOOST_TEST_REQUIRE(usage.has_value(), why(usage));
  BOOST_TEST(usage->oom_kills >= 1u);
  BOOST_TEST(usage->peak_memory_bytes > (16ULL << 20));
  BOOST_TEST(usage->peak_memory_bytes <= (32ULL << 20));
  BOOST_TEST_REQUIRE(job->destroy().has_value());
}

BOOST_FIXTURE_TEST_CASE(fork_loop_stops_at_pids_max_and_is_counted, Host) {
  auto job = JobCgroup::create(layout, "pids", {0, 5, 0});
  BOOST_TEST_REQUIRE(job.has_value(), why(job));
  std::vector<std::string> paths = job->paths();
  Pipe go, hold;
  Child child = spawn(job->v2_dirfd(), [&] {
    char b;
    if (::read(go.r.get(), &b, 1) != 1) {
      return 100;
    }
    int forked = 0;
    for (; forked < 50; ++forked) {
      pid_t p = ::fork();
      if (p < 0) {
        return errno == EAGAIN ? forked : 101;
      }
      if (p == 0) {
        (void)!::read(hold.r.get(), &b, 1);  // stays until the cgroup is killed
        ::_exit(0);
      }
    }
    return forked;
  });
  auto placed = job->place_v1(child.pid);
  BOOST_TEST_REQUIRE(placed.has_value(), why(placed));
  BOOST_TEST_REQUIRE(::write(go.w.get(), "g", 1) == 1);
  siginfo_t info = wait_exit(child);
  BOOST_TEST(info.si_code == CLD_EXITED);
  BOOST_TEST(info.si_status == 4);  // itself + 4 forks = pids.max 5
  auto usage = job->usage();
  BOOST_TEST_REQUIRE(usage.has_value(), why(usage));
  BOOST_TEST(usage->pids_max_hits >= 1u);
  // The four grandchildren still live in the job; destroy must kill them to remove it.
  auto populated = job->populated();
  BOOST_TEST_REQUIRE(populated.has_value());
  BOOST_TEST(*populated);
  auto destroyed = job->destroy();
  BOOST_TEST_REQUIRE(destroyed.has_value(), why(destroyed));
  for (const std::string& p : paths) {
    BOOST_TEST(!exists(p), p);
  }
}

BOOST_FIXTURE_TEST_CASE(destructor_kills_waits_and_removes, Host) {
  Pipe block;
  Child child;
  std::vector<std::string> paths;
  {
    auto job = JobCgroup::create(layout, "raii", {});
    BOOST_TEST_REQUIRE(job.has_value(), why(job));
    paths = job->paths();
    child = spawn(job->v2_dirfd(), [&] {
      char b;
      (void)!::read(block.r.get(), &b, 1);
      return 0;
    });
    BOOST_TEST_REQUIRE(job->place_v1(child.pid).has_value());
    BOOST_TEST(!readable_within(child.pidfd.get(), 0));
  }
  // The destructor returned only once the cgroup was empty: the child is already dead.
  BOOST_TEST(readable_within(child.pidfd.get(), 0));
  siginfo_t info = wait_exit(child);
  BOOST_TEST(info.si_status == SIGKILL);
  for (const std::string& p : paths) {
    BOOST_TEST(!exists(p), p);
  }
}

BOOST_FIXTURE_TEST_CASE(sweep_kills_orphaned_job_of_a_dead_owner, Host) {
  TempDir tmp;
  auto records = CgroupRecords::open(tmp.path + "/records");
  BOOST_TEST_REQUIRE(records.has_value(), why(records));
  auto paths = JobCgroup::paths_for(layout, "orphan");
  BOOST_TEST_REQUIRE(paths.has_value());
  Pipe report, block, cat_in;

  // The owner: a cordon that records the job, creates its cgroup, starts the sandboxed
  // command (cat on a pipe we keep open) and is then SIGKILLed.
  Child owner = spawn(-1, [&] {
    auto lock = records->add("orphan", *paths);
    if (!lock) {
      return 10;
    }
    auto job = JobCgroup::create(layout, "orphan", {64ULL << 20, 16, 0});
    if (!job) {
      return 11;
    }
    // Until it execs, the command shares the lock's open file description (clone copies
    // fds), so the owner reports only after the exec closed the CLOEXEC pipe `execd`.
    int execd[2];
    if (::pipe2(execd, O_CLOEXEC) != 0) {
      return 15;
    }
    Child cmd = spawn(job->v2_dirfd(), [&] {
      ::dup2(cat_in.r.get(), 0);  // exec closes everything else, the record lock included
      ::execl("/bin/cat", "cat", static_cast<char*>(nullptr));
      return 127;
    });
    ::close(execd[1]);
    char e;
    if (::read(execd[0], &e, 1) != 0) {
      return 16;
    }
    if (!job->place_v1(cmd.pid)) {
      return 12;
    }
    if (::write(report.w.get(), &cmd.pid, sizeof cmd.pid) != sizeof cmd.pid) {
      return 13;
    }
    char b;
    (void)!::read(block.r.get(), &b, 1);
    return 14;
  });
  BOOST_TEST_REQUIRE(readable_within(report.r.get(), kWaitMs));
  pid_t cmd_pid = -1;
  BOOST_TEST_REQUIRE(::read(report.r.get(), &cmd_pid, sizeof cmd_pid) == sizeof cmd_pid);
  UniqueFd cmd(sys::pidfd_open(cmd_pid, 0));
  BOOST_TEST_REQUIRE(cmd.valid());
  BOOST_TEST(cgroup_of(cmd_pid, "0:").ends_with("/orphan"));

  BOOST_TEST_REQUIRE(sys::pidfd_send_signal(owner.pidfd.get(), SIGKILL, nullptr, 0) == 0);
  siginfo_t info = wait_exit(owner);
  BOOST_TEST(info.si_status == SIGKILL);
  BOOST_TEST(!readable_within(cmd.get(), 0));  // the command outlived its owner
  std::string record = tmp.path + "/records/orphan.cgroups";
  BOOST_TEST(exists(record));

  auto swept = records->sweep();
  BOOST_TEST_REQUIRE(swept.has_value(), why(swept));
  BOOST_TEST(*swept == 1u);
  BOOST_TEST(readable_within(cmd.get(), 0));  // sweep waited until the cgroup was empty
  for (const std::string& p : *paths) {
    BOOST_TEST(!exists(p), p);
  }
  BOOST_TEST(!exists(record));
}

BOOST_FIXTURE_TEST_CASE(sweep_leaves_record_of_a_live_owner_alone, Host) {
  TempDir tmp;
  auto records = CgroupRecords::open(tmp.path + "/records");
  BOOST_TEST_REQUIRE(records.has_value(), why(records));
  auto paths = JobCgroup::paths_for(layout, "alive");
  BOOST_TEST_REQUIRE(paths.has_value());
  Pipe ready, control;
  Child owner = spawn(-1, [&] {
    control.w.reset();  // so our own copy does not keep the pipe open
    auto lock = records->add("alive", *paths);
    if (!lock) {
      return 10;
    }
    auto job = JobCgroup::create(layout, "alive", {});
    if (!job) {
      return 11;
    }
    (void)!::write(ready.w.get(), "r", 1);
    char b;
    (void)!::read(control.r.get(), &b, 1);  // EOF: the test is done looking; clean exit
    if (!job->destroy()) {
      return 12;
    }
    if (!lock->remove()) {
      return 13;
    }
    return 0;
  });
  read_byte(ready.r.get());
  std::string record = tmp.path + "/records/alive.cgroups";
  auto swept = records->sweep();
  BOOST_TEST_REQUIRE(swept.has_value(), why(swept));
  BOOST_TEST(*swept == 0u);
  BOOST_TEST(exists(record));
  for (const std::string& p : *paths) {
    BOOST_TEST(exists(p), p);
  }

  control.w.reset();
  siginfo_t info = wait_exit(owner);
  BOOST_TEST(info.si_code == CLD_EXITED);
  BOOST_TEST(info.si_status == 0);
  BOOST_TEST(!exists(record));
  for (const std::string& p : *paths) {
    BOOST_TEST(!exists(p), p);
  }
}

// The spawner of a killed engine may still be finishing a spawn into the cgroups the next
// engine's sweep destroys: the sandbox is born into the v2 cgroup (CLONE_INTO_CGROUP) and moves
// itself into the v1 ones, after destroy() saw them empty. A feeder thread does that in a loop
// until the cgroups are gone (or 2000 processes, or 3 s); destroy() must still remove them all.
// It gave up with EBUSY from rmdir, failing before the fix (the sweep then left the record and
// the cgroups to the next engine's open) — in about one round in five, so ten rounds.
BOOST_FIXTURE_TEST_CASE(destroy_outlasts_processes_that_arrive_after_it_saw_the_cgroup_empty,
                        Host) {
  int arrived_during_destroy = 0;
  for (int round = 0; round < 10; ++round) {
    auto job = JobCgroup::create(layout, "latecomers-" + std::to_string(round), {});
    BOOST_TEST_REQUIRE(job.has_value(), why(job));
    std::vector<std::string> paths = job->paths();
    std::vector<UniqueFd> v1_procs;
    for (int fd : job->v1_dirfds()) {
      v1_procs.emplace_back(::openat(fd, "cgroup.procs", O_WRONLY | O_CLOEXEC));
      BOOST_TEST_REQUIRE(v1_procs.back().valid());
    }
    UniqueFd v2(::dup(job->v2_dirfd()));  // the feeder's own: destroy() closes the job's
    BOOST_TEST_REQUIRE(v2.valid());
    Pipe block;
    std::atomic<int> born{0};
    std::atomic<int> clone_errno{0};
    std::vector<pid_t> kids;
    std::thread feeder([&] {
      const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      while (std::chrono::steady_clock::now() < stop && born < 2000) {
        struct clone_args args {};
        args.flags = CLONE_INTO_CGROUP;
        args.exit_signal = SIGCHLD;
        args.cgroup = static_cast<uint64_t>(v2.get());
        long pid = sys::clone3(&args);
        if (pid == 0) {
          for (const UniqueFd& procs : v1_procs) {
            if (::write(procs.get(), "0", 1) != 1) {
              ::_exit(1);  // the v1 cgroup is gone
            }
          }
          char b;
          (void)!::read(block.r.get(), &b, 1);
          ::_exit(0);
        }
        if (pid < 0) {
          clone_errno = errno;  // the v2 cgroup is gone
          return;
        }
        kids.push_back(static_cast<pid_t>(pid));
        ++born;
      }
    });
    // Destroy while the feeder runs, once a few sandboxes are in.
    for (int i = 0; i < kWaitMs && born < 20; ++i) {
      ::usleep(1000);
    }
    const int before_destroy = born;
    auto d = job->destroy();
    const int during_destroy = born - before_destroy;
    feeder.join();
    block.w.reset();
    for (pid_t pid : kids) {
      ::waitpid(pid, nullptr, 0);
    }
    BOOST_TEST_REQUIRE(born >= 20);
    BOOST_TEST(d.has_value(), "round " << round << ": " << why(d));
    // The race ran (summed over the rounds, below): processes arrived while destroy() worked.
    // Whether the feeder then saw the v2 cgroup go (a clone3 error) or stopped at its cap
    // first is the machine's speed (session 37: the cap came first in 2–6 rounds of 10 on
    // this host, and a check that it never did failed with nothing wrong).
    arrived_during_destroy += during_destroy;
    BOOST_TEST_MESSAGE("round " << round << ": " << during_destroy
                                << " arrived during destroy(); the feeder "
                                << (clone_errno != 0 ? "saw the v2 cgroup go" : "stopped first"));
    for (const std::string& p : paths) {
      BOOST_TEST(!exists(p), p);
    }
    if (!d.has_value()) {
      break;  // the fixture removes what is left
    }
  }
  BOOST_TEST(arrived_during_destroy > 0, "no process arrived while destroy() worked");
}
