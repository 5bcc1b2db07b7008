#define BOOST_TEST_MODULE base_strings
#include <boost/test/unit_test.hpp>

#include "base/error.hpp"
#include "base/strings.hpp"

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
