#pragma once

// What the spawner and warm-pool tests share: a scratch root and state dir, cordon's cgroup
// parents, a host uid lease, fresh job cgroups and a spawn request for a command in the root.
// Talks to cordon-spawner directly (no engine).

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "helpers/cordon_fixture.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/spawner.hpp"
#include "sandbox/status.hpp"
#include "sandbox/userns.hpp"

namespace cordon::test {

// The error's message, or "" for a success (for BOOST_REQUIRE_MESSAGE).
template <class R>
std::string error_of(const R& r) {
  return r.has_value() ? std::string() : r.error().message();
}

// A bound for every wait, so a broken test fails, not hangs.
inline constexpr int kWaitMs = 20000;

// Whether `fd` has something to read (or its end) within `timeout_ms`.
inline bool readable(int fd, int timeout_ms = kWaitMs) {
  struct pollfd p {
    fd, POLLIN, 0
  };
  return ::poll(&p, 1, timeout_ms) == 1;
}

// Everything a pipe gives until EOF (bounded).
inline std::string drain(int fd) {
  std::string out;
  char buf[4096];
  while (readable(fd)) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// The status records until EOF (bounded).
inline std::vector<sandbox::StatusRecord> records_until_eof(int fd) {
  std::vector<sandbox::StatusRecord> out;
  while (readable(fd)) {
    sandbox::StatusRecord rec{};
    ssize_t n = ::recv(fd, &rec, sizeof rec, 0);
    if (n < 0 && errno == ECONNRESET) continue;
    if (n != static_cast<ssize_t>(sizeof rec)) break;
    out.push_back(rec);
  }
  return out;
}

// Removes what a killed test run left in `dir` (under /etc: its destructors never ran after a
// timeout's SIGKILL): each entry named `prefix`… whose last run of digits is the pid of a
// process that no longer exists.
inline void remove_dead_runs_scratch(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename();
    const size_t end = n.find_last_of("0123456789");
    if (!n.starts_with(prefix) || end == std::string::npos || end < prefix.size()) continue;
    const size_t begin = n.find_last_not_of("0123456789", end) + 1;
    const pid_t pid = static_cast<pid_t>(std::strtol(n.c_str() + begin, nullptr, 10));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
      std::filesystem::remove_all(e.path(), ec);
    }
  }
}

// The directory of the cordon binary under test: cordon-spawner, cordon-init and
// seccomp/default.json sit next to it.
inline std::string binaries_dir() {
  return std::filesystem::path(cordon_bin()).parent_path().string();
}

struct SpawnerFixture {
  std::string base, root, state;
  std::string prefix;  // of the job cgroups' names
  sandbox::CgroupLayout layout;
  std::optional<sandbox::HostIdLease> lease;
  int job = 0;

  explicit SpawnerFixture(const std::string& name) : prefix(name + "-it-") {
    std::string tmpl_s = "/var/tmp/cordon-" + name + "-it.XXXXXX";
    std::vector<char> tmpl(tmpl_s.begin(), tmpl_s.end());
    tmpl.push_back('\0');
    BOOST_REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    base = tmpl.data();
    ::chmod(base.c_str(), 0755);
    root = base + "/root";
    state = base + "/state";
    BOOST_REQUIRE(::mkdir(root.c_str(), 0755) == 0);
    BOOST_REQUIRE(::mkdir(state.c_str(), 0700) == 0);
    auto l = sandbox::detect_cgroup_layout();
    BOOST_REQUIRE_MESSAGE(l.has_value(), error_of(l));
    layout = *l;
    auto parents = sandbox::prepare_parents(layout);
    BOOST_REQUIRE_MESSAGE(parents.has_value(), error_of(parents));
    auto h = sandbox::HostIdLease::acquire();
    BOOST_REQUIRE_MESSAGE(h.has_value(), error_of(h));
    lease.emplace(std::move(*h));
  }
  ~SpawnerFixture() {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
  }
  SpawnerFixture(const SpawnerFixture&) = delete;
  SpawnerFixture& operator=(const SpawnerFixture&) = delete;

  // A fresh job cgroup set with no limits, named after this test process.
  sandbox::JobCgroup cgroup() {
    auto c = sandbox::JobCgroup::create(
        layout, prefix + std::to_string(::getpid()) + "-" + std::to_string(job++), {});
    BOOST_REQUIRE_MESSAGE(c.has_value(), error_of(c));
    return std::move(*c);
  }
  std::vector<int> v1_fds(const sandbox::JobCgroup& cg) const {
    return layout.mode == sandbox::CgroupMode::kHybrid ? cg.v1_dirfds() : std::vector<int>{};
  }
  std::string profile() const { return binaries_dir() + "/seccomp/default.json"; }

  // A spawn of `argv` in the root, as the engine would send it; `slot` names a parked
  // sandbox (warm pool) to run it in (0: none).
  sandbox::SpawnerClient::Request request(const sandbox::JobCgroup& cg,
                                          std::vector<std::string> argv, uint64_t slot = 0) const {
    sandbox::SpawnerClient::Request r;
    r.spec.argv = std::move(argv);
    r.spec.env = {"PATH=/usr/bin:/bin", "HOME=/tmp/home"};
    r.spec.root = root;
    r.spec.cwd = root;
    r.seccomp_profile_path = profile();
    r.init_path = binaries_dir() + "/cordon-init";
    r.host_id = lease->id();
    r.cgroup_v2_fd = cg.v2_dirfd();
    r.cgroup_v1_fds = v1_fds(cg);
    r.cgroupns_at_clone = layout.mode == sandbox::CgroupMode::kUnified;
    r.pool_slot = slot;
    return r;
  }
};

}  // namespace cordon::test
