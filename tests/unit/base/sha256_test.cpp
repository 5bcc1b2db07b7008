#define BOOST_TEST_MODULE base_sha256
#include "base/sha256.hpp"

#include <boost/test/unit_test.hpp>
#include <string>

using cordon::Sha256;
using cordon::sha256_hex;

// FIPS 180-4 / NIST CSRC example vectors (SHA256.pdf, SHA2_Additional.pdf).
BOOST_AUTO_TEST_CASE(matches_fips_180_4_vectors) {
  BOOST_TEST(sha256_hex("abc") ==
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  BOOST_TEST(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  BOOST_TEST(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
             "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  BOOST_TEST(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnop"
                        "jklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
             "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  BOOST_TEST(sha256_hex(std::string(1000000, 'a')) ==
             "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // SHA2_Additional: one byte 0xbd, and 55/56/64 zero bytes (padding edges).
  BOOST_TEST(sha256_hex("\xbd") ==
             "68325720aabd7c82f30f554b313d0570c95accbb7dc4b5aae11204c08ffe732b");
  BOOST_TEST(sha256_hex(std::string(55, '\0')) ==
             "02779466cdec163811d078815c633f21901413081449002f24aa3e80f0b88ef7");
  BOOST_TEST(sha256_hex(std::string(56, '\0')) ==
             "d4817aa5497628e7c77e6b606107042bbba3130888c5f47a375e6179be789fbb");
  BOOST_TEST(sha256_hex(std::string(64, '\0')) ==
             "f5a5fd42d16a20302798ef6ed309979b43003d2320d9f0e8ea9831a92759fb4b");
}

BOOST_AUTO_TEST_CASE(incremental_updates_match_one_shot_at_every_split) {
  std::string msg;
  for (int i = 0; i < 300; ++i) {
    msg += static_cast<char>(i * 7 + 3);
  }
  std::string want = sha256_hex(msg);
  for (size_t split = 0; split <= msg.size(); ++split) {
    Sha256 h;
    h.update(std::string_view(msg).substr(0, split));
    h.update(std::string_view(msg).substr(split));
    BOOST_TEST(Sha256::hex(h.finish()) == want, "split at " << split);
  }
  // Byte at a time, and the object is reusable after finish().
  Sha256 h;
  for (char c : msg) {
    h.update(&c, 1);
  }
  BOOST_TEST(Sha256::hex(h.finish()) == want);
  h.update("abc");
  BOOST_TEST(Sha256::hex(h.finish()) ==
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Where the CPU has the SHA extensions (the engine hashes every captured byte with them), they
// and the portable code agree at every length around the block edges and on long inputs, and
// the portable code still matches the FIPS vectors.
BOOST_AUTO_TEST_CASE(cpu_extensions_and_portable_code_agree) {
  std::string msg;
  for (int i = 0; i < 5000; ++i) {
    msg += static_cast<char>(i * 7 + 3);
  }
  for (size_t len = 0; len <= msg.size(); len += len < 200 ? 1 : 61) {
    cordon::sha256_force_portable_for_tests(false);
    std::string fast = sha256_hex(std::string_view(msg).substr(0, len));
    cordon::sha256_force_portable_for_tests(true);
    std::string portable = sha256_hex(std::string_view(msg).substr(0, len));
    BOOST_TEST(fast == portable, "length " << len);
  }
  BOOST_TEST(sha256_hex(std::string(1000000, 'a')) ==
             "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  cordon::sha256_force_portable_for_tests(false);
}
