#pragma once

// An Engine on a fresh state dir with a policy whose cwdRoot is a fresh working root, plus
// the checks the engine behaviour tests share: decode byte pages, hash files, find processes
// of the job's host uids, wait on a condition with a deadline.

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/sha256.hpp"
#include "cordon/engine.hpp"
#include "helpers/cordon_fixture.hpp"
#include "sandbox/cgroup.hpp"

namespace cordon::test {

// A /proc file read with read(2): a process that exits meanwhile makes the read fail (ESRCH),
// which libstdc++'s filebuf turns into an exception; here it is an empty or short string.
inline std::string read_proc_file(const std::string& path) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// How many of this process's fds refer to a mount namespace ("mnt:[ino]"): the one numbered
// `ino`, or any. The engine holds one for each running job until its releaser drops it after
// the job's teardown.
inline size_t fds_on_mount_ns(std::optional<ino_t> ino = std::nullopt) {
  const std::string prefix = ino ? "mnt:[" + std::to_string(*ino) + "]" : "mnt:[";
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink(e.path(), ec).string();
    n += !ec && (ino ? target == prefix : target.starts_with(prefix));
  }
  return n;
}

// The value of one "Name:\tvalue" line of /proc/<pid>/status ("" when it is not there).
inline std::string status_field(const std::string& status, const std::string& name) {
  std::istringstream in(status);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":\t", 0) == 0) return line.substr(name.size() + 2);
  }
  return {};
}

inline std::string status_field(pid_t pid, const std::string& name) {
  return status_field(read_proc_file("/proc/" + std::to_string(pid) + "/status"), name);
}

// How many pid namespaces a process is in (the fields of its NSpid line).
inline size_t pid_ns_depth(const std::string& status) {
  std::istringstream in(status_field(status, "NSpid"));
  size_t n = 0;
  for (std::string pid; in >> pid;) ++n;
  return n;
}

inline std::string build_dir() {
  std::string bin = cordon_bin();
  return bin.substr(0, bin.rfind('/'));
}

// Host uids for one test's sandboxes: a private block outside the default range, so the
// "no process of the job's uid is left" checks never see another run's sandboxes. Each block
// is held (an flock on /run/cordon-test-id-blocks/N) by the process that drew it until it
// exits: drawn at random alone, two tests running at once could share one and see each
// other's sandboxes (a likely cause of one tools/test.sh run, session 28, in which
// engine_settle took a process that was not its job's init, 20 rounds of 20).
inline constexpr uint32_t kPrivateHostIdBlock = 4096;  // ids a test may lease at most
inline constexpr uint32_t kPrivateHostIdBlocks = 1024;
inline uint32_t private_host_id_base() {
  static std::mutex mu;
  static std::vector<int> held;  // open until the process exits, which lets the blocks go
  const std::string dir = "/run/cordon-test-id-blocks";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw std::runtime_error("mkdir " + dir + ": " + std::strerror(errno));
  }
  std::random_device rd;
  for (uint32_t tries = 0; tries < 4 * kPrivateHostIdBlocks; ++tries) {
    const uint32_t block = rd() % kPrivateHostIdBlocks;
    const std::string path = dir + "/" + std::to_string(block);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      throw std::runtime_error("open " + path + ": " + std::strerror(errno));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::lock_guard<std::mutex> lock(mu);
      held.push_back(fd);
      return 0x72000000u + block * kPrivateHostIdBlock;
    }
    ::close(fd);
  }
  throw std::runtime_error("no free host-id block in " + dir);
}

struct EngineEnv {
  Sandbox box;  // base/root and base/state
  std::string policy_path;
  std::string state_dir;
  nlohmann::json policy;
  uint32_t host_id_base = private_host_id_base();
  uint32_t host_id_count = 256;  // up to kPrivateHostIdBlock

  explicit EngineEnv(nlohmann::json extra = nlohmann::json::object()) {
    policy = {{"allowedExecutables",
               {"/bin/sh", "/usr/bin/sh", "/bin/echo", "/usr/bin/echo", "/bin/cat", "/usr/bin/cat",
                "/bin/sleep", "/usr/bin/sleep", "/usr/bin/head", "/usr/bin/yes", "/usr/bin/env",
                "/usr/bin/python3", "/usr/bin/true", "/bin/true", "/usr/bin/git", "/bin/dd"}},
              {"cwdRoot", box.root}};
    for (auto& [k, v] : extra.items()) policy[k] = v;
    policy_path = box.base + "/policy.json";
    state_dir = box.state;
    write_policy();
  }

