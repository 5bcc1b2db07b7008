#define BOOST_TEST_MODULE policy_host_paths
#include <boost/test/unit_test.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>

#include "base/strings.hpp"
#include "policy/host_paths.hpp"

using cordon::policy::HostPathGuard;
using cordon::policy::resolve_existing_part;

namespace {

HostPathGuard guard() {
  char tmpl[] = "/tmp/cordon-passwd.XXXXXX";
  int fd = ::mkstemp(tmpl);
  std::ofstream(tmpl) << "root:x:0:0:root:/root:/bin/bash\n"
                         "alice:x:1000:1000::/home/alice:/bin/bash\n"
                         "svc:x:998:998::/nonexistent:/usr/sbin/nologin\n";
  auto g = HostPathGuard::from_system({"/var/lib/cordon", "/opt/cordon/bin/cordon"}, tmpl);
  ::close(fd);
  ::unlink(tmpl);
  return g;
}

}  // namespace

BOOST_AUTO_TEST_CASE(refuses_system_directories_themselves) {
  auto g = guard();
  for (const char* p : {"/", "/etc", "/usr", "/proc", "/sys", "/dev", "/run", "/var", "/tmp",
                        "/var/tmp", "/dev/shm"}) {
    auto r = g.check(p, "--root");
    BOOST_TEST(!r.has_value(), p);
    if (!r) {
      BOOST_TEST(r.error().message().find("system directory") != std::string::npos);
    }
  }
}

BOOST_AUTO_TEST_CASE(allows_project_directories_below_them) {
  auto g = guard();
  BOOST_TEST(g.check("/tmp/project", "--root").has_value());
  BOOST_TEST(g.check("/home/alice/src/app", "--root").has_value());
  BOOST_TEST(g.check("/var/tmp/build-1", "--ro").has_value());
}

BOOST_AUTO_TEST_CASE(refuses_a_home_directory_root) {
  auto g = guard();
  auto r = g.check("/home/alice", "--root");
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("whole home directory") != std::string::npos);
  BOOST_TEST(!g.check("/root", "--ro").has_value());
}

BOOST_AUTO_TEST_CASE(refuses_folders_containing_or_inside_cordons_files) {
  auto g = guard();
  auto contains = g.check("/opt/cordon", "--root");
  BOOST_REQUIRE(!contains.has_value());
  BOOST_TEST(contains.error().message().find("contains cordon's own") != std::string::npos);
  auto inside = g.check("/var/lib/cordon/jobs", "--ro");
  BOOST_REQUIRE(!inside.has_value());
  BOOST_TEST(inside.error().message().find("lies inside cordon's own") != std::string::npos);
  // A sibling that only shares a prefix is fine.
  BOOST_TEST(g.check("/var/lib/cordon-other", "--root").has_value());
}

BOOST_AUTO_TEST_CASE(names_the_option_in_the_refusal) {
  auto g = guard();
  auto r = g.check("/etc", "--ro");
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().rfind("--ro `/etc`", 0) == 0);
}

// Failure fixed (a review, session 11): paths beneath /etc and /usr were accepted, so a root
// there became writable (files landed owned by root) and a --ro bind uncovered a masked file.
BOOST_AUTO_TEST_CASE(refuses_paths_inside_system_trees_but_not_source_places) {
  auto g = guard();
  for (const char* p : {"/etc/cron.d", "/etc/systemd/system", "/etc/security", "/usr/local/bin",
                        "/usr/lib/systemd/system", "/boot/grub", "/lib/modules", "/sys/fs/cgroup",
                        "/proc/1", "/dev/disk"}) {
    for (const char* what : {"--root", "--ro"}) {
      auto r = g.check(p, what);
      BOOST_TEST(!r.has_value(), what << " " << p);
      if (!r) {
        BOOST_TEST(
            r.error().message().find("lies inside the host's system tree") != std::string::npos,
            r.error().message());
      }
    }
  }
  for (const char* p : {"/usr/src/linux", "/usr/local/src/app", "/dev/shm/build", "/etcetera/x",
                        "/usrdata/project"}) {
    BOOST_TEST(g.check(p, "--root").has_value(), p);
  }
}

