#define BOOST_TEST_MODULE sys_fs
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.hpp"
#include "sys/fs.hpp"

using namespace cordon;

namespace {
void on_signal(int) {}
}  // namespace

// writev_all writes every piece in order, empty ones included, across the short writes a signal
// makes of a blocking writev into a pipe whose reader is slow (the plan's memfd never writes
// short; a pipe shows the advancing of the pieces).
BOOST_AUTO_TEST_CASE(writev_all_writes_every_piece_in_order_across_short_writes) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;  // no SA_RESTART: a writev that wrote some returns short
  BOOST_TEST_REQUIRE(::sigaction(SIGUSR1, &sa, nullptr) == 0);
  std::vector<std::string> texts;
  for (int i = 0; i < 6; ++i) {
    texts.emplace_back(static_cast<size_t>(i % 3 == 1 ? 0 : 100000 + i * 7777),
                       static_cast<char>('a' + i));
  }
  std::vector<struct iovec> pieces;
  std::string expected;
  for (auto& t : texts) {
    pieces.push_back({t.data(), t.size()});
    expected += t;
  }
  int p[2];
  BOOST_TEST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  const pthread_t writer = ::pthread_self();
  std::atomic<bool> done{false};
  std::string got;
  int signals = 0;
  std::thread reader([&] {
    char buf[4096];
    while (got.size() < expected.size()) {
      ssize_t n = ::read(r.get(), buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
      if (!done && got.size() / 65536 > static_cast<size_t>(signals)) {
        ++signals;
        ::pthread_kill(writer, SIGUSR1);  // interrupts the writev blocked on a full pipe
      }
    }
  });
  auto written = sys::writev_all(w.get(), pieces);
  done = true;
  reader.join();
  BOOST_TEST(written.has_value());
  BOOST_TEST(signals >= 3);
  BOOST_TEST(got.size() == expected.size());
  BOOST_TEST((got == expected));
  ::signal(SIGUSR1, SIG_DFL);
}

BOOST_AUTO_TEST_CASE(writev_all_refuses_more_pieces_than_iov_max) {
  int p[2];
  BOOST_TEST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  char byte = 'x';
  std::vector<struct iovec> pieces(IOV_MAX + 1, {&byte, 1});
  auto written = sys::writev_all(w.get(), pieces);
  BOOST_REQUIRE(!written.has_value());
  BOOST_TEST(written.error().message().find("IOV_MAX") != std::string::npos,
             written.error().message());
}

// A path's place on its file system: mountinfo's device of the mount it is on, and the path
// from the file system's root (the policy's check of a pin reached through a bind mount; the
// bind mounts themselves are in policy: a_sha256_pin_reached_through_a_bind_mount_…).
BOOST_AUTO_TEST_CASE(fs_place_gives_the_file_system_and_the_path_within_it) {
  char tmpl[] = "/var/tmp/cordon-fs-place.XXXXXX";
  BOOST_TEST_REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  auto mounts = sys::read_mountinfo();
  BOOST_REQUIRE_MESSAGE(mounts.has_value(), (mounts ? "" : mounts.error().message()));
  auto place = sys::fs_place(dir, *mounts);
  auto same = sys::fs_place(dir + "//./", *mounts);
  ::rmdir(dir.c_str());
  BOOST_REQUIRE_MESSAGE(place.has_value(), (place ? "" : place.error().message()));
  BOOST_TEST(place->dev.find(':') != std::string::npos, place->dev);
  BOOST_TEST(place->path.ends_with(dir.substr(dir.rfind('/'))), place->path);
  BOOST_REQUIRE(same.has_value());
  BOOST_TEST(same->path == place->path);  // normalised
  BOOST_TEST(same->dev == place->dev);
  auto gone = sys::fs_place(dir, *mounts);
  BOOST_REQUIRE(!gone.has_value());
  BOOST_TEST(gone.error().message() == "statx `" + dir + "`: ENOENT", gone.error().message());
}

// mountinfo as the kernel writes it: optional fields before ` - `, escaped spaces and
// backslashes; a bind mount's root is the directory it shows; NFS shows `/` as every mount's
// root, so its place comes from the source; a line without ` - ` is refused.
BOOST_AUTO_TEST_CASE(mountinfo_lines_give_each_mounts_place) {
  auto parsed = sys::parse_mountinfo(
      "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
      "40 22 254:0 /srv/a\\040b\\134c /mnt/al\\040ias rw shared:1 master:2 - ext4 /dev/vda rw\n"
      "41 22 0:66 /@work /work rw - btrfs /dev/vdb rw,subvol=/@work\n"
      "42 22 0:70 / /nfs/w ro,nosuid - nfs4 srv:/export/work rw\n");
  BOOST_REQUIRE_MESSAGE(parsed.has_value(), (parsed ? "" : parsed.error().message()));
  BOOST_REQUIRE(parsed->size() == 4u);
  const sys::MountInfo& alias = (*parsed)[1];
  BOOST_TEST(alias.id == "40");
  BOOST_TEST(alias.root == "/srv/a b\\c");
  BOOST_TEST(alias.mount_point == "/mnt/al ias");
  BOOST_TEST(alias.fstype == "ext4");
  BOOST_TEST(alias.source == "/dev/vda");
  BOOST_TEST(sys::mount_place(alias).dev == "254:0");
  BOOST_TEST(sys::mount_place(alias).path == "/srv/a b\\c");
  BOOST_TEST(sys::mount_place((*parsed)[2]).path == "/@work");
  BOOST_TEST(sys::mount_place((*parsed)[3]).dev == "srv");
  BOOST_TEST(sys::mount_place((*parsed)[3]).path == "/export/work");
  BOOST_TEST(alias.options == "rw");
  BOOST_TEST(!sys::read_only(alias));
  BOOST_TEST(sys::read_only((*parsed)[3]));  // the mount's own flag
  BOOST_TEST(sys::read_only(sys::MountInfo{.super_options = "ro,errors=continue"}));  // its sb
  auto bad = sys::parse_mountinfo("22 1 254:0 / / rw ext4 /dev/vda rw\n");
  BOOST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message().find("without ` - `") != std::string::npos);
}

