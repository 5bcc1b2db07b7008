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