// Failure fixed (a review, session 12): `--root /run/cordon` was accepted, and its command
// could remove the host-id leases of every running sandbox (two sandboxes then shared a uid).
BOOST_AUTO_TEST_CASE(refuses_cordons_runtime_directory_and_what_is_in_it) {
  auto g = guard();
  for (const char* p : {"/run/cordon", "/run/cordon/uids", "/run/cordon/uids/x", "/run/cordon/s"}) {
    for (const char* what : {"--root", "--ro"}) {
      auto r = g.check(p, what);
      BOOST_TEST(!r.has_value(), what << " " << p);
      if (!r) {
        BOOST_TEST(r.error().message().find("cordon's own `/run/cordon`") != std::string::npos,
                   r.error().message());
      }
    }
  }
  BOOST_TEST(g.check("/run/cordon-builds/app", "--root").has_value());
}

// A scratch tree with symlinks in it, removed at the end.
struct LinkedTree {
  std::string base;
  LinkedTree() {
    char tmpl[] = "/tmp/cordon-host-paths.XXXXXX";
    BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
    base = tmpl;
  }
  ~LinkedTree() { std::filesystem::remove_all(base); }
};

BOOST_AUTO_TEST_CASE(resolves_the_existing_part_of_a_path_through_its_symlinks) {
  LinkedTree t;
  BOOST_REQUIRE(std::filesystem::create_directories(t.base + "/real/a"));
  BOOST_REQUIRE(::symlink((t.base + "/real").c_str(), (t.base + "/link").c_str()) == 0);
  BOOST_TEST(resolve_existing_part(t.base + "/link/a") == t.base + "/real/a");
  BOOST_TEST(resolve_existing_part(t.base + "/link/a/not/yet") == t.base + "/real/a/not/yet");
  BOOST_TEST(resolve_existing_part(t.base + "/real/a") == t.base + "/real/a");
  BOOST_TEST(resolve_existing_part("/") == "/");
  BOOST_TEST(resolve_existing_part("/cordon-test-no-such-dir/x") == "/cordon-test-no-such-dir/x");
  // What the kernel (and realpath) makes of chains, ".." in a target, links to files and loops.
  BOOST_REQUIRE(std::filesystem::create_directories(t.base + "/real/b/c"));
  BOOST_REQUIRE(::symlink("../b", (t.base + "/real/a/up").c_str()) == 0);
  BOOST_REQUIRE(::symlink((t.base + "/link/a/up").c_str(), (t.base + "/chain").c_str()) == 0);
  BOOST_REQUIRE(::symlink("loop2", (t.base + "/loop1").c_str()) == 0);
  BOOST_REQUIRE(::symlink("loop1", (t.base + "/loop2").c_str()) == 0);
  std::ofstream(t.base + "/real/file") << "x";
  BOOST_REQUIRE(::symlink("real/file", (t.base + "/to-file").c_str()) == 0);
  for (const std::string& p :
       {t.base + "/link/a/up/c", t.base + "/chain/c", t.base + "/chain", t.base + "/to-file",
        t.base + "/link/a/up/../b/c", t.base + "/link/./a//up/c"}) {
    char real[PATH_MAX];
    BOOST_REQUIRE_MESSAGE(::realpath(p.c_str(), real) != nullptr, p);
    BOOST_TEST(resolve_existing_part(p) == std::string(real), p);
  }
  BOOST_TEST(resolve_existing_part(t.base + "/chain/c/new/x") == t.base + "/real/b/c/new/x");
  BOOST_TEST(resolve_existing_part(t.base + "/to-file/x") == t.base + "/real/file/x");
  // A loop ends (ELOOP for the kernel): the path stays where the loop is, nothing followed on.
  const std::string looped = resolve_existing_part(t.base + "/loop1/x");
  BOOST_TEST(looped.ends_with("/x"), looped);
  BOOST_TEST(looped.starts_with(t.base + "/loop"), looped);
}

