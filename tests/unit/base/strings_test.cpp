#define BOOST_TEST_MODULE base_strings
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <boost/test/unit_test.hpp>

#include "base/error.hpp"
#include "base/scope_exit.hpp"
#include "base/strings.hpp"
#include "base/utf8.hpp"

using namespace cordon;

BOOST_AUTO_TEST_CASE(parses_sizes_with_binary_units) {
  BOOST_TEST(parse_size("512").value() == 512u);
  BOOST_TEST(parse_size("4k").value() == 4096u);
  BOOST_TEST(parse_size("2G").value() == 2ULL << 30);
  BOOST_TEST(!parse_size("").has_value());
  BOOST_TEST(!parse_size("12x").has_value());
  BOOST_TEST(!parse_size("-1").has_value());
  BOOST_TEST(!parse_size("99999999999999999999G").has_value());
}

BOOST_AUTO_TEST_CASE(parses_decimals) {
  BOOST_TEST(parse_decimal("1.5").value() == 1.5);
  BOOST_TEST(parse_decimal("2").value() == 2.0);
  BOOST_TEST(!parse_decimal("1.").has_value());
  BOOST_TEST(!parse_decimal("a").has_value());
}

BOOST_AUTO_TEST_CASE(normalizes_paths_lexically) {
  BOOST_TEST(normalize_path("/a//b/./c/../d") == "/a/b/d");
  BOOST_TEST(normalize_path("/..") == "/");
  BOOST_TEST(normalize_path("rel").empty());
}

BOOST_AUTO_TEST_CASE(root_evil_is_not_within_root) {
  BOOST_TEST(path_within("/root/x", "/root"));
  BOOST_TEST(path_within("/root", "/root"));
  BOOST_TEST(!path_within("/root-evil", "/root"));
  BOOST_TEST(path_within("/anything", "/"));
}

BOOST_AUTO_TEST_CASE(error_message_names_syscall_and_errno) {
  Error e = Error::sys(EACCES, "mkdir `/x`");
  Error wrapped = std::move(e).wrap("create cgroup `{}`", "/x");
  BOOST_TEST(wrapped.message() == "create cgroup `/x`: mkdir `/x`: EACCES");
  BOOST_TEST(Error::refused("no").message() == "no");
}

// What the daemon client refuses to send (api/daemon.cpp, check_text_arguments).
BOOST_AUTO_TEST_CASE(finds_the_first_byte_that_is_not_utf8) {
  BOOST_TEST(!first_invalid_utf8("").has_value());
  BOOST_TEST(!first_invalid_utf8("plain ascii").has_value());
  BOOST_TEST(!first_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80").has_value());
  BOOST_TEST(first_invalid_utf8("caf\xe9").value() == 3u);        // Latin-1
  BOOST_TEST(first_invalid_utf8("ok\xc3").value() == 2u);         // truncated at the end
  BOOST_TEST(first_invalid_utf8("a\xed\xa0\x80").value() == 1u);  // a surrogate
  BOOST_TEST(first_invalid_utf8("\xc0\xaf").value() == 0u);       // an overlong '/'
  BOOST_TEST(first_invalid_utf8("\xe2\x82\xac\xff").value() == 3u);
}

// read_small_file reads records and kernel files: never a FIFO (its open waited for a writer,
// so Engine::open hung on one named meta.json) and never more than kSmallFileMax.
BOOST_AUTO_TEST_CASE(reads_small_regular_files_only) {
  char dir[] = "/tmp/cordon-strings-XXXXXX";
  BOOST_REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string base = dir;
  ScopeExit cleanup([&] { std::filesystem::remove_all(base); });  // also when a check fails
  auto status = read_small_file("/proc/self/status");             // size 0 in stat, read to its end
  BOOST_TEST((status && status->find("Pid:") != std::string::npos));
  const std::string fifo = base + "/fifo";
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  errno = 0;
  BOOST_TEST(!read_small_file(fifo).has_value());
  BOOST_TEST(errno == EINVAL);
  errno = 0;
  BOOST_TEST(!read_small_file(base).has_value());  // a directory
  BOOST_TEST(errno == EINVAL);
  const std::string big = base + "/big";
  int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(::ftruncate(fd, static_cast<off_t>(kSmallFileMax)) == 0);  // sparse
  auto at_max = read_small_file(big);
  BOOST_TEST((at_max && at_max->size() == kSmallFileMax));
  BOOST_REQUIRE(::ftruncate(fd, static_cast<off_t>(kSmallFileMax) + 1) == 0);
  ::close(fd);
  errno = 0;
  BOOST_TEST(!read_small_file(big).has_value());
  BOOST_TEST(errno == EFBIG);
}

// Command output shown on a terminal: no ESC, BEL, DEL or C1 control reaches it raw; text,
// tabs, newlines and other non-ASCII characters pass as they are.
BOOST_AUTO_TEST_CASE(escapes_control_characters_but_tab_and_newline) {
  BOOST_TEST(escape_controls("a\tb\nc") == "a\tb\nc");
  BOOST_TEST(escape_controls("\x1b]52;c;Zm9v\x07") == "\\x1b]52;c;Zm9v\\x07");
  BOOST_TEST(escape_controls(std::string("\0\r\x7f", 3)) == "\\x00\\x0d\\x7f");
  BOOST_TEST(escape_controls("\xc2\x9b"
                             "2J \xc2\x80\xc2\x9f") == "\\u009b2J \\u0080\\u009f");
  BOOST_TEST(escape_controls("caf\xc3\xa9 \xc2\xa0\xe2\x82\xac") ==
             "caf\xc3\xa9 \xc2\xa0\xe2\x82\xac");
  BOOST_TEST(escape_controls("\x9b\xff\xc2") == "\\x9b\\xff\\xc2");  // not UTF-8
  BOOST_TEST(escape_controls("a\tb\n", "") == "a\\x09b\\x0a");
}

// An argv shown to an operator cannot be made to read as another: `rm -rf /tmp/x<RLO>...`
// displays reversed after the override. The bidi embeddings, overrides and isolates are
// escaped; the marks (U+200E, U+200F) and every other character of right-to-left text pass.
BOOST_AUTO_TEST_CASE(escapes_bidi_overrides_and_isolates) {
  BOOST_TEST(escape_controls("a\xe2\x80\xae"
                             "b") == "a\\u202eb");                                // RLO
  BOOST_TEST(escape_controls("\xe2\x80\xaa\xe2\x80\xac") == "\\u202a\\u202c");    // LRE, PDF
  BOOST_TEST(escape_controls("\xe2\x81\xa6x\xe2\x81\xa9") == "\\u2066x\\u2069");  // LRI, PDI
  BOOST_TEST(escape_controls("\xe2\x80\xa9\xe2\x80\xaf\xe2\x81\xa5\xe2\x81\xaa") ==
             "\xe2\x80\xa9\xe2\x80\xaf\xe2\x81\xa5\xe2\x81\xaa");  // neighbours pass
  BOOST_TEST(escape_controls("\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d\xe2\x80\x8f") ==
             "\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d\xe2\x80\x8f");  // Hebrew and RLM
  BOOST_TEST(escape_controls("\xe2\x80") == "\\xe2\\x80");     // truncated: not UTF-8
}
