#include "sandbox/spec_codec.hpp"

#include <cstring>
#include <limits>
#include <type_traits>

namespace cordon::sandbox {
namespace {

// Appends fields; the first field that cannot be encoded is remembered and reported once.
class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void boolean(bool v) { u8(v ? 1 : 0); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void i32(int32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void str(std::string_view s, const char* field) {
    if (s.size() > std::numeric_limits<uint32_t>::max()) {
      fail(field, "too long");
      return;
    }
    if (s.find('\0') != std::string_view::npos) {
      fail(field, "contains a NUL byte");
      return;
    }
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  bool count(size_t n, const char* field) {
    if (n > std::numeric_limits<uint32_t>::max()) {
      fail(field, "has too many entries");
      return false;
    }
    u32(static_cast<uint32_t>(n));
    return true;
  }
  void strings(const std::vector<std::string>& v, const char* field) {
    if (count(v.size(), field)) {
      for (const auto& s : v) {
        str(s, field);
      }
    }
  }
  Result<std::string> finish() && {
    if (!error_.empty()) {
      return invalid("encode: {}", error_);
    }
    return std::move(out_);
  }

 private:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void fail(const char* field, const char* why) {
    if (error_.empty()) {
      error_ = fmt::format("`{}` {}", field, why);
    }
  }
  std::string out_;
  std::string error_;
};

// Reads fields from untrusted bytes. Every read checks the bytes left; after the first
// failure every read fails too, so decode functions can read straight through and check once.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  bool u8(uint8_t& v, const char* field) { return raw(&v, sizeof v, field); }
  bool boolean(bool& v, const char* field) {
    uint8_t b = 0;
    if (!u8(b, field)) {
      return false;
    }
    if (b > 1) {
      return fail(field, "is not a boolean");
    }
    v = b == 1;
    return true;
  }
  bool u32(uint32_t& v, const char* field) { return raw(&v, sizeof v, field); }
  bool i32(int32_t& v, const char* field) { return raw(&v, sizeof v, field); }
  bool u64(uint64_t& v, const char* field) { return raw(&v, sizeof v, field); }
  bool str(std::string& v, const char* field) {
    uint32_t n = 0;
    if (!u32(n, field)) {
      return false;
    }
    if (n > left()) {
      return fail(field, "is longer than the message");
    }
    std::string_view s = in_.substr(pos_, n);
    if (s.find('\0') != std::string_view::npos) {
      return fail(field, "contains a NUL byte");
    }
    v.assign(s);
    pos_ += n;
    return true;
  }
  // A list count, checked against the bytes left: each item takes at least `min_item` bytes,
  // so a forged count cannot make us allocate more than the message could hold.
  bool count(uint32_t& n, size_t min_item, const char* field) {
    if (!u32(n, field)) {
      return false;
    }
    if (n > left() / min_item) {
      return fail(field, "has more entries than the message holds");
    }
    return true;
  }
  bool strings(std::vector<std::string>& v, const char* field) {
    uint32_t n = 0;
    if (!count(n, sizeof(uint32_t), field)) {
      return false;
    }
    v.clear();
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      std::string s;
      if (!str(s, field)) {
        return false;
      }
      v.push_back(std::move(s));
    }
    return true;
  }
  bool expect_magic(uint32_t magic, const char* what) {
    uint32_t m = 0, version = 0;
    if (!u32(m, "magic") || !u32(version, "version")) {
      return false;
    }
    if (m != magic) {
      return fail("magic", what);
    }
    if (version != kCodecVersion) {
      return fail("version", "is not supported");
    }
    return true;
  }
  bool fail(const char* field, const char* why) {
    if (error_.empty()) {
      error_ = fmt::format("`{}` {} (at byte {})", field, why, pos_);
    }
    pos_ = in_.size();
    failed_ = true;
    return false;
  }
  template <class T>
  Result<T> finish(T value, const char* what) {
    if (!failed_ && pos_ != in_.size()) {
      fail("end", "is followed by trailing bytes");
    }
    if (failed_) {
      return invalid("malformed {}: {}", what, error_);
    }
    return value;
  }

