#define BOOST_TEST_MODULE sandbox_etc_watch
#include <boost/test/unit_test.hpp>

// EtcWatch (sandbox/etc_watch.hpp) on a real inotify instance, over a scratch tree that stands
// for /etc: it may answer "unchanged" only while nothing happened to a watched secret or to
// a directory on the way to one, and every kind of change a mask depends on makes it answer
// "changed".

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
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

// Arms a fresh watch over the tree; the mark it hands out reads unchanged.
uint64_t armed(EtcWatch& w, const Etc& etc) {
  uint64_t mark = w.arm(etc.base, etc.secrets());
  BOOST_REQUIRE(mark != 0);
  BOOST_REQUIRE(w.unchanged_since(mark));
  return mark;
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
  uint64_t again = w.arm(etc.base, etc.secrets());
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
  uint64_t mark = armed(w, etc);
  fs::create_directories(etc.at("ssl.new/private"));
  etc.write("ssl.new/private/key.pem", "other key\n");
  BOOST_REQUIRE(::rename(etc.at("ssl").c_str(), etc.at("ssl.old").c_str()) == 0);
  BOOST_TEST(!w.unchanged_since(mark));
  mark = armed(w, etc);
  BOOST_REQUIRE(::rename(etc.at("ssl.new").c_str(), etc.at("ssl").c_str()) == 0);
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
// a watch on real/dir sees its directory replaced), and a dangling one (it may come to
// point somewhere) never reads unchanged.
BOOST_AUTO_TEST_CASE(a_symlinked_secrets_target_is_watched_and_a_dangling_one_never_clean) {
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
  BOOST_REQUIRE(::unlink(etc.at("real/dir/secret").c_str()) == 0);
  BOOST_TEST(w.arm(etc.base, etc.secrets()) == 0u);
}

BOOST_AUTO_TEST_CASE(paths_outside_the_base_are_refused) {
  Etc etc;
  EtcWatch w;
  BOOST_TEST(w.arm(etc.base, {etc.elsewhere + "/file"}) == 0u);
}
