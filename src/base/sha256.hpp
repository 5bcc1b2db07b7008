#pragma once

// SHA-256 (FIPS 180-4), incremental: the policy pins executables by content hash and the
// engine hashes artifacts as their bytes stream in, so neither needs the whole input at once.
// Written here rather than pulled in: it is ~100 lines and keeps the dependency list short.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cordon {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256() { reset(); }

  /// Feeds more input; may be called any number of times before finish().
  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  /// Pads, returns the digest and resets the object for a new message.
  Digest finish();
  void reset();

  /// Lower-case hex of a digest (64 characters).
  static std::string hex(const Digest& digest);

 private:
  void blocks(const uint8_t* p, size_t n);  // n whole 64-byte blocks, SHA-NI where the CPU has it
  void block(const uint8_t* p);             // one block, portable

  std::array<uint32_t, 8> h_{};
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes fed so far
};

/// Tests only: hash with the portable code even where the CPU has the SHA extensions.
void sha256_force_portable_for_tests(bool on);

/// One-shot helper: lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

}  // namespace cordon
