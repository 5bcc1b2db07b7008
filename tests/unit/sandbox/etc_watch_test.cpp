#define BOOST_TEST_MODULE sandbox_etc_watch
#include <boost/test/unit_test.hpp>

// EtcWatch (sandbox/etc_watch.hpp) on a real inotify instance, over a scratch tree that stands
// for /etc: it may answer "unchanged" only while nothing happened to a watched secret or to
// a directory on the way to one, and every kind of change a mask depends on makes it answer
// "changed".

#include <fcntl.h>
#include <stdlib.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "sandbox/etc_watch.hpp"

using cordon::sandbox::EtcWatch;
namespace fs = std::filesystem;

namespace {

struct Etc {
  std::string base, elsewhere;
  Etc() {
    char tmpl[] = "/tmp/cordon-etc-watch.XXXXXX";
    std::string top = ::mkdtemp(tmpl);
    base = top + "/etc";
    elsewhere = top + "/elsewhere";
    fs::create_directories(base + "/ssl/private");
    fs::create_directories(base + "/ssh");
    fs::create_directories(elsewhere);
    write("shadow", "secret\n");
    write("ssl/private/key.pem", "key\n");
    write("unrelated.conf", "x\n");
  }
  ~Etc() { fs::remove_all(fs::path(base).parent_path()); }
  void write(const std::string& rel, const std::string& text) const {
    std::ofstream(base + "/" + rel) << text;
  }
  std::string at(const std::string& rel) const { return base + "/" + rel; }
  // The secrets as etc_secret_paths() lists them: some exist, some do not.
  std::vector<std::string> secrets() const {
    return {at("shadow"), at("gshadow"),          at("ssl/private"),
            at("ssh"),    at("security/opasswd"), at("link-secret")};
  }
};

// Arms a fresh watch over the tree and confirms it; the generation reads unchanged.
uint64_t armed(EtcWatch& w, const Etc& etc) {
  uint64_t generation = w.confirm(w.arm(etc.base, etc.secrets()));
  BOOST_REQUIRE(generation != 0);
  BOOST_REQUIRE(w.unchanged_since(generation));
  return generation;
}

// What arm() hands out for the tree's secrets (0: no mark, the job scans).
uint64_t generation_of(EtcWatch& w, const Etc& etc) {
  return w.confirm(w.arm(etc.base, etc.secrets()));
}

}  // namespace

BOOST_AUTO_TEST_CASE(nothing_happened_reads_unchanged_and_stays_so) {
  Etc etc;
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  // Reading a secret, and any change outside the watched ways, is no event.
  std::ifstream(etc.at("shadow")).get();
  std::ofstream(etc.elsewhere + "/file") << "x\n";
  BOOST_TEST(w.unchanged_since(mark));
  BOOST_TEST(w.unchanged_since(mark));
  BOOST_TEST(!w.unchanged_since(0));  // 0 is never a mark
}

BOOST_AUTO_TEST_CASE(a_secret_renamed_over_reads_changed_and_a_new_mark_is_clean) {
  Etc etc;
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  etc.write("shadow.new", "new secret\n");
  BOOST_REQUIRE(::rename(etc.at("shadow.new").c_str(), etc.at("shadow").c_str()) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
  BOOST_TEST(!w.unchanged_since(mark));  // stays changed once seen
  uint64_t again = generation_of(w, etc);
  BOOST_TEST(again != mark);
  BOOST_TEST(w.unchanged_since(again));
}

BOOST_AUTO_TEST_CASE(a_secret_that_appears_reads_changed) {
  Etc etc;
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  etc.write("gshadow", "appeared\n");
  BOOST_TEST(!w.unchanged_since(mark));
}

BOOST_AUTO_TEST_CASE(a_secret_under_a_directory_that_did_not_exist_reads_changed) {
  Etc etc;
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  fs::create_directories(etc.at("security"));
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);  // now /etc/security is watched as well
  etc.write("security/opasswd", "appeared\n");
  BOOST_TEST(!w.unchanged_since(mark));
}

BOOST_AUTO_TEST_CASE(a_directory_on_the_way_replaced_reads_changed) {
  Etc etc;
  EtcWatch w;
  // One level down (only the watch on ssl sees it), then at the base.
  uint64_t mark = armed(w, etc);
  fs::create_directories(etc.at("ssl/private.new"));
  etc.write("ssl/private.new/key.pem", "other key\n");
  BOOST_REQUIRE(::rename(etc.at("ssl/private").c_str(), etc.at("ssl/private.old").c_str()) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);
  BOOST_REQUIRE(::rename(etc.at("ssl/private.new").c_str(), etc.at("ssl/private").c_str()) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);
  BOOST_REQUIRE(::rename(etc.at("ssl").c_str(), etc.at("ssl.old").c_str()) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
}

BOOST_AUTO_TEST_CASE(a_file_inside_a_masked_directory_or_a_write_or_chmod_reads_changed) {
  Etc etc;
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  etc.write("ssl/private/other.pem", "x\n");  // the masked directory's ctime moves
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);
  std::ofstream(etc.at("shadow"), std::ios::app) << "more\n";
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);
  BOOST_REQUIRE(::chmod(etc.at("shadow").c_str(), 0600) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
}

// A hard link made from a directory nobody watches changes only the secret's link count
// (and ctime): the event goes to watches on the file itself, which arm() makes.
BOOST_AUTO_TEST_CASE(a_hard_link_to_a_secret_made_elsewhere_reads_changed) {
  Etc etc;
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  if (::link(etc.at("shadow").c_str(), (etc.elsewhere + "/shadow-link").c_str()) != 0) {
    BOOST_FAIL("link into the scratch tree failed: " << std::strerror(errno));
  }
  BOOST_TEST(!w.unchanged_since(mark));
}

