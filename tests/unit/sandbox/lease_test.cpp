#define BOOST_TEST_MODULE sandbox_lease
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <linux/nsfs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/userns.hpp"

using namespace cordon;
using namespace cordon::sandbox;
namespace fs = std::filesystem;

namespace {

// A lease dir of the test's own (under a fresh temp dir) and a block of ids nobody else uses.
struct LeaseDir {
  std::string base, dir;
  LeaseDir() {
    char tmpl[] = "/tmp/cordon-lease.XXXXXX";
    BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
    base = tmpl;
    dir = base + "/uids";
  }
  ~LeaseDir() {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
  size_t files() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      (void)e;
      ++n;
    }
    return n;
  }
};

constexpr uid_t kBase = 0x7B000000;

}  // namespace

BOOST_AUTO_TEST_CASE(leases_are_distinct_until_the_range_is_used_up) {
  LeaseDir d;
  auto a = HostIdLease::acquire(d.dir, kBase, 2);
  auto b = HostIdLease::acquire(d.dir, kBase, 2);
  BOOST_REQUIRE(a.has_value());
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST(a->id() != b->id());
  BOOST_TEST((a->id() == kBase || a->id() == kBase + 1));
  auto c = HostIdLease::acquire(d.dir, kBase, 2);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST(c.error().message().find("all 2 ids in use") != std::string::npos,
             c.error().message());
  // The dir was made private.
  struct stat st {};
  BOOST_REQUIRE(::stat(d.dir.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0700u);
}

BOOST_AUTO_TEST_CASE(a_released_lease_removes_its_file_and_frees_its_id) {
  LeaseDir d;
  uid_t id = 0;
  {
    auto a = HostIdLease::acquire(d.dir, kBase, 1);
    BOOST_REQUIRE(a.has_value());
    id = a->id();
    BOOST_TEST(fs::exists(d.dir + "/" + std::to_string(id)));
    BOOST_TEST(d.files() == 1U);
    // Moved, and the source destroyed first: one lease, still held, its file still there.
    std::optional<HostIdLease> moved;
    {
      std::optional<HostIdLease> source(std::move(*a));
      moved.emplace(std::move(*source));
    }
    BOOST_TEST(fs::exists(d.dir + "/" + std::to_string(id)));
    BOOST_TEST(!HostIdLease::acquire(d.dir, kBase, 1).has_value());
    // Move-assigned over: the lease it held is released first (its file goes), the moved one
    // stays held.
    auto other = HostIdLease::acquire(d.dir, kBase + 1, 1);
    BOOST_REQUIRE(other.has_value());
    BOOST_TEST(fs::exists(d.dir + "/" + std::to_string(kBase + 1)));
    *other = std::move(*moved);
    BOOST_TEST(!fs::exists(d.dir + "/" + std::to_string(kBase + 1)));
    BOOST_TEST(other->id() == id);
    BOOST_TEST(!HostIdLease::acquire(d.dir, kBase, 1).has_value());
    moved.reset();
    BOOST_TEST(!HostIdLease::acquire(d.dir, kBase, 1).has_value());  // `other` holds it
  }
  BOOST_TEST(d.files() == 0U);  // as many files as leases held: none
  auto again = HostIdLease::acquire(d.dir, kBase, 1);
  BOOST_REQUIRE(again.has_value());
  BOOST_TEST(again->id() == id);
}

BOOST_AUTO_TEST_CASE(a_dead_holders_file_is_leased_again) {
  LeaseDir d;
  {
    auto a = HostIdLease::acquire(d.dir, kBase, 1);  // makes the dir
    BOOST_REQUIRE(a.has_value());
  }
  // A holder that died without releasing: its file stays, its flock went with it.
  pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    int fd = ::open((d.dir + "/" + std::to_string(kBase)).c_str(), O_RDWR | O_CREAT, 0600);
    ::_exit(fd >= 0 && ::flock(fd, LOCK_EX) == 0 ? 0 : 1);
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  BOOST_REQUIRE(d.files() == 1U);
  auto b = HostIdLease::acquire(d.dir, kBase, 1);
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST(b->id() == kBase);
}

BOOST_AUTO_TEST_CASE(a_lock_held_elsewhere_keeps_its_id) {
  LeaseDir d;
  {
    auto a = HostIdLease::acquire(d.dir, kBase, 1);
    BOOST_REQUIRE(a.has_value());
  }
  // Another process (another cordon) holds the id's lock.
  int fd = ::open((d.dir + "/" + std::to_string(kBase)).c_str(), O_RDWR | O_CREAT, 0600);
  BOOST_REQUIRE(fd >= 0);
  int ready[2];
  BOOST_REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::close(ready[0]);
    int own = ::open((d.dir + "/" + std::to_string(kBase)).c_str(), O_RDWR);
    if (own < 0 || ::flock(own, LOCK_EX) != 0) ::_exit(1);
    (void)::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c;
  BOOST_REQUIRE(::read(ready[0], &c, 1) == 1);
  BOOST_TEST(!HostIdLease::acquire(d.dir, kBase, 1).has_value());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(fd);
  ::close(ready[0]);
  BOOST_TEST(HostIdLease::acquire(d.dir, kBase, 1).has_value());
}

BOOST_AUTO_TEST_CASE(a_lease_dir_others_can_write_is_refused) {
  LeaseDir d;
  BOOST_REQUIRE(::mkdir(d.dir.c_str(), 0700) == 0);
  BOOST_REQUIRE(::chmod(d.dir.c_str(), 0777) == 0);
  auto a = HostIdLease::acquire(d.dir, kBase, 1);
  BOOST_REQUIRE(!a.has_value());
  BOOST_TEST(a.error().message().find("writable by no one else") != std::string::npos,
             a.error().message());
}

// The parent too: whoever can write it can move the lease dir away, and the next cordon would
// make a fresh one and lease ids still in use. And neither may be a symlink.
BOOST_AUTO_TEST_CASE(a_lease_dir_under_a_parent_others_can_write_or_a_link_is_refused) {
  LeaseDir d;
  BOOST_REQUIRE(::chmod(d.base.c_str(), 0777) == 0);
  auto a = HostIdLease::acquire(d.dir, kBase, 1);
  BOOST_REQUIRE(!a.has_value());
  BOOST_TEST(a.error().message().find("`" + d.base + "` must be owned by uid") != std::string::npos,
             a.error().message());
  BOOST_REQUIRE(::chmod(d.base.c_str(), 0700) == 0);
  // The lease dir a symlink to a private dir of ours: still refused.
  BOOST_REQUIRE(::mkdir((d.base + "/real").c_str(), 0700) == 0);
  BOOST_REQUIRE(::symlink("real", d.dir.c_str()) == 0);
  auto b = HostIdLease::acquire(d.dir, kBase, 1);
  BOOST_REQUIRE(!b.has_value());
  BOOST_TEST(b.error().message().find("open `" + d.dir + "`") != std::string::npos,
             b.error().message());
  // The parent a symlink to a private dir of ours: refused too.
  const std::string linked_parent = d.base + "/via-link";
  BOOST_REQUIRE(::mkdir((d.base + "/real-parent").c_str(), 0700) == 0);
  BOOST_REQUIRE(::symlink("real-parent", linked_parent.c_str()) == 0);
  auto c = HostIdLease::acquire(linked_parent + "/uids", kBase, 1);
  BOOST_REQUIRE(!c.has_value());
  BOOST_TEST(c.error().message().find("open `" + linked_parent + "`") != std::string::npos,
             c.error().message());
  BOOST_TEST(!fs::exists(d.base + "/real-parent/uids"));
}

// The release-and-reacquire race, for real: two processes take and give back the one id of a
// range as fast as they can; each marks its turn with a file only one may create. An acquirer
// that locked a file its releaser had just removed (opened before the unlink, locked after)
// would hold the id alongside whoever created the next file; the marker then exists twice.
BOOST_AUTO_TEST_CASE(one_id_is_never_held_twice_under_contention) {
  LeaseDir d;
  { BOOST_REQUIRE(HostIdLease::acquire(d.dir, kBase, 1).has_value()); }  // makes the dir
  const std::string marker = d.base + "/inside";
  std::vector<pid_t> kids;
  for (int k = 0; k < 2; ++k) {
    pid_t child = ::fork();
    BOOST_REQUIRE(child >= 0);
    if (child == 0) {
      int held = 0;
      for (int i = 0; i < 3000; ++i) {
        auto lease = HostIdLease::acquire(d.dir, kBase, 1);
        if (!lease) {
          continue;  // the other one holds it
        }
        int m = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (m < 0) {
          ::_exit(2);  // both inside: one id held twice
        }
        ::close(m);
        ++held;
        if (::unlink(marker.c_str()) != 0) {
          ::_exit(3);
        }
      }
      ::_exit(held > 0 ? 0 : 4);
    }
    kids.push_back(child);
  }
  for (pid_t child : kids) {
    int status = 0;
    BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0),
               "child exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
}

BOOST_AUTO_TEST_CASE(a_sweep_removes_only_the_files_no_one_holds) {
  LeaseDir d;
  auto held = HostIdLease::acquire(d.dir, kBase, 1);
  BOOST_REQUIRE(held.has_value());
  // Left by dead holders: files no one has locked.
  for (uid_t id : {kBase + 5, kBase + 6}) {
    int fd = ::open((d.dir + "/" + std::to_string(id)).c_str(), O_RDWR | O_CREAT, 0600);
    BOOST_REQUIRE(fd >= 0);
    ::close(fd);
  }
  // Not a lease file: left alone.
  int other = ::open((d.dir + "/README").c_str(), O_RDWR | O_CREAT, 0600);
  BOOST_REQUIRE(other >= 0);
  ::close(other);
  auto swept = HostIdLease::sweep(d.dir);
  BOOST_REQUIRE(swept.has_value());
  BOOST_TEST(*swept == 2U);
  BOOST_TEST(fs::exists(d.dir + "/" + std::to_string(held->id())));
  BOOST_TEST(!fs::exists(d.dir + "/" + std::to_string(kBase + 5)));
  BOOST_TEST(fs::exists(d.dir + "/README"));
  // The held lease is still exclusive after the sweep.
  BOOST_TEST(!HostIdLease::acquire(d.dir, kBase, 1).has_value());
}

// The idmap user namespace (made for every sandbox's idmapped mounts) maps exactly the ids
// asked, and its maker leaves nothing behind: no child (not even a zombie), no descriptor,
// and the caller's signal mask as it was; also when writing the maps fails.
BOOST_AUTO_TEST_CASE(an_idmap_user_namespace_maps_the_ids_asked_and_leaves_nothing_behind) {
  BOOST_REQUIRE_MESSAGE(::geteuid() == 0, "needs root (the maps name host ids)");
  auto open_fds = [] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      ++n;
    }
    return n;
  };
  auto no_child_left = [] {
    siginfo_t info{};
    int r = ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG);
    int err = errno;
    return r == -1 && err == ECHILD;
  };
  BOOST_REQUIRE(no_child_left());  // nothing of an earlier test's
  const size_t fds_before = open_fds();
  sigset_t usr1, before, after;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  BOOST_REQUIRE(::pthread_sigmask(SIG_BLOCK, &usr1, nullptr) == 0);
  BOOST_REQUIRE(::pthread_sigmask(SIG_BLOCK, nullptr, &before) == 0);
  auto ns = make_idmap_userns(1000, 1001, kBase + 7, kBase + 8);
  BOOST_REQUIRE(::pthread_sigmask(SIG_BLOCK, nullptr, &after) == 0);
  BOOST_REQUIRE_MESSAGE(ns.has_value(), (ns ? std::string() : ns.error().message()));
  for (int sig = 1; sig < NSIG; ++sig) {
    BOOST_TEST(sigismember(&before, sig) == sigismember(&after, sig), "signal " << sig);
  }
  BOOST_TEST(no_child_left());
  BOOST_TEST(open_fds() == fds_before + 1);  // the namespace's, and nothing else

  // A process that joins the namespace sees the maps written.
  int ready[2], done[2];
  BOOST_REQUIRE(::pipe(ready) == 0 && ::pipe(done) == 0);
  pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    ::close(done[1]);  // or the read below never sees the parent's close
    char c = ::setns(ns->get(), CLONE_NEWUSER) == 0 ? 'y' : 'n';
    (void)::write(ready[1], &c, 1);
    (void)::read(done[0], &c, 1);
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(done[0]);
  char c = 0;
  bool joined = ::read(ready[0], &c, 1) == 1 && c == 'y';
  auto read_map = [&](const char* name) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/" + name);
    std::string inside, outside, count;
    in >> inside >> outside >> count;
    return inside + " " + outside + " " + count;
  };
  const std::string uid_map = read_map("uid_map"), gid_map = read_map("gid_map");
  ::close(done[1]);
  int st = 0;
  BOOST_TEST(::waitpid(pid, &st, 0) == pid);
  ::close(ready[0]);
  BOOST_REQUIRE(joined);
  BOOST_TEST(uid_map == "1000 " + std::to_string(kBase + 7) + " 1");
  BOOST_TEST(gid_map == "1001 " + std::to_string(kBase + 8) + " 1");
  ns->reset();

  // Maps the kernel refuses (a host id that cannot be mapped): an error, and again nothing left.
  auto refused = make_idmap_userns(1000, 1000, static_cast<uid_t>(-1), static_cast<gid_t>(-1));
  BOOST_TEST(!refused.has_value());
  BOOST_TEST(no_child_left());
  BOOST_TEST(open_fds() == fds_before);
  ::pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
}

