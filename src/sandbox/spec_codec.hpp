#pragma once

// Binary encoding of what crosses the engine ↔ spawner socket: a spawn request (SandboxSpec
// plus the rest of the request) and the result of a spawn (AppliedFeatures plus the final
// argv). The decoder runs in the privileged spawner on bytes another process wrote, so it is
// written for hostile input: every read is bounds-checked, counts are checked against the
// bytes left before anything is allocated, enums and booleans must hold a known value, strings
// must not contain NUL (a path "a\0b" would be checked as one thing and opened as another), and
// trailing bytes are refused. Malformed input is an Error (kInvalid), never UB.
//
// Layout: little-endian (the host's; both ends are the same binary's build on one machine),
// u32 magic + u32 version first, then fields in declaration order. Integers are fixed width
// (u8 for booleans, u32 for enums and ids, u64 for sizes); a string is a u32 length and its
// bytes; a list is a u32 count and its items.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"
#include "sandbox/prepare.hpp"
#include "sandbox/spec.hpp"

namespace cordon::sandbox {

inline constexpr uint32_t kRequestCodecMagic = 0x51525043;  // "CPRQ"
inline constexpr uint32_t kResultCodecMagic = 0x53525043;   // "CPRS"
// 2: allow_netlink_route (session 29); 3: reads_root_and_system_only (session 33);
// 4: read_only_ids (session 40)
inline constexpr uint32_t kCodecVersion = 4;

/// Everything of a spawn request but its id (in the datagram header, the one place it lives)
/// and its descriptors (SCM_RIGHTS).
struct SpawnRequestBody {
  SandboxSpec spec;
  std::string seccomp_profile_path;
  std::string init_path;
  uid_t host_id = 0;
  bool cgroupns_at_clone = true;
};

/// What a successful spawn reports besides its descriptors.
struct SpawnResultBody {
  AppliedFeatures applied;
  std::vector<std::string> argv;  // as exec'd (after `#!` handling)
};

/// Encodes a request; refuses (kInvalid) a string or list too long for its u32 length and a
/// string holding NUL, so what is sent is always what the decoder accepts.
[[nodiscard]] Result<std::string> encode_spawn_request(const SpawnRequestBody& body);
/// Decodes a request; kInvalid names the field at fault and the offset.
[[nodiscard]] Result<SpawnRequestBody> decode_spawn_request(std::string_view bytes);

[[nodiscard]] Result<std::string> encode_spawn_result(const SpawnResultBody& body);
[[nodiscard]] Result<SpawnResultBody> decode_spawn_result(std::string_view bytes);

}  // namespace cordon::sandbox