  void write_policy() const { std::ofstream(policy_path) << policy.dump(2); }

  EngineOptions options() const {
    EngineOptions o;
    o.state_dir = state_dir;
    o.policy_path = policy_path;
    o.spawner_path = build_dir() + "/cordon-spawner";
    o.init_path = build_dir() + "/cordon-init";
    o.default_seccomp_profile = build_dir() + "/seccomp/default.json";
    o.host_id_base = host_id_base;
    o.host_id_count = host_id_count;
    return o;
  }

  Result<std::unique_ptr<Engine>> open() const { return Engine::open(options()); }

  std::string job_dir(const std::string& id) const { return state_dir + "/jobs/" + id; }
  std::string artifact_path(const std::string& artifact_id) const {
    return state_dir + "/artifacts/" + artifact_id;
  }

  // The processes running as one of this engine's host ids in a pid namespace below ours:
  // its jobs' sandboxes. The warm pool's parked sandboxes (no job in them yet) are not
  // counted, nor what runs as a host id in our own pid namespace: the engine's spawners
  // (which switch their effective uid to a host id around each clone3) and a spawner's idmap
  // helper (alive for the microseconds it takes to map its user namespace). A sandbox is
  // always in a new one; a process that exited meanwhile has no status and no depth.
  std::vector<pid_t> sandbox_pids() const {
    std::vector<pid_t> out;
    const size_t our_depth = pid_ns_depth(read_proc_file("/proc/self/status"));
    DIR* d = ::opendir("/proc");
    if (d == nullptr) return out;
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const std::string status = read_proc_file(std::string("/proc/") + e->d_name + "/status");
      // A zombie runs nothing and holds nothing; it waits for whoever reaps orphans.
      if (status_field(status, "State").find('Z') != std::string::npos) continue;
      if (pid_ns_depth(status) <= our_depth) continue;
      std::istringstream ids(status_field(status, "Uid"));
      uint64_t id;
      while (ids >> id) {
        if (id >= host_id_base && id < host_id_base + host_id_count) {
          out.push_back(static_cast<pid_t>(std::stol(e->d_name)));
          break;
        }
      }
    }
    ::closedir(d);
    // Read after the scan: a sandbox parked before it was recorded as an entry before it
    // was born, so it is in this list.
    std::vector<pid_t> parked = sandbox::parked_pool_pids(state_dir + "/cgroups");
    std::erase_if(
        out, [&](pid_t p) { return std::find(parked.begin(), parked.end(), p) != parked.end(); });
    return out;
  }
};

inline std::string why(const Error& e) { return e.message(); }

template <class T>
std::string describe(const Result<T>& r) {
  return r ? std::string("ok") : r.error().message();
}

inline std::unique_ptr<Engine> open_engine(const EngineEnv& env) {
  auto e = env.open();
  if (!e) {
    throw std::runtime_error("Engine::open: " + e.error().message());
  }
  return std::move(*e);
}

// Polls `pred` until it holds or `timeout` passes; the engine offers no event for "output
// grew", so a bounded poll is the honest way to observe a running job from outside.
inline bool eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

inline std::string base64_decode(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int v = val(c);
    if (v < 0) throw std::runtime_error("bad base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline std::string sha256_hex(const std::string& bytes) {
  Sha256 h;
  h.update(bytes);
  return Sha256::hex(h.finish());
}

// Every byte of a stream, paged in `bytes` units and decoded, checking the page fields.
inline std::string read_all_bytes(Engine& e, const std::string& session, const std::string& id,
                                  const std::string& stream, uint64_t limit = 200000) {
  std::string all;
  uint64_t off = 0;
  for (int guard = 0; guard < 100000; ++guard) {
    auto p = e.output(
        session, id, {.stream = stream, .offset = off, .limit = limit, .unit = OutputUnit::kBytes});
    if (!p) throw std::runtime_error("output: " + p.error().message());
    if (!p->base64 || p->offset != off) throw std::runtime_error("bad page header");
    std::string bytes = base64_decode(p->content);
    if (bytes.size() > limit || p->next_offset != off + bytes.size()) {
      throw std::runtime_error("page size does not match its offsets");
    }
    all += bytes;
    off = p->next_offset;
    if (!p->has_more) break;
  }
  return all;
}

}  // namespace cordon::test
