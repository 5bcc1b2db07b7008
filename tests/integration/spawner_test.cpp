#define BOOST_TEST_MODULE spawner
#include "sandbox/spawner.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/strings.hpp"
#include "base/unique_fd.hpp"
#include "helpers/process.hpp"
#include "helpers/spawner_fixture.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/spec_codec.hpp"
#include "sandbox/status.hpp"
#include "sandbox/userns.hpp"

using namespace cordon;
using namespace cordon::sandbox;
using cordon::test::readable;

namespace {

template <class R>
std::string why(const R& r) {
  return r.has_value() ? std::string() : r.error().message();
}

std::string bin_dir() {
  const char* b = std::getenv("CORDON_BIN");
  std::string bin = b ? b : "build/cordon";
  return std::filesystem::path(bin).parent_path().string();
}
std::string spawner_bin() {
  const char* s = std::getenv("CORDON_SPAWNER");
  return s ? s : bin_dir() + "/cordon-spawner";
}

// Everything on a pipe until EOF (bounded).
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    if (!readable(fd)) {
      return out + "<timeout>";
    }
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

// The next status record; nullopt on EOF or timeout.
std::optional<StatusRecord> next_record(int fd) {
  if (!readable(fd)) {
    return std::nullopt;
  }
  StatusRecord rec{};
  ssize_t n = ::recv(fd, &rec, sizeof rec, 0);
  if (n != static_cast<ssize_t>(sizeof rec)) {
    return std::nullopt;
  }
  return rec;
}

std::optional<StatusRecord> wait_record(int fd, RecordKind kind) {
  for (;;) {
    auto rec = next_record(fd);
    if (!rec || rec->kind == kind) {
      return rec;
    }
  }
}

size_t count_fds(pid_t pid) {
  size_t n = 0;
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

// Children of `parent` by state, from /proc/*/stat ("pid (comm) S ppid ...").
struct Children {
  int total = 0, zombies = 0;
};
Children children_of(pid_t parent) {
  Children c;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    std::string stat = read_small_file(e.path() / "stat").value_or("");
    size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 4 >= stat.size()) {
      continue;
    }
    char state = stat[close + 2];
    pid_t ppid = static_cast<pid_t>(std::strtol(stat.c_str() + close + 4, nullptr, 10));
    if (ppid == parent) {
      ++c.total;
      c.zombies += state == 'Z' ? 1 : 0;
    }
  }
  return c;
}

// Each test's scratch root, cgroups and uid lease (tests/helpers/spawner_fixture.hpp).
struct Fixture : test::SpawnerFixture {
  Fixture() : SpawnerFixture("spawner") {}
};

SpawnerClient start_spawner() {
  auto c = SpawnerClient::start(spawner_bin());
  BOOST_REQUIRE_MESSAGE(c.has_value(), why(c));
  return std::move(*c);
}

// A request that fails in prepare (no child is cloned): a cheap round trip after which the
// spawner has run its reap loop.
void round_trip(SpawnerClient& client, Fixture& fx, const JobCgroup& cg) {
  auto r = client.spawn(fx.request(cg, {"/nonexistent/program"}));
  BOOST_REQUIRE(!r.has_value());
}

// Runs a command to completion: stdout, the exit record, the pidfd.
struct Ran {
  std::string out;
  std::optional<StatusRecord> exited;
  bool pidfd_readable = false;
};
Ran run_to_end(SpawnerClient::Reply& reply) {
  Ran ran;
  reply.stdin_write.reset();
  ran.out = read_all(reply.stdout_read.get());
  ran.exited = wait_record(reply.status.get(), RecordKind::kCommandExited);
  ran.pidfd_readable = readable(reply.pidfd.get());
  return ran;
}

}  // namespace