// A symlinked secret is masked where it points: that file's way is watched too (here only
// a watch on real/dir sees its directory replaced).
BOOST_AUTO_TEST_CASE(a_symlinked_secrets_target_is_watched) {
  Etc etc;
  fs::create_directories(etc.at("real/dir"));
  etc.write("real/dir/secret", "x\n");
  BOOST_REQUIRE(::symlink("real/dir/secret", etc.at("link-secret").c_str()) == 0);
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  fs::create_directories(etc.at("real/dir.new"));
  etc.write("real/dir.new/secret", "new\n");
  BOOST_REQUIRE(::rename(etc.at("real/dir").c_str(), etc.at("real/dir.old").c_str()) == 0);
  BOOST_REQUIRE(::rename(etc.at("real/dir.new").c_str(), etc.at("real/dir").c_str()) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
}

// A dangling symlink starts to resolve when its target appears: an event on the target's way.
BOOST_AUTO_TEST_CASE(a_dangling_symlinks_target_appearing_reads_changed) {
  Etc etc;
  BOOST_REQUIRE(::symlink("later/secret", etc.at("link-secret").c_str()) == 0);
  EtcWatch w;
  uint64_t mark = armed(w, etc);
  fs::create_directories(etc.at("later"));
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);
  etc.write("later/secret", "x\n");
  BOOST_TEST(!w.unchanged_since(mark));
}

// A watch on a symlink's target sees nothing of the directories that lead to the target, nor of
// a second link: a symlink anywhere but as the secret's last component, a chain of links, a
// link out of the base, or with "..", hands out no mark (the job scans).
BOOST_AUTO_TEST_CASE(links_the_watch_cannot_follow_hand_out_no_mark) {
  auto no_mark = [](const std::function<void(const Etc&)>& make) {
    Etc etc;
    make(etc);
    EtcWatch w;
    return generation_of(w, etc) == 0;
  };
  // A directory on the way is a link (/etc/ssl -> a/b/c): its target's parents are unwatched.
  BOOST_TEST(no_mark([](const Etc& etc) {
    fs::remove_all(etc.at("ssl"));
    fs::create_directories(etc.at("a/b/c/private"));
    BOOST_REQUIRE(::symlink("a/b/c", etc.at("ssl").c_str()) == 0);
  }));
  // A chain: link-secret -> a/y -> b/secret.
  BOOST_TEST(no_mark([](const Etc& etc) {
    fs::create_directories(etc.at("a"));
    fs::create_directories(etc.at("b"));
    etc.write("b/secret", "x\n");
    BOOST_REQUIRE(::symlink("../b/secret", etc.at("a/y").c_str()) == 0);
    BOOST_REQUIRE(::symlink("a/y", etc.at("link-secret").c_str()) == 0);
  }));
  // Out of the base, and through "..".
  BOOST_TEST(no_mark([](const Etc& etc) {
    BOOST_REQUIRE(::symlink((etc.elsewhere + "/secret").c_str(), etc.at("link-secret").c_str()) ==
                  0);
  }));
  BOOST_TEST(no_mark([](const Etc& etc) {
    BOOST_REQUIRE(::symlink("ssl/../shadow", etc.at("link-secret").c_str()) == 0);
  }));
}

// A mount placed on the way between arm() and confirm() raises no event, and the parked
// sandbox's copy of /etc, taken in between, may show it: no mark. (In a mount namespace of
// the test's own: nothing of the host's mounts changes.)
BOOST_AUTO_TEST_CASE(a_mount_on_the_way_between_arming_and_confirming_hands_out_no_mark) {
  BOOST_REQUIRE_MESSAGE(::unshare(CLONE_NEWNS) == 0,
                        "unshare(CLONE_NEWNS): " << std::strerror(errno));
  BOOST_REQUIRE(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0);
  Etc etc;
  EtcWatch w;
  EtcWatch::Mark mark = w.arm(etc.base, etc.secrets());
  BOOST_REQUIRE(mark.generation != 0);
  BOOST_REQUIRE(::mount("tmpfs", etc.at("ssl").c_str(), "tmpfs", 0, nullptr) == 0);
  BOOST_TEST(w.confirm(mark) == 0u);
  BOOST_REQUIRE(::umount2(etc.at("ssl").c_str(), MNT_DETACH) == 0);
  BOOST_TEST(w.confirm(mark) == mark.generation);  // the same inodes again
}

// Changes to a filesystem inotify does not see (made by the kernel itself, elsewhere, or over
// a network) must not read unchanged: only local disk and memory filesystems get a mark.
BOOST_AUTO_TEST_CASE(a_filesystem_whose_changes_inotify_may_miss_hands_out_no_mark) {
  EtcWatch w;
  BOOST_TEST(w.confirm(w.arm("/proc/sys/kernel", {"/proc/sys/kernel/hostname"})) == 0u);
  BOOST_TEST(w.confirm(w.arm("/sys/kernel", {"/sys/kernel/mm"})) == 0u);
}

BOOST_AUTO_TEST_CASE(paths_outside_the_base_are_refused) {
  Etc etc;
  EtcWatch w;
  BOOST_TEST(w.arm(etc.base, {etc.elsewhere + "/file"}).generation == 0u);
}
