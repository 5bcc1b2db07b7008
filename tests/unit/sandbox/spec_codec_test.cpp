#define BOOST_TEST_MODULE sandbox_spec_codec
#include "sandbox/spec_codec.hpp"

#include <sys/resource.h>

#include <boost/test/unit_test.hpp>
#include <cstring>
#include <random>
#include <string>

using namespace cordon;
using namespace cordon::sandbox;

namespace {

// The message of a failed result; "" on success (Boost evaluates the message eagerly).
template <class R>
std::string why(const R& r) {
  return r.has_value() ? std::string() : r.error().message();
}

SpawnRequestBody full_request() {
  SpawnRequestBody b;
  SandboxSpec& s = b.spec;
  s.argv = {"/usr/bin/env", "-i", "", std::string(70000, 'x')};
  s.env = {"PATH=/usr/bin:/bin", "HOME=/tmp/home", "EMPTY="};
  s.root = "/var/tmp/root";
  s.root_read_only = true;
  s.reads_root_and_system_only = true;
  s.cwd = "/var/tmp/root/sub dir";
  s.read_only_paths = {"/opt/a", "/opt/b"};
  s.read_only_ids = {{0, 0}, {64769, 1234567}};
  s.extra_masked_paths = {"/etc/secret"};
  s.network = NetworkMode::kHost;
  s.inside_uid = 1234;
  s.inside_gid = 4321;
  s.tty = true;
  s.tty_cols = 132;
  s.tty_rows = 43;
  s.hostname = "box";
  s.tmp_size_bytes = 5ULL << 32;
  s.inotify_instances = 7;
  s.inotify_watches = 99;
  s.rlimits = {{RLIMIT_NOFILE, 64, 128}, {RLIMIT_CORE, 0, RLIM_INFINITY}};
  s.allow_ptrace = true;
  s.allow_netlink_route = true;
  s.disabled_walls =
      static_cast<uint32_t>(Wall::kLandlock) | static_cast<uint32_t>(Wall::kCloseFds);
  b.seccomp_profile_path = "/usr/share/cordon/seccomp/default.json";
  b.init_path = "/usr/libexec/cordon/cordon-init";
  b.host_id = 0x70000005;
  b.cgroupns_at_clone = false;
  return b;
}

void check_equal(const SpawnRequestBody& a, const SpawnRequestBody& b) {
  BOOST_TEST(a.spec.argv == b.spec.argv, boost::test_tools::per_element());
  BOOST_TEST(a.spec.env == b.spec.env, boost::test_tools::per_element());
  BOOST_TEST(a.spec.root == b.spec.root);
  BOOST_TEST(a.spec.root_read_only == b.spec.root_read_only);
  BOOST_TEST(a.spec.reads_root_and_system_only == b.spec.reads_root_and_system_only);
  BOOST_TEST(a.spec.cwd == b.spec.cwd);
  BOOST_TEST(a.spec.read_only_paths == b.spec.read_only_paths, boost::test_tools::per_element());
  BOOST_TEST((a.spec.read_only_ids == b.spec.read_only_ids));
  BOOST_TEST(a.spec.extra_masked_paths == b.spec.extra_masked_paths,
             boost::test_tools::per_element());
  BOOST_TEST((a.spec.network == b.spec.network));
  BOOST_TEST(a.spec.inside_uid == b.spec.inside_uid);
  BOOST_TEST(a.spec.inside_gid == b.spec.inside_gid);
  BOOST_TEST(a.spec.tty == b.spec.tty);
  BOOST_TEST(a.spec.tty_cols == b.spec.tty_cols);
  BOOST_TEST(a.spec.tty_rows == b.spec.tty_rows);
  BOOST_TEST(a.spec.hostname == b.spec.hostname);
  BOOST_TEST(a.spec.tmp_size_bytes == b.spec.tmp_size_bytes);
  BOOST_TEST(a.spec.inotify_instances == b.spec.inotify_instances);
  BOOST_TEST(a.spec.inotify_watches == b.spec.inotify_watches);
  BOOST_REQUIRE(a.spec.rlimits.size() == b.spec.rlimits.size());
  for (size_t i = 0; i < a.spec.rlimits.size(); ++i) {
    BOOST_TEST(a.spec.rlimits[i].resource == b.spec.rlimits[i].resource);
    BOOST_TEST(a.spec.rlimits[i].soft == b.spec.rlimits[i].soft);
    BOOST_TEST(a.spec.rlimits[i].hard == b.spec.rlimits[i].hard);
  }
  BOOST_TEST(a.spec.allow_ptrace == b.spec.allow_ptrace);
  BOOST_TEST(a.spec.allow_netlink_route == b.spec.allow_netlink_route);
  BOOST_TEST(a.spec.disabled_walls == b.spec.disabled_walls);
  BOOST_TEST(a.seccomp_profile_path == b.seccomp_profile_path);
  BOOST_TEST(a.init_path == b.init_path);
  BOOST_TEST(a.host_id == b.host_id);
  BOOST_TEST(a.cgroupns_at_clone == b.cgroupns_at_clone);
}

SpawnResultBody full_result() {
  SpawnResultBody r;
  r.applied.user_namespace = true;
  r.applied.idmapped_root = false;
  r.applied.idmap_fallback = "mount_setattr: EINVAL";
  r.applied.network_namespace = false;
  r.applied.landlock_abi = 6;
  r.applied.landlock_scopes = true;
  r.applied.seccomp_profile = false;
  r.applied.seccomp_fixed = true;
  r.applied.pinned_executable = true;
  r.applied.interpreter = "/bin/sh";
  r.applied.warnings = {"seccomp: unknown syscall `foo`", "w2"};
  r.argv = {"/bin/sh", "/root/script", "arg"};
  return r;
}

std::string encoded_request() {
  auto e = encode_spawn_request(full_request());
  BOOST_REQUIRE_MESSAGE(e.has_value(), why(e));
  return *e;
}

}  // namespace