// Failure fixed (a review, session 29): the guard compared the resolved root with cordon's
// paths as given. A state dir given as a symlink into the project passed, its job rewrote the
// cached seccomp programs, and the next job planted a setuid-root file on the host. The same
// for a home directory reached through a link.
BOOST_AUTO_TEST_CASE(guards_cordons_paths_and_home_dirs_where_they_resolve) {
  LinkedTree t;
  BOOST_REQUIRE(std::filesystem::create_directories(t.base + "/proj/.state"));
  BOOST_REQUIRE(std::filesystem::create_directories(t.base + "/homes-real/alice"));
  BOOST_REQUIRE(::symlink((t.base + "/proj/.state").c_str(), (t.base + "/state").c_str()) == 0);
  BOOST_REQUIRE(::symlink((t.base + "/homes-real").c_str(), (t.base + "/homes").c_str()) == 0);
  const std::string passwd = t.base + "/passwd";
  std::ofstream(passwd) << "alice:x:1000:1000::" << t.base << "/homes/alice:/bin/bash\n";
  // A state dir not made yet, behind a link: protected where it will be.
  BOOST_REQUIRE(std::filesystem::create_directories(t.base + "/proj/later"));
  BOOST_REQUIRE(::symlink((t.base + "/proj/later").c_str(), (t.base + "/later").c_str()) == 0);
  auto g = HostPathGuard::from_system({t.base + "/state", t.base + "/later/state"}, passwd);
  auto r = g.check(t.base + "/proj", "--root");
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("contains cordon's own `" + t.base + "/proj/.state`") !=
                 std::string::npos,
             r.error().message());
  auto later = g.check(t.base + "/proj/later", "--root");
  BOOST_REQUIRE(!later.has_value());
  BOOST_TEST(later.error().message().find("/proj/later/state`") != std::string::npos,
             later.error().message());
  auto home = g.check(t.base + "/homes-real/alice", "--root");
  BOOST_REQUIRE(!home.has_value());
  BOOST_TEST(home.error().message().find("whole home directory") != std::string::npos);
  // The control: what lies beside them is fine.
  BOOST_TEST(g.check(t.base + "/homes-real/alice/src", "--root").has_value());
  BOOST_TEST(g.check(t.base + "/elsewhere", "--root").has_value());
}

// Found by a review (session 29): `--root /var/lib/dpkg/info` made dpkg's maintainer scripts
// writable by the job. The well-known places the host runs as root from are refused beneath.
BOOST_AUTO_TEST_CASE(refuses_paths_inside_what_the_host_runs_as_root) {
  auto g = guard();
  for (const char* p : {"/var/lib/dpkg/info", "/var/lib/apt/lists", "/var/spool/cron/crontabs",
                        "/var/lib/systemd/linger", "/run/systemd/system", "/var/lib/docker",
                        "/run/docker.sock", "/run/dbus"}) {
    for (const char* what : {"--root", "--ro"}) {
      auto r = g.check(p, what);
      BOOST_TEST(!r.has_value(), what << " " << p);
      if (!r) {
        BOOST_TEST(
            r.error().message().find("holds what the host runs as root") != std::string::npos,
            r.error().message());
      }
    }
  }
  for (const char* p : {"/var/lib/jenkins/workspace/app", "/var/lib/gitlab-runner/builds/x",
                        "/run/user/1000/build", "/var/lib/dpkg-builds"}) {
    BOOST_TEST(g.check(p, "--root").has_value(), p);
  }
}

// Found by a review (session 29): a root that *holds* a tree the host runs as root from was
// accepted (`--root /var/spool` holds the cron tables), and so was a user's runtime directory
// (systemd's user manager loads units from its systemd/).
BOOST_AUTO_TEST_CASE(refuses_roots_holding_host_trees_and_user_runtime_dirs) {
  auto g = guard();
  for (const char* p :
       {"/var/spool", "/run/user/1000", "/run/user/1000/systemd", "/run/user/1000/systemd/user"}) {
    BOOST_TEST(!g.check(cordon::normalize_path(p), "--root").has_value(), p);
  }
  auto spool = g.check("/var/spool", "--root");
  BOOST_REQUIRE(!spool.has_value());
  BOOST_TEST(spool.error().message().find("contains `/var/spool/cron`") != std::string::npos,
             spool.error().message());
  for (const char* p : {"/run/user/1000/build", "/run/user/1000/systemdx", "/run/user/x",
                        "/var/spool-builds", "/srv/project"}) {
    BOOST_TEST(g.check(p, "--root").has_value(), p);
  }
}

// A tree reached through a link is held where it resolves: with /homes-real holding a
// host-state tree's target, a root holding the target is refused like one holding the tree.
BOOST_AUTO_TEST_CASE(a_root_holding_a_guarded_tree_where_it_resolves_is_refused) {
  LinkedTree t;
  HostPathGuard g = guard();
  BOOST_REQUIRE(std::filesystem::create_directories(t.base + "/data/docker"));
  g.system_resolved["/var/lib/docker"] = t.base + "/data/docker";
  auto r = g.check(t.base + "/data", "--root");
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("contains `/var/lib/docker`") != std::string::npos,
             r.error().message());
  BOOST_TEST(!g.check(t.base + "/data/docker/x", "--root").has_value());  // inside it too
  BOOST_TEST(g.check(t.base + "/elsewhere", "--root").has_value());
}
