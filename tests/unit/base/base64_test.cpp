#define BOOST_TEST_MODULE base_base64
#include "base/base64.hpp"

#include <boost/test/unit_test.hpp>
#include <string>

#include "base/utf8.hpp"

using namespace cordon;

BOOST_AUTO_TEST_CASE(encodes_rfc4648_test_vectors) {
  // RFC 4648 section 10.
  BOOST_TEST(base64_encode("") == "");
  BOOST_TEST(base64_encode("f") == "Zg==");
  BOOST_TEST(base64_encode("fo") == "Zm8=");
  BOOST_TEST(base64_encode("foo") == "Zm9v");
  BOOST_TEST(base64_encode("foob") == "Zm9vYg==");
  BOOST_TEST(base64_encode("fooba") == "Zm9vYmE=");
  BOOST_TEST(base64_encode("foobar") == "Zm9vYmFy");
}

BOOST_AUTO_TEST_CASE(encodes_every_byte_value) {
  std::string all;
  for (int b = 0; b < 256; ++b) {
    all.push_back(static_cast<char>(b));
  }
  std::string enc = base64_encode(all);
  BOOST_TEST(enc.size() == 344u);
  BOOST_TEST(enc.substr(0, 8) == "AAECAwQF");
  BOOST_TEST(enc.substr(enc.size() - 8) == "/P3+/w==");
}

BOOST_AUTO_TEST_CASE(decodes_what_it_encodes_and_nothing_else) {
  BOOST_TEST(base64_decode("").value() == "");
  BOOST_TEST(base64_decode("Zg==").value() == "f");
  BOOST_TEST(base64_decode("Zm8=").value() == "fo");
  BOOST_TEST(base64_decode("Zm9vYmFy").value() == "foobar");
  std::string all;
  for (int b = 0; b < 256; ++b) {
    all.push_back(static_cast<char>(b));
  }
  for (size_t n = 0; n <= all.size(); n += 37) {
    BOOST_TEST(base64_decode(base64_encode(all.substr(0, n))).value() == all.substr(0, n));
  }
  // Refused: bad length, characters outside the alphabet, padding in the middle or alone,
  // non-zero bits under the padding (not what base64_encode writes).
  for (const char* bad : {"Zg=", "Zm9", "Zm9v!A==", "Zg==Zg==", "====", "Z===", "Zh==", "Zm9=",
                          "Zm 9", "Zm9\n", "Zm9v Zg="}) {
    BOOST_TEST(!base64_decode(bad).has_value(), bad);
  }
}

namespace {
std::string sanitized(std::string_view in) {
  std::string out;
  append_utf8_sanitized(in, out);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(utf8_rule_replaces_each_bad_byte) {
  const std::string r(kReplacementUtf8);
  BOOST_TEST(sanitized("a\xC3\xA9z") == "a\xC3\xA9z");
  BOOST_TEST(sanitized("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");
  BOOST_TEST(sanitized("\xC0\xAF") == r + r);                  // overlong '/'
  BOOST_TEST(sanitized("\xE0\x80\xAF") == r + r + r);          // overlong, 3 bytes
  BOOST_TEST(sanitized("\xED\xA0\x80") == r + r + r);          // surrogate D800
  BOOST_TEST(sanitized("\xF4\x90\x80\x80") == r + r + r + r);  // U+110000
  BOOST_TEST(sanitized("\xE2\x82"
                       "A") == r + r + "A");   // truncated, then ASCII
  BOOST_TEST(sanitized("\xE2\x82") == r + r);  // truncated at the end
  BOOST_TEST(sanitized("\xFF\x80") == r + r);
}

BOOST_AUTO_TEST_CASE(utf8_unit_waits_only_for_a_valid_prefix) {
  const auto* e2 = reinterpret_cast<const uint8_t*>("\xE2\x82");
  BOOST_TEST(utf8_unit_length(e2, 2, false) == 0u);
  BOOST_TEST(utf8_unit_length(e2, 2, true) == 1u);
  // E0 80 can never become valid: decided at once, without waiting for more bytes.
  const auto* e0 = reinterpret_cast<const uint8_t*>("\xE0\x80");
  BOOST_TEST(utf8_unit_length(e0, 2, false) == 1u);
}