BOOST_AUTO_TEST_CASE(request_round_trips) {
  SpawnRequestBody in = full_request();
  auto bytes = encode_spawn_request(in);
  BOOST_REQUIRE_MESSAGE(bytes.has_value(), why(bytes));
  auto out = decode_spawn_request(*bytes);
  BOOST_REQUIRE_MESSAGE(out.has_value(), why(out));
  check_equal(in, *out);
}

BOOST_AUTO_TEST_CASE(default_request_round_trips) {
  SpawnRequestBody in;
  auto bytes = encode_spawn_request(in);
  BOOST_REQUIRE(bytes.has_value());
  auto out = decode_spawn_request(*bytes);
  BOOST_REQUIRE_MESSAGE(out.has_value(), why(out));
  check_equal(in, *out);
}

BOOST_AUTO_TEST_CASE(result_round_trips) {
  SpawnResultBody in = full_result();
  auto bytes = encode_spawn_result(in);
  BOOST_REQUIRE(bytes.has_value());
  auto out = decode_spawn_result(*bytes);
  BOOST_REQUIRE_MESSAGE(out.has_value(), why(out));
  const AppliedFeatures& a = in.applied;
  const AppliedFeatures& b = out->applied;
  BOOST_TEST(a.user_namespace == b.user_namespace);
  BOOST_TEST(a.idmapped_root == b.idmapped_root);
  BOOST_TEST(a.idmap_fallback == b.idmap_fallback);
  BOOST_TEST(a.network_namespace == b.network_namespace);
  BOOST_TEST(a.landlock_abi == b.landlock_abi);
  BOOST_TEST(a.landlock_scopes == b.landlock_scopes);
  BOOST_TEST(a.seccomp_profile == b.seccomp_profile);
  BOOST_TEST(a.seccomp_fixed == b.seccomp_fixed);
  BOOST_TEST(a.pinned_executable == b.pinned_executable);
  BOOST_TEST(a.interpreter == b.interpreter);
  BOOST_TEST(a.warnings == b.warnings, boost::test_tools::per_element());
  BOOST_TEST(in.argv == out->argv, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(refuses_every_truncation_of_a_request) {
  // A shorter argv entry keeps this quadratic loop fast while covering every field boundary.
  SpawnRequestBody in = full_request();
  in.spec.argv.back() = "long-ish argument";
  auto bytes = encode_spawn_request(in);
  BOOST_REQUIRE(bytes.has_value());
  for (size_t n = 0; n < bytes->size(); ++n) {
    auto out = decode_spawn_request(std::string_view(*bytes).substr(0, n));
    BOOST_TEST_REQUIRE(!out.has_value(), "prefix of " << n << " bytes accepted");
    BOOST_TEST((out.error().code() == ErrorCode::kInvalid));
  }
}

BOOST_AUTO_TEST_CASE(refuses_every_truncation_of_a_result) {
  auto bytes = encode_spawn_result(full_result());
  BOOST_REQUIRE(bytes.has_value());
  for (size_t n = 0; n < bytes->size(); ++n) {
    BOOST_TEST_REQUIRE(!decode_spawn_result(std::string_view(*bytes).substr(0, n)).has_value(),
                       "prefix of " << n << " bytes accepted");
  }
}

BOOST_AUTO_TEST_CASE(refuses_trailing_bytes) {
  std::string bytes = encoded_request() + '\0';
  auto out = decode_spawn_request(bytes);
  BOOST_REQUIRE(!out.has_value());
  BOOST_TEST(out.error().message().find("trailing") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_wrong_magic_and_version) {
  std::string bytes = encoded_request();
  std::string bad_magic = bytes;
  bad_magic[0] ^= 1;
  BOOST_TEST(!decode_spawn_request(bad_magic).has_value());
  std::string bad_version = bytes;
  bad_version[4] = 9;
  BOOST_TEST(!decode_spawn_request(bad_version).has_value());
  // A result is not a request, and the other way round.
  auto result = encode_spawn_result(full_result());
  BOOST_REQUIRE(result.has_value());
  BOOST_TEST(!decode_spawn_request(*result).has_value());
  BOOST_TEST(!decode_spawn_result(bytes).has_value());
}

BOOST_AUTO_TEST_CASE(refuses_a_count_larger_than_the_message) {
  // Magic, version, then the argv count: forged to 2^32-1. The decoder must refuse
  // it before reserving anything (a reserve of 4G strings would throw or exhaust memory).
  std::string bytes = encoded_request();
  uint32_t huge = 0xffffffff;
  std::memcpy(bytes.data() + 8, &huge, sizeof huge);
  auto out = decode_spawn_request(bytes);
  BOOST_REQUIRE(!out.has_value());
  BOOST_TEST(out.error().message().find("argv") != std::string::npos);
  // The first string's length, forged past the end.
  bytes = encoded_request();
  std::memcpy(bytes.data() + 12, &huge, sizeof huge);
  BOOST_TEST(!decode_spawn_request(bytes).has_value());
}

BOOST_AUTO_TEST_CASE(refuses_unknown_enum_and_boolean_values) {
  SpawnRequestBody in;
  in.spec.argv = {"/bin/true"};
  auto bytes = encode_spawn_request(in);
  BOOST_REQUIRE(bytes.has_value());
  // The last byte is cgroupns_at_clone (a boolean): 2 is neither.
  std::string bad_bool = *bytes;
  bad_bool.back() = 2;
  auto out = decode_spawn_request(bad_bool);
  BOOST_REQUIRE(!out.has_value());
  BOOST_TEST(out.error().message().find("cgroupns_at_clone") != std::string::npos);
  // The network mode: find it by encoding two specs that differ only there.
  in.spec.network = NetworkMode::kHost;
  auto host = encode_spawn_request(in);
  BOOST_REQUIRE(host.has_value());
  size_t at = 0;
  while (at < bytes->size() && (*bytes)[at] == (*host)[at]) {
    ++at;
  }
  BOOST_REQUIRE(at < bytes->size());
  std::string bad_net = *bytes;
  bad_net[at] = 7;
  out = decode_spawn_request(bad_net);
  BOOST_REQUIRE(!out.has_value());
  BOOST_TEST(out.error().message().find("network") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_nul_in_strings_both_ways) {
  SpawnRequestBody in;
  in.spec.root = std::string("/tmp\0/etc", 9);
  BOOST_TEST(!encode_spawn_request(in).has_value());
  // Forge it on the wire: encode "/tmpX/etc", then turn X into NUL.
  in.spec.root = "/tmpX/etc";
  auto bytes = encode_spawn_request(in);
  BOOST_REQUIRE(bytes.has_value());
  size_t x = bytes->find("/tmpX/etc");
  BOOST_REQUIRE(x != std::string::npos);
  (*bytes)[x + 4] = '\0';
  auto out = decode_spawn_request(*bytes);
  BOOST_REQUIRE(!out.has_value());
  BOOST_TEST(out.error().message().find("root") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_random_bytes) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 512, '\0');
    for (auto& c : bytes) {
      c = static_cast<char>(rng());
    }
    BOOST_TEST_REQUIRE(!decode_spawn_request(bytes).has_value());
    BOOST_TEST_REQUIRE(!decode_spawn_result(bytes).has_value());
  }
  // Random bytes behind a valid magic and version reach the field decoders.
  std::string valid = encoded_request();
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = valid.substr(0, 8);
    size_t n = rng() % 256;
    for (size_t k = 0; k < n; ++k) {
      bytes.push_back(static_cast<char>(rng()));
    }
    BOOST_TEST_REQUIRE(!decode_spawn_request(bytes).has_value());
  }
}

BOOST_AUTO_TEST_CASE(single_byte_corruption_never_crashes) {
  // Every byte of a valid message flipped in turn: decoding may succeed (a changed id or uid is
  // still well-formed) but must return, and a success must re-encode to the same bytes.
  SpawnRequestBody in = full_request();
  in.spec.argv.back() = "tail";
  auto bytes = encode_spawn_request(in);
  BOOST_REQUIRE(bytes.has_value());
  for (size_t i = 0; i < bytes->size(); ++i) {
    std::string b = *bytes;
    b[i] = static_cast<char>(b[i] ^ 0x80);
    auto out = decode_spawn_request(b);
    if (out.has_value()) {
      auto again = encode_spawn_request(*out);
      BOOST_REQUIRE(again.has_value());
      BOOST_TEST_REQUIRE(*again == b);
    }
  }
}

// A parked sandbox's Landlock reads and mounts are its shape's: a spec that differs in one of
// them is never served by it.
BOOST_AUTO_TEST_CASE(the_walls_of_a_read_only_narrow_sandbox_are_part_of_its_shape) {
  SandboxSpec a = full_request().spec;
  a.tty = false;  // a tty job is never parked
  BOOST_TEST(same_sandbox_shape(a, a));
  SandboxSpec reads_more = a;
  reads_more.reads_root_and_system_only = false;
  BOOST_TEST(!same_sandbox_shape(a, reads_more));
  SandboxSpec writes = a;
  writes.root_read_only = false;
  BOOST_TEST(!same_sandbox_shape(a, writes));
}