// open_within resolves as the kernel would from the host, but only beneath the root: links
// inside are followed (an absolute one back inside too), a link or `..` that leaves is EXDEV
// naming the link's text, a trailing slash wants a directory, a loop is ELOOP, and a chain of
// 40 links through a tree 200 deep is walked one step at a time (the first version reopened the
// whole walked prefix at every step: ~0.5 s for such a path, under the engine's lock).
BOOST_AUTO_TEST_CASE(open_within_follows_links_inside_and_refuses_every_way_out) {
  char tmpl[] = "/tmp/cordon-within.XXXXXX";
  BOOST_REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string t = tmpl, root = t + "/root";
  for (const std::string d : {root, root + "/a", root + "/a/b", t + "/out"}) {
    BOOST_REQUIRE(::mkdir(d.c_str(), 0755) == 0 || errno == EEXIST);
  }
  BOOST_REQUIRE(::close(::open((root + "/a/file").c_str(), O_CREAT | O_WRONLY, 0644)) == 0);
  auto link = [&](const std::string& target, const std::string& at) {
    BOOST_REQUIRE(::symlink(target.c_str(), (root + "/" + at).c_str()) == 0);
  };
  link("a/b", "rel-in");
  link(root + "/a", "abs-in");
  link("../out", "rel-out");
  link(t + "/out", "abs-out");
  link("a/b/../../..", "dotdot-out");
  link("loop", "loop");
  UniqueFd rootfd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  BOOST_REQUIRE(rootfd);
  auto ino_of = [](const std::string& p) {
    struct stat st {};
    BOOST_REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_ino;
  };
  auto opens = [&](const std::string& p, uint64_t flags = 0) -> ino_t {
    auto fd = sys::open_within(rootfd.get(), root, p, flags);
    BOOST_REQUIRE_MESSAGE(fd.has_value(), p << ": " << (fd ? "" : fd.error().message()));
    auto st = sys::fstat_fd(fd->get());
    BOOST_REQUIRE(st.has_value());
    return st->st_ino;
  };
  auto err = [&](const std::string& p, uint64_t flags = 0) {
    auto fd = sys::open_within(rootfd.get(), root, p, flags);
    BOOST_REQUIRE_MESSAGE(!fd.has_value(), p);
    return fd.error();
  };
  BOOST_TEST(opens("rel-in") == ino_of(root + "/a/b"));
  BOOST_TEST(opens("abs-in/b") == ino_of(root + "/a/b"));
  BOOST_TEST(opens(root + "/rel-in/..") == ino_of(root + "/a"));  // `..` after the link's target
  BOOST_TEST(opens(".") == ino_of(root));
  BOOST_TEST(opens("a/file") == ino_of(root + "/a/file"));
  for (const std::string& p :
       std::vector<std::string>{"rel-out", "abs-out", "dotdot-out", "..", "a/../..", t + "/out"}) {
    BOOST_TEST(err(p).sys_errno() == EXDEV, p);
  }
  BOOST_TEST(err("abs-out").message().find("is a symbolic link to \"" + t + "/out\"") !=
             std::string::npos);
  BOOST_TEST(err("a/file/").sys_errno() == ENOTDIR);
  BOOST_TEST(err("a/file", O_DIRECTORY).sys_errno() == ENOTDIR);
  BOOST_TEST(err("loop").sys_errno() == ELOOP);
  BOOST_TEST(err("missing").sys_errno() == ENOENT);

  // A chain of links, each one directory down and back: linear in the walk.
  std::string deep = root;
  for (int i = 0; i < 200; ++i) {
    deep += "/d";
    BOOST_REQUIRE(::mkdir(deep.c_str(), 0755) == 0);
  }
  std::string rel = deep.substr(root.size() + 1);
  link(rel + "/..", "c0");  // one above the bottom
  for (int i = 1; i < 40; ++i) {
    link("c" + std::to_string(i - 1) + "/d/..", "c" + std::to_string(i));
  }
  BOOST_TEST(opens("c39/d") == ino_of(deep));
  std::string cmd = "rm -rf '" + t + "'";
  BOOST_TEST(::system(cmd.c_str()) == 0);
}
