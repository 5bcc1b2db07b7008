#define BOOST_TEST_MODULE policy_host_paths
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <fstream>

#include "policy/host_paths.hpp"

using cordon::policy::HostPathGuard;

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