BOOST_AUTO_TEST_CASE(refuses_to_run_without_its_socket) {
  auto r = test::run_process({spawner_bin()});
  BOOST_TEST(r.exit_code() == 2);
  BOOST_TEST(r.err.find("SOCK_SEQPACKET") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(spawns_echo_and_reaps_its_init) {
  Fixture fx;
  auto client = start_spawner();
  BOOST_TEST(client.pid() > 0);
  auto cg = fx.cgroup();
  auto reply = client.spawn(fx.request(cg, {"/bin/echo", "hi"}));
  BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
  BOOST_TEST(reply->pid > 0);
  BOOST_TEST(reply->argv == std::vector<std::string>({"/bin/echo", "hi"}),
             boost::test_tools::per_element());
  BOOST_TEST(reply->applied.landlock_abi > 0);
  BOOST_TEST(reply->applied.user_namespace);
  BOOST_REQUIRE(reply->stdout_read.valid());
  BOOST_REQUIRE(reply->stderr_read.valid());
  BOOST_REQUIRE(reply->stdin_write.valid());
  // The init is the spawner's child, not ours.
  BOOST_TEST(::waitpid(reply->pid, nullptr, WNOHANG) == -1);
  BOOST_TEST(errno == ECHILD);

  Ran ran = run_to_end(*reply);
  BOOST_TEST(ran.out == "hi\n");
  BOOST_REQUIRE(ran.exited.has_value());
  BOOST_TEST(WIFEXITED(ran.exited->wait_status));
  BOOST_TEST(WEXITSTATUS(ran.exited->wait_status) == 0);
  BOOST_TEST(ran.pidfd_readable);
  // The init ran in the job cgroup (CLONE_INTO_CGROUP), so its CPU time was charged there.
  auto usage = cg.usage();
  BOOST_REQUIRE_MESSAGE(usage.has_value(), why(usage));
  BOOST_TEST(usage->cpu_usec > 0u);

  // The init exited (its pidfd is readable): after one more round trip the spawner has reaped
  // it, so it left no zombie, and it has no other child.
  round_trip(client, fx, cg);
  Children c = children_of(client.pid());
  BOOST_TEST(c.zombies == 0);
  BOOST_TEST(c.total == 0);
  BOOST_TEST(!std::filesystem::exists("/proc/" + std::to_string(reply->pid)));
}

BOOST_AUTO_TEST_CASE(fifty_spawns_leak_no_descriptor) {
  Fixture fx;
  auto client = start_spawner();
  auto warm_cg = fx.cgroup();
  round_trip(client, fx, warm_cg);  // the profile and init filter are compiled and cached
  size_t ours = count_fds(::getpid());
  size_t theirs = count_fds(client.pid());
  for (int i = 0; i < 50; ++i) {
    auto cg = fx.cgroup();
    auto reply = client.spawn(fx.request(cg, {"/bin/echo", std::to_string(i)}));
    BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
    Ran ran = run_to_end(*reply);
    BOOST_REQUIRE_EQUAL(ran.out, std::to_string(i) + "\n");
    BOOST_REQUIRE(ran.exited.has_value());
    BOOST_REQUIRE(ran.pidfd_readable);
  }
  round_trip(client, fx, warm_cg);
  BOOST_TEST(count_fds(::getpid()) == ours);
  BOOST_TEST(count_fds(client.pid()) == theirs);
  BOOST_TEST(children_of(client.pid()).total == 0);
}

BOOST_AUTO_TEST_CASE(setup_failures_come_back_as_errors) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  {
    UniqueFd file(::open((fx.root + "/file").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    BOOST_REQUIRE(file.valid());
    auto req = fx.request(cg, {"/bin/true"});
    req.spec.cwd = fx.root + "/file";
    auto reply = client.spawn(req);
    BOOST_REQUIRE(!reply.has_value());
    BOOST_TEST(reply.error().sys_errno() == ENOTDIR);
    BOOST_TEST(reply.error().message().find("cwd") != std::string::npos, reply.error().message());
  }
  {
    auto reply = client.spawn(fx.request(cg, {"/bin/no-such-program"}));
    BOOST_REQUIRE(!reply.has_value());
    BOOST_TEST(reply.error().message().find("/bin/no-such-program") != std::string::npos,
               reply.error().message());
  }
  {
    auto req = fx.request(cg, {"/bin/true"});
    req.host_id = 0;
    auto reply = client.spawn(req);
    BOOST_REQUIRE(!reply.has_value());
    BOOST_TEST((reply.error().code() == ErrorCode::kRefused));
  }
  {
    // A v1 descriptor that is not a cgroup directory.
    auto req = fx.request(cg, {"/bin/true"});
    UniqueFd tmp(::open(fx.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    req.cgroup_v1_fds.push_back(tmp.get());
    auto reply = client.spawn(req);
    BOOST_REQUIRE(!reply.has_value());
    BOOST_TEST(reply.error().message().find("v1 cgroup") != std::string::npos,
               reply.error().message());
  }
  // A /tmp size tmpfs would read as no limit: 0, and one whose page count wraps to 0.
  for (uint64_t size : {uint64_t{0}, ~uint64_t{0} - 4096, (uint64_t{1} << 40) + 1}) {
    auto req = fx.request(cg, {"/bin/true"});
    req.spec.tmp_size_bytes = size;
    auto reply = client.spawn(req);
    BOOST_REQUIRE(!reply.has_value());
    BOOST_TEST(reply.error().message().find("tmp_size_bytes") != std::string::npos,
               reply.error().message());
  }
  // After all of them it still serves.
  auto reply = client.spawn(fx.request(cg, {"/bin/echo", "still"}));
  BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
  BOOST_TEST(run_to_end(*reply).out == "still\n");
}

BOOST_AUTO_TEST_CASE(malformed_requests_get_errors_and_the_spawner_keeps_serving) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto garbage = client.spawn_encoded("garbage bytes", -1, {});
  BOOST_REQUIRE(!garbage.has_value());
  BOOST_TEST((garbage.error().code() == ErrorCode::kInvalid), garbage.error().message());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::string bytes(rng() % 4096, '\0');
    for (auto& ch : bytes) {
      ch = static_cast<char>(rng());
    }
    auto r = client.spawn_encoded(bytes, cg.v2_dirfd(), cg.v1_dirfds());
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST((r.error().code() == ErrorCode::kInvalid), r.error().message());
  }
  // A valid body cut short by one byte.
  SpawnRequestBody body;
  body.spec = fx.request(cg, {"/bin/true"}).spec;
  body.host_id = fx.lease->id();
  auto bytes = encode_spawn_request(body);
  BOOST_REQUIRE(bytes.has_value());
  auto cut = client.spawn_encoded(std::string_view(*bytes).substr(0, bytes->size() - 1), -1, {});
  BOOST_REQUIRE(!cut.has_value());
  BOOST_TEST(cut.error().message().find("cut short") != std::string::npos, cut.error().message());

  auto reply = client.spawn(fx.request(cg, {"/bin/echo", "hi"}));
  BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
  BOOST_TEST(run_to_end(*reply).out == "hi\n");
}

BOOST_AUTO_TEST_CASE(closing_the_client_ends_the_spawner_and_its_sandboxes) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto reply = client.spawn(fx.request(cg, {"/bin/sleep", "1000"}));
  BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
  auto started = wait_record(reply->status.get(), RecordKind::kCommandStarted);
  BOOST_REQUIRE(started.has_value());
  BOOST_TEST(!readable(reply->pidfd.get(), 0));  // sleeping
  // The spawner blocks SIGCHLD for its signalfd; the init must not inherit that mask.
  auto init_status = read_small_file("/proc/" + std::to_string(reply->pid) + "/status");
  BOOST_REQUIRE(init_status.has_value());
  BOOST_TEST(init_status->find("SigBlk:\t0000000000000000\n") != std::string::npos, *init_status);

  pid_t spawner = client.pid();
  auto status = client.stop();
  BOOST_REQUIRE_MESSAGE(status.has_value(), why(status));
  BOOST_TEST(WIFEXITED(*status));
  BOOST_TEST(WEXITSTATUS(*status) == 0);
  BOOST_TEST(!std::filesystem::exists("/proc/" + std::to_string(spawner)));
  // The sandbox died with it: its pidfd is readable, the command's stdout is closed.
  BOOST_TEST(readable(reply->pidfd.get()));
  BOOST_TEST(read_all(reply->stdout_read.get()).empty());
  auto populated = cg.populated();
  BOOST_REQUIRE_MESSAGE(populated.has_value(), why(populated));
  BOOST_TEST(!*populated);
  // A stopped client refuses further work instead of hanging.
  auto again = client.spawn(fx.request(cg, {"/bin/true"}));
  BOOST_TEST(!again.has_value());
}

BOOST_AUTO_TEST_CASE(destroying_the_client_kills_a_running_sandbox) {
  Fixture fx;
  auto cg = fx.cgroup();
  UniqueFd pidfd;
  {
    auto client = start_spawner();
    auto reply = client.spawn(fx.request(cg, {"/bin/sleep", "1000"}));
    BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
    BOOST_REQUIRE(wait_record(reply->status.get(), RecordKind::kCommandStarted).has_value());
    pidfd = std::move(reply->pidfd);
  }
  BOOST_TEST(readable(pidfd.get()));
}

BOOST_AUTO_TEST_CASE(large_argv_travels_in_memfds_both_ways) {
  // 64 arguments of 1000 bytes: the final argv (> kMaxInlineResult) comes back in a memfd.
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  std::vector<std::string> argv = {"/bin/echo"};
  for (int i = 0; i < 64; ++i) {
    argv.push_back(std::string(1000, static_cast<char>('a' + i % 26)));
  }
  auto reply = client.spawn(fx.request(cg, argv));
  BOOST_REQUIRE_MESSAGE(reply.has_value(), why(reply));
  BOOST_TEST(reply->argv == argv, boost::test_tools::per_element());
  std::string expected;
  for (size_t i = 1; i < argv.size(); ++i) {
    expected += argv[i] + (i + 1 < argv.size() ? " " : "\n");
  }
  BOOST_TEST(run_to_end(*reply).out == expected);
}
