#define BOOST_TEST_MODULE sandbox_beneath
#include <boost/test/unit_test.hpp>

// The setup child's mkdir -p and mount-point creation (sandbox/beneath.hpp), on the real
// filesystem: a symlink anywhere on the way is refused and nothing is made where it points.

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "sandbox/beneath.hpp"

using cordon::sandbox::make_dirs_beneath;
using cordon::sandbox::make_file_beneath;
namespace fs = std::filesystem;

namespace {

struct Tree {
  std::string base, root, outside;
  int root_fd = -1;
  Tree() {
    char tmpl[] = "/tmp/cordon-beneath.XXXXXX";
    base = ::mkdtemp(tmpl);
    root = base + "/root";
    outside = base + "/outside";
    fs::create_directories(root);
    fs::create_directories(outside);
    root_fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  }
  ~Tree() {
    ::close(root_fd);
    fs::remove_all(base);
  }
};

std::string fd_path(int fd) {
  char buf[PATH_MAX] = {};
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool empty_dir(const std::string& dir) { return fs::is_empty(dir); }

}  // namespace

BOOST_AUTO_TEST_CASE(makes_the_missing_directories_and_returns_the_last) {
  Tree t;
  fs::create_directories(t.root + "/home");
  int fd = make_dirs_beneath(t.root_fd, "home/u/proj");
  BOOST_REQUIRE(fd >= 0);
  BOOST_TEST(fd_path(fd) == t.root + "/home/u/proj");
  ::close(fd);
  BOOST_TEST(fs::is_directory(t.root + "/home/u/proj"));
  // Existing ones are fine; a count stops early.
  fd = make_dirs_beneath(t.root_fd, "home/u/proj/x", 2);
  BOOST_REQUIRE(fd >= 0);
  BOOST_TEST(fd_path(fd) == t.root + "/home/u");
  ::close(fd);
  BOOST_TEST(!fs::exists(t.root + "/home/u/proj/x"));
}

BOOST_AUTO_TEST_CASE(a_symlink_on_the_way_is_refused_and_nothing_is_made_where_it_points) {
  Tree t;
  fs::create_directories(t.root + "/work");
  // Relative and absolute links to a directory outside, as a job sharing the root could swap in.
  fs::create_directory_symlink(t.outside, t.root + "/work/abs");
  fs::create_directory_symlink("../../outside", t.root + "/work/rel");
  for (const char* rel : {"work/abs/data", "work/rel/data", "work/abs"}) {
    int fd = make_dirs_beneath(t.root_fd, rel);
    BOOST_TEST(fd == -ELOOP, rel << ": " << fd);
    if (fd >= 0) ::close(fd);
    int file = make_file_beneath(t.root_fd, (std::string(rel) + "/f").c_str());
    BOOST_TEST(file == -ELOOP, rel << "/f: " << file);
    if (file >= 0) ::close(file);
  }
  BOOST_TEST(empty_dir(t.outside));
  // The old walk (mkdirat by path from the root fd) followed the link: the control.
  BOOST_REQUIRE(::mkdirat(t.root_fd, "work/abs/data", 0755) == 0);
  BOOST_TEST(fs::is_directory(t.outside + "/data"));
}

BOOST_AUTO_TEST_CASE(dot_dot_is_refused) {
  Tree t;
  BOOST_TEST(make_dirs_beneath(t.root_fd, "a/../../outside/x") == -EXDEV);
  BOOST_TEST(!fs::exists(t.outside + "/x"));
}

BOOST_AUTO_TEST_CASE(a_file_mount_point_is_made_empty_and_a_symlinked_one_refused) {
  Tree t;
  int fd = make_file_beneath(t.root_fd, "etc/secret.conf");
  BOOST_REQUIRE(fd >= 0);
  BOOST_TEST(fd_path(fd) == t.root + "/etc/secret.conf");
  ::close(fd);
  struct stat st {};
  BOOST_REQUIRE(::stat((t.root + "/etc/secret.conf").c_str(), &st) == 0);
  BOOST_TEST(S_ISREG(st.st_mode));
  BOOST_TEST(st.st_size == 0);
  BOOST_TEST((st.st_mode & 0777) == 0444u);
  // An existing file is used as it is.
  fd = make_file_beneath(t.root_fd, "etc/secret.conf");
  BOOST_TEST(fd >= 0);
  if (fd >= 0) ::close(fd);
  // The last component a symlink to a file outside: refused, the target untouched.
  std::string target = t.outside + "/target";
  ::close(::open(target.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  fs::create_symlink(target, t.root + "/etc/link");
  BOOST_TEST(make_file_beneath(t.root_fd, "etc/link") == -ELOOP);
  BOOST_TEST(make_file_beneath(t.root_fd, "etc/dangling") >= 0);
  fs::create_symlink(t.outside + "/made-by-follow", t.root + "/etc/dangling-out");
  BOOST_TEST(make_file_beneath(t.root_fd, "etc/dangling-out") == -ELOOP);
  BOOST_TEST(!fs::exists(t.outside + "/made-by-follow"));
}

BOOST_AUTO_TEST_CASE(a_path_longer_than_the_buffer_is_refused) {
  Tree t;
  std::string rel(5000, 'a');
  BOOST_TEST(make_dirs_beneath(t.root_fd, rel.c_str()) == -ENAMETOOLONG);
}