 private:
  size_t left() const { return in_.size() - pos_; }
  bool raw(void* p, size_t n, const char* field) {
    if (failed_) {
      return false;
    }
    if (n > left()) {
      return fail(field, "is cut short");
    }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }

  std::string_view in_;
  size_t pos_ = 0;
  bool failed_ = false;
  std::string error_;
};

void encode_spec(Writer& w, const SandboxSpec& s) {
  w.strings(s.argv, "argv");
  w.strings(s.env, "env");
  w.str(s.root, "root");
  w.str(s.cwd, "cwd");
  w.strings(s.read_only_paths, "read_only_paths");
  w.strings(s.extra_masked_paths, "extra_masked_paths");
  w.u32(static_cast<uint32_t>(s.network));
  w.u32(s.inside_uid);
  w.u32(s.inside_gid);
  w.boolean(s.tty);
  w.u32(s.tty_cols);
  w.u32(s.tty_rows);
  w.str(s.hostname, "hostname");
  w.u64(s.tmp_size_bytes);
  w.u64(s.inotify_instances);
  w.u64(s.inotify_watches);
  if (w.count(s.rlimits.size(), "rlimits")) {
    for (const Rlimit& r : s.rlimits) {
      w.i32(r.resource);
      w.u64(r.soft);
      w.u64(r.hard);
    }
  }
  w.boolean(s.allow_ptrace);
  w.boolean(s.allow_netlink_route);
  w.u32(s.disabled_walls);
  w.u64(s.exec_dev);
  w.u64(s.exec_ino);
  w.boolean(s.root_read_only);
  w.boolean(s.reads_root_and_system_only);
  if (w.count(s.read_only_ids.size(), "read_only_ids")) {
    for (const auto& [dev, ino] : s.read_only_ids) {
      w.u64(dev);
      w.u64(ino);
    }
  }
}

bool decode_spec(Reader& r, SandboxSpec& s) {
  uint32_t network = 0, n_rlimits = 0;
  bool ok = r.strings(s.argv, "argv") && r.strings(s.env, "env") && r.str(s.root, "root") &&
            r.str(s.cwd, "cwd") && r.strings(s.read_only_paths, "read_only_paths") &&
            r.strings(s.extra_masked_paths, "extra_masked_paths") && r.u32(network, "network");
  if (!ok) {
    return false;
  }
  switch (static_cast<NetworkMode>(network)) {
    case NetworkMode::kNone:
    case NetworkMode::kHost:
      s.network = static_cast<NetworkMode>(network);
      break;
    default:
      return r.fail("network", "is not a known network mode");
  }
  static_assert(sizeof(uid_t) == sizeof(uint32_t) && sizeof(gid_t) == sizeof(uint32_t));
  uint32_t cols = 0, rows = 0;
  ok = r.u32(s.inside_uid, "inside_uid") && r.u32(s.inside_gid, "inside_gid") &&
       r.boolean(s.tty, "tty") && r.u32(cols, "tty_cols") && r.u32(rows, "tty_rows") &&
       r.str(s.hostname, "hostname") && r.u64(s.tmp_size_bytes, "tmp_size_bytes") &&
       r.u64(s.inotify_instances, "inotify_instances") &&
       r.u64(s.inotify_watches, "inotify_watches") &&
       r.count(n_rlimits, sizeof(int32_t) + 2 * sizeof(uint64_t), "rlimits");
  if (!ok) {
    return false;
  }
  if (cols > 0xFFFF || rows > 0xFFFF) {
    return r.fail("tty_cols", "is larger than a terminal size can be");
  }
  s.tty_cols = static_cast<uint16_t>(cols);
  s.tty_rows = static_cast<uint16_t>(rows);
  s.rlimits.clear();
  s.rlimits.reserve(n_rlimits);
  for (uint32_t i = 0; i < n_rlimits; ++i) {
    int32_t resource = 0;
    uint64_t soft = 0, hard = 0;
    if (!r.i32(resource, "rlimits") || !r.u64(soft, "rlimits") || !r.u64(hard, "rlimits")) {
      return false;
    }
    static_assert(std::is_same_v<rlim_t, uint64_t> || sizeof(rlim_t) == sizeof(uint64_t));
    s.rlimits.push_back({resource, static_cast<rlim_t>(soft), static_cast<rlim_t>(hard)});
  }
  uint32_t n_ids = 0;
  if (!(r.boolean(s.allow_ptrace, "allow_ptrace") &&
        r.boolean(s.allow_netlink_route, "allow_netlink_route") &&
        r.u32(s.disabled_walls, "disabled_walls") && r.u64(s.exec_dev, "exec_dev") &&
        r.u64(s.exec_ino, "exec_ino") && r.boolean(s.root_read_only, "root_read_only") &&
        r.boolean(s.reads_root_and_system_only, "reads_root_and_system_only") &&
        r.count(n_ids, 2 * sizeof(uint64_t), "read_only_ids"))) {
    return false;
  }
  if (n_ids > s.read_only_paths.size()) {
    return r.fail("read_only_ids", "has more entries than read_only_paths");
  }
  s.read_only_ids.clear();
  for (uint32_t i = 0; i < n_ids; ++i) {
    uint64_t dev = 0, ino = 0;
    if (!r.u64(dev, "read_only_ids") || !r.u64(ino, "read_only_ids")) {
      return false;
    }
    s.read_only_ids.emplace_back(dev, ino);
  }
  return true;
}

}  // namespace

Result<std::string> encode_spawn_request(const SpawnRequestBody& b) {
  Writer w;
  w.u32(kRequestCodecMagic);
  w.u32(kCodecVersion);
  encode_spec(w, b.spec);
  w.str(b.seccomp_profile_path, "seccomp_profile_path");
  w.str(b.init_path, "init_path");
  w.u32(b.host_id);
  w.boolean(b.cgroupns_at_clone);
  return std::move(w).finish();
}

Result<SpawnRequestBody> decode_spawn_request(std::string_view bytes) {
  Reader r(bytes);
  SpawnRequestBody b;
  (void)(r.expect_magic(kRequestCodecMagic, "is not a spawn request") && decode_spec(r, b.spec) &&
         r.str(b.seccomp_profile_path, "seccomp_profile_path") && r.str(b.init_path, "init_path") &&
         r.u32(b.host_id, "host_id") && r.boolean(b.cgroupns_at_clone, "cgroupns_at_clone"));
  return r.finish(std::move(b), "spawn request");
}

Result<std::string> encode_spawn_result(const SpawnResultBody& b) {
  Writer w;
  w.u32(kResultCodecMagic);
  w.u32(kCodecVersion);
  const AppliedFeatures& a = b.applied;
  w.boolean(a.user_namespace);
  w.boolean(a.idmapped_root);
  w.str(a.idmap_fallback, "idmap_fallback");
  w.boolean(a.network_namespace);
  w.i32(a.landlock_abi);
  w.boolean(a.landlock_scopes);
  w.boolean(a.seccomp_profile);
  w.boolean(a.seccomp_fixed);
  w.boolean(a.pinned_executable);
  w.str(a.interpreter, "interpreter");
  w.strings(a.warnings, "warnings");
  w.strings(b.argv, "argv");
  return std::move(w).finish();
}

Result<SpawnResultBody> decode_spawn_result(std::string_view bytes) {
  Reader r(bytes);
  SpawnResultBody b;
  AppliedFeatures& a = b.applied;
  (void)(r.expect_magic(kResultCodecMagic, "is not a spawn result") &&
         r.boolean(a.user_namespace, "user_namespace") &&
         r.boolean(a.idmapped_root, "idmapped_root") && r.str(a.idmap_fallback, "idmap_fallback") &&
         r.boolean(a.network_namespace, "network_namespace") &&
         r.i32(a.landlock_abi, "landlock_abi") && r.boolean(a.landlock_scopes, "landlock_scopes") &&
         r.boolean(a.seccomp_profile, "seccomp_profile") &&
         r.boolean(a.seccomp_fixed, "seccomp_fixed") &&
         r.boolean(a.pinned_executable, "pinned_executable") &&
         r.str(a.interpreter, "interpreter") && r.strings(a.warnings, "warnings") &&
         r.strings(b.argv, "argv"));
  return r.finish(std::move(b), "spawn result");
}

}  // namespace cordon::sandbox