// Makers on several threads at once: each gets its namespace, owned by its own host id (made
// with that id as the effective one: see EffectiveIdSwitch), and each thread is root again after.
BOOST_AUTO_TEST_CASE(idmap_namespaces_made_side_by_side_are_owned_by_their_host_ids) {
  BOOST_REQUIRE_MESSAGE(::geteuid() == 0, "needs root (the maps name host ids)");
  std::atomic<int> made{0}, failed{0}, wrong_owner{0}, not_root_after{0};
  std::vector<std::thread> makers;
  for (int t = 0; t < 3; ++t) {
    makers.emplace_back([&, t] {
      const uid_t host = kBase + 20 + static_cast<uid_t>(t);
      for (int i = 0; i < 100; ++i) {
        auto ns = make_idmap_userns(1000, 1000, host, host);
        if (!ns) {
          ++failed;
          continue;
        }
        ++made;
        uid_t owner = 0;
        if (::ioctl(ns->get(), NS_GET_OWNER_UID, &owner) != 0 || owner != host) {
          ++wrong_owner;
        }
        if (::geteuid() != 0 || ::getegid() != 0) {
          ++not_root_after;
        }
      }
    });
  }
  for (auto& m : makers) {
    m.join();
  }
  BOOST_TEST(made.load() == 300);
  BOOST_TEST(failed.load() == 0);
  BOOST_TEST(wrong_owner.load() == 0);
  BOOST_TEST(not_root_after.load() == 0);
  siginfo_t info{};
  BOOST_TEST(::waitid(P_ALL, 0, &info, WEXITED | WNOHANG) == -1);
}
