#define BOOST_TEST_MODULE pool
// The warm pool: placeholders parked in fresh job cgroups by the spawner, a sandbox born
// inside them, each slot used once, and nothing left behind — by a used entry, an unused one,
// a dead spawner or a SIGKILLed engine.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/strings.hpp"
#include "helpers/engine_fixture.hpp"
#include "helpers/engine_host.hpp"
#include "helpers/spawner_fixture.hpp"
#include "sandbox/cgroup.hpp"
#include "sandbox/spawner.hpp"
#include "sandbox/status.hpp"
#include "sandbox/userns.hpp"
#include "sys/syscalls.hpp"

using namespace cordon;
using namespace cordon::sandbox;
using namespace cordon::test;

namespace fs = std::filesystem;

namespace {

constexpr int kWaitMs = 20000;  // a bound for every wait, so a broken test fails, not hangs

template <class R>
std::string msg(const R& r) {
  return r.has_value() ? std::string() : r.error().message();
}

bool readable(int fd, int timeout_ms = kWaitMs) {
  struct pollfd p {
    fd, POLLIN, 0
  };
  return ::poll(&p, 1, timeout_ms) == 1;
}

std::set<pid_t> procs_of(const std::string& cgroup_dir) {
  std::set<pid_t> out;
  std::istringstream in(read_small_file(cgroup_dir + "/cgroup.procs").value_or(""));
  pid_t pid;
  while (in >> pid) {
    out.insert(pid);
  }
  return out;
}

pid_t parent_of(pid_t pid) {
  std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat").value_or("");
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 4 >= stat.size()) {
    return -1;
  }
  return static_cast<pid_t>(std::strtol(stat.c_str() + close + 4, nullptr, 10));
}

UniqueFd pidfd_of(pid_t pid) {
  UniqueFd fd(sys::pidfd_open(pid, 0));
  BOOST_REQUIRE_MESSAGE(fd.valid(), "pidfd_open " << pid << ": " << errno_name(errno));
  return fd;
}

// Each test's scratch root, cgroups and uid lease (tests/helpers/spawner_fixture.hpp).
struct Fixture : test::SpawnerFixture {
  Fixture() : SpawnerFixture("pool") {}

  SpawnerClient::PoolSlot park(SpawnerClient& client, const JobCgroup& cg) {
    auto slot = client.pool_add(profile(), false, cg.v2_dirfd(), v1_fds(cg));
    BOOST_REQUIRE_MESSAGE(slot.has_value(), msg(slot));
    BOOST_REQUIRE(slot->placeholder > 0);
    return *slot;
  }
};

SpawnerClient start_spawner() {
  auto c = SpawnerClient::start(build_dir() + "/cordon-spawner");
  BOOST_REQUIRE_MESSAGE(c.has_value(), msg(c));
  return std::move(*c);
}

// The placeholder has moved itself into every cgroup of its entry (bounded poll: the
// placement finishes on its own schedule and announces it only to the spawner).
bool placed(const JobCgroup& cg, pid_t placeholder) {
  return eventually([&] {
    for (const auto& p : cg.paths()) {
      if (!procs_of(p).contains(placeholder)) {
        return false;
      }
    }
    return true;
  });
}

// Records in a state dir: name → the cgroup paths it lists.
std::map<std::string, std::vector<std::string>> records_in(const std::string& dir) {
  std::map<std::string, std::vector<std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename();
    if (!name.ends_with(".cgroups")) continue;
    std::vector<std::string> paths;
    std::istringstream in(read_small_file(e.path()).value_or(""));
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) paths.push_back(line);
    }
    out[name.substr(0, name.size() - 8)] = paths;
  }
  return out;
}

// The placeholders of the pool entries recorded in `records` that are placed (the only
// process of their entry's last cgroup), by pid → the entry's record name.
std::map<pid_t, std::string> placed_placeholders(const std::string& records) {
  std::map<pid_t, std::string> out;
  for (const auto& [name, ps] : records_in(records)) {
    if (!is_pool_cgroup_name(name) || ps.empty()) continue;
    auto procs = procs_of(ps.back());
    if (procs.size() == 1) out[*procs.begin()] = name;
  }
  return out;
}

// Starts a `sleep` that prints first and waits until it printed: start() returns before the
// spawn, so from then on the spawn is complete (and a pooled placeholder gone).
std::string start_printed_sleep(Engine& e) {
  auto s = e.start("s", {.argv = {"/bin/sh", "-c", "echo up; exec sleep 1000"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  BOOST_REQUIRE(eventually([&] {
    auto st = e.status("s", s->task_id);
    return st && st->stdout_bytes > 0;
  }));
  return s->task_id;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pooled_sandbox_is_born_in_its_cgroups_without_the_placeholder) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto slot = fx.park(client, cg);
  BOOST_TEST(parent_of(slot.placeholder) == client.pid());
  // It moves itself into every cgroup of its entry, ahead of time.
  BOOST_REQUIRE(placed(cg, slot.placeholder));

  auto reply = client.spawn(fx.request(cg, {"/bin/sleep", "1000"}, slot.id));
  BOOST_REQUIRE_MESSAGE(reply.has_value(), msg(reply));
  BOOST_REQUIRE(reply->pid > 0);
  // The init is the spawner's own child (CLONE_PARENT): it reaps it, PDEATHSIG names it.
  BOOST_TEST(parent_of(reply->pid) == client.pid());
  // Born inside by inheritance: the clone3 took no CLONE_INTO_CGROUP (no cgroup_mutex).
  BOOST_TEST(read_small_file("/proc/" + std::to_string(reply->pid) + "/cgroup")
                 .value_or("")
                 .find(cg.paths()[0].substr(cg.paths()[0].rfind('/'))) != std::string::npos);
  // The placeholder is gone (reaped before the go byte), and the init is in every cgroup.
  BOOST_TEST(!fs::exists("/proc/" + std::to_string(slot.placeholder)));
  for (const auto& p : cg.paths()) {
    auto procs = procs_of(p);
    BOOST_TEST(procs.contains(reply->pid), p);
    BOOST_TEST(!procs.contains(slot.placeholder), p);
  }
  // It runs: the command started.
  StatusRecord rec{};
  BOOST_REQUIRE(readable(reply->status.get()));
  BOOST_REQUIRE(::recv(reply->status.get(), &rec, sizeof rec, 0) == sizeof rec);
  BOOST_TEST((rec.kind == RecordKind::kCommandStarted));

  // cgroup.kill through the job's cgroup ends it, and nothing is left to remove.
  auto destroyed = cg.destroy();
  BOOST_REQUIRE_MESSAGE(destroyed.has_value(), msg(destroyed));
  BOOST_TEST(readable(reply->pidfd.get()));
}

BOOST_AUTO_TEST_CASE(a_slot_is_spent_by_one_spawn) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto slot = fx.park(client, cg);
  auto first = client.spawn(fx.request(cg, {"/bin/true"}, slot.id));
  BOOST_REQUIRE_MESSAGE(first.has_value(), msg(first));
  BOOST_TEST(readable(first->pidfd.get()));

  // A spent or unknown slot starts nothing from a placeholder: the client falls back to an
  // unpooled spawn into the same cgroups.
  for (uint64_t id : {slot.id, uint64_t{987654321}}) {
    // A command that lives until it is looked at (one that exits at once may be gone first).
    auto again = client.spawn(fx.request(cg, {"/bin/sleep", "1000"}, id));
    BOOST_REQUIRE_MESSAGE(again.has_value(), msg(again));
    BOOST_TEST(parent_of(again->pid) == client.pid());
    // In every cgroup: v2 from clone3 on; v1 by the sandbox's own first step (it moves
    // itself, after the spawn returned).
    for (const auto& p : cg.paths()) {
      BOOST_TEST(eventually([&] { return procs_of(p).contains(again->pid); }), p);
    }
    BOOST_REQUIRE(cordon::sys::pidfd_send_signal(again->pidfd.get(), SIGKILL, nullptr, 0) == 0);
    BOOST_TEST(readable(again->pidfd.get()));
  }
  // Raw, the spawner says so with kReplySlotGone (spawn_encoded does not fall back).
  auto raw = client.spawn_encoded("x", -1, {}, slot.id);
  BOOST_REQUIRE(!raw.has_value());
  BOOST_TEST((raw.error().code() == ErrorCode::kNotFound), raw.error().message());
}

BOOST_AUTO_TEST_CASE(a_failed_pooled_spawn_leaves_nothing_in_the_cgroups) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto slot = fx.park(client, cg);
  auto r = client.spawn(fx.request(cg, {"/nonexistent/program"}, slot.id));
  BOOST_REQUIRE(!r.has_value());
  // The placeholder's own error, not a fallback's.
  BOOST_TEST(r.error().message().find("does not exist") != std::string::npos, r.error().message());
  BOOST_TEST(!fs::exists("/proc/" + std::to_string(slot.placeholder)));
  for (const auto& p : cg.paths()) {
    BOOST_TEST(procs_of(p).empty(), p);
  }
}

BOOST_AUTO_TEST_CASE(destroying_an_unused_entry_kills_its_placeholder) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto slot = fx.park(client, cg);
  auto pidfd = pidfd_of(slot.placeholder);
  BOOST_REQUIRE(placed(cg, slot.placeholder));
  auto paths = cg.paths();
  auto destroyed = cg.destroy();
  BOOST_REQUIRE_MESSAGE(destroyed.has_value(), msg(destroyed));
  BOOST_TEST(readable(pidfd.get()));
  for (const auto& p : paths) {
    BOOST_TEST(!fs::exists(p), p);
  }
  // Its slot is gone with it: nothing is started from it.
  auto raw = client.spawn_encoded("x", -1, {}, slot.id);
  BOOST_REQUIRE(!raw.has_value());
  BOOST_TEST((raw.error().code() == ErrorCode::kNotFound), raw.error().message());
}

BOOST_AUTO_TEST_CASE(placeholders_die_with_the_spawner) {
  Fixture fx;
  auto client = start_spawner();
  auto cg1 = fx.cgroup();
  auto cg2 = fx.cgroup();
  auto s1 = fx.park(client, cg1);
  auto s2 = fx.park(client, cg2);
  auto fd1 = pidfd_of(s1.placeholder);
  auto fd2 = pidfd_of(s2.placeholder);
  BOOST_REQUIRE(::kill(client.pid(), SIGKILL) == 0);
  BOOST_TEST(readable(fd1.get()));
  BOOST_TEST(readable(fd2.get()));
  (void)client.stop();
  for (auto* cg : {&cg1, &cg2}) {
    for (const auto& p : cg->paths()) {
      BOOST_TEST(procs_of(p).empty(), p);
    }
    auto destroyed = cg->destroy();
    BOOST_TEST(destroyed.has_value(), msg(destroyed));
  }
}

BOOST_AUTO_TEST_CASE(a_closed_engine_socket_ends_its_placeholders) {
  Fixture fx;
  auto client = start_spawner();
  auto cg = fx.cgroup();
  auto s = fx.park(client, cg);
  auto fd = pidfd_of(s.placeholder);
  auto stopped = client.stop();
  BOOST_REQUIRE_MESSAGE(stopped.has_value(), msg(stopped));
  BOOST_TEST(*stopped == 0);
  BOOST_TEST(readable(fd.get(), 0));
  auto destroyed = cg.destroy();
  BOOST_TEST(destroyed.has_value(), msg(destroyed));
}

BOOST_AUTO_TEST_CASE(engine_jobs_take_pool_entries_with_their_own_limits) {
  EngineEnv env(nlohmann::json{{"limits", {{"memoryBytes", 64 << 20}, {"pids", 64}}}});
  auto e = open_engine(env);
  std::string records = env.state_dir + "/cgroups";
  auto pool_entries = [&] {
    size_t n = 0;
    for (const auto& [name, ps] : records_in(records)) {
      n += is_pool_cgroup_name(name) ? 1 : 0;
    }
    return n;
  };
  const size_t size = EngineOptions{}.warm_pool_size;
  // Filled at open: entries recorded under pool names, each placeholder placed (in its last
  // cgroup) — a start takes only such an entry.
  BOOST_REQUIRE(eventually(
      [&] { return pool_entries() == size && placed_placeholders(records).size() == size; }));
  auto before = records_in(records);

  // (A starter thread takes the entry after start() returned.)
  const std::string id = start_printed_sleep(*e);
  // The job took an entry: its record carries its id and lists a pool's cgroups.
  auto now = records_in(records);
  BOOST_REQUIRE(now.contains(id));
  auto paths = now[id];
  BOOST_REQUIRE(!paths.empty());
  BOOST_TEST(before.contains(paths[0].substr(paths[0].rfind('/') + 1)));
  // Its limits are the job's; only the sandbox is in its cgroups (no placeholder).
  std::set<pid_t> v2 = procs_of(paths[0]);
  BOOST_TEST(!v2.empty());
  for (size_t i = 1; i < paths.size(); ++i) {
    const std::string& p = paths[i];
    if (fs::exists(p + "/memory.limit_in_bytes")) {
      BOOST_TEST(read_small_file(p + "/memory.limit_in_bytes").value_or("") ==
                 std::to_string(64 << 20) + "\n");
    }
    if (fs::exists(p + "/pids.max")) {
      BOOST_TEST(read_small_file(p + "/pids.max").value_or("") == "64\n");
    }
    BOOST_TEST((procs_of(p) == v2), p);
  }
  // The pool refills when a job settles (its placement must not hold up the job's own
  // cgroup.kill and rmdir), so one entry is missing while it runs.
  BOOST_TEST(pool_entries() == size - 1);

  auto k = e->kill("s", id, SIGKILL);
  BOOST_REQUIRE_MESSAGE(k.has_value(), describe(k));
  auto st = e->status("s", id, std::chrono::seconds(20));
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "killed");
  for (const auto& p : paths) {
    BOOST_TEST(!fs::exists(p), p);
  }
  BOOST_TEST(!records_in(records).contains(id));
  BOOST_TEST(eventually([&] { return pool_entries() == size; }));

  // Back to back, more jobs than the pool holds: each settles, each in fresh cgroups.
  std::set<std::string> seen;
  for (int i = 0; i < 6; ++i) {
    auto t = e->start("s", {.argv = {"/bin/sh", "-c", "echo up; read x; exit 3"},
                            .stdin_mode = StdinMode::kPipe});
    BOOST_REQUIRE_MESSAGE(t.has_value(), describe(t));
    // Running (so its record names its cgroups) until its stdin ends.
    BOOST_REQUIRE(eventually([&] {
      auto st = e->status("s", t->task_id);
      return st && st->stdout_bytes > 0;
    }));
    auto rec = records_in(records);
    BOOST_REQUIRE(rec.contains(t->task_id) && !rec[t->task_id].empty());
    BOOST_TEST(seen.insert(rec[t->task_id][0]).second, "cgroup reused: " << rec[t->task_id][0]);
    BOOST_REQUIRE(e->write("s", t->task_id, {.eof = true}).has_value());
    auto ts = e->status("s", t->task_id, std::chrono::seconds(20));
    BOOST_REQUIRE_MESSAGE(ts.has_value(), describe(ts));
    BOOST_TEST(ts->state == "exited");
    BOOST_TEST(ts->exit_code.value_or(-1) == 3);
  }

  // Closing the engine removes the unused entries: no cgroup, no record, no placeholder.
  BOOST_REQUIRE(eventually([&] { return pool_entries() == size; }));
  auto last = records_in(records);
  e.reset();
  for (const auto& [name, ps] : last) {
    for (const auto& p : ps) {
      BOOST_TEST(!fs::exists(p), p);
    }
  }
  BOOST_TEST(records_in(records).empty());
}

// Placeholders die (killed here; in life: a failed placement, an OOM kill). The pool then
// holds entries that can never be placed, the oldest at its front: a start must still take
// the placed entry behind them. (Before the fix, take() looked at the front entry only, and
// one dead placeholder turned every later start unpooled for the engine's life.)
BOOST_AUTO_TEST_CASE(dead_placeholders_at_the_front_do_not_block_the_pool) {
  EngineEnv env;
  auto e = open_engine(env);
  std::string records = env.state_dir + "/cgroups";
  const size_t size = EngineOptions{}.warm_pool_size;
  BOOST_REQUIRE(size >= 2);
  // Every entry placed: its placeholder in its last cgroup.
  std::map<pid_t, std::string> placeholders;  // pid -> the entry's record name
  BOOST_REQUIRE(
      eventually([&] { return (placeholders = placed_placeholders(records)).size() == size; }));
  // Entries are made one after another, so the newest has the highest pid: keep only it.
  std::string survivor = placeholders.rbegin()->second;
  for (auto it = placeholders.begin(); std::next(it) != placeholders.end(); ++it) {
    auto fd = pidfd_of(it->first);
    BOOST_REQUIRE(sys::pidfd_send_signal(fd.get(), SIGKILL, nullptr, 0) == 0);
    BOOST_REQUIRE(eventually([&] { return readable(fd.get()); }));
  }

  const std::string id = start_printed_sleep(*e);
  auto now = records_in(records);
  BOOST_REQUIRE(now.contains(id) && !now[id].empty());
  const std::string& first = now[id][0];
  BOOST_TEST(first.substr(first.rfind('/') + 1) == survivor, "the job ran in " << first);
  auto k = e->kill("s", id, SIGKILL);
  BOOST_REQUIRE_MESSAGE(k.has_value(), describe(k));
  auto st = e->status("s", id, std::chrono::seconds(20));
  BOOST_REQUIRE_MESSAGE(st.has_value(), describe(st));
  BOOST_TEST(st->state == "killed");
}

BOOST_AUTO_TEST_CASE(engine_without_a_pool_spawns_unpooled) {
  EngineEnv env;
  EngineOptions o = env.options();
  o.warm_pool = false;
  auto e = Engine::open(o);
  BOOST_REQUIRE_MESSAGE(e.has_value(), describe(e));
  BOOST_TEST(records_in(env.state_dir + "/cgroups").empty());
  auto s = (*e)->start("s", {.argv = {"/bin/sleep", "1000"}});
  BOOST_REQUIRE_MESSAGE(s.has_value(), describe(s));
  // Recorded by the starter thread, before it creates the cgroups.
  std::map<std::string, std::vector<std::string>> rec;
  BOOST_REQUIRE(eventually([&] {
    rec = records_in(env.state_dir + "/cgroups");
    return rec.contains(s->task_id) && !rec[s->task_id].empty();
  }));
  // Named after the job, as before the pool.
  BOOST_TEST(rec[s->task_id][0].ends_with("/" + s->task_id));
  (void)(*e)->kill("s", s->task_id, SIGKILL);
}

BOOST_AUTO_TEST_CASE(sigkilled_engine_leaves_no_placeholder_and_the_next_sweeps_its_pool) {
  EngineEnv env;
  std::vector<std::string> cgroups;
  std::vector<UniqueFd> placeholders;
  {
    EngineHost host(env);
    BOOST_REQUIRE_EQUAL(host.line(), "ready");
    // Every entry recorded and placed (its placeholder in its last cgroup): the start below
    // takes one rather than making cgroups of its own.
    BOOST_REQUIRE(eventually([&] {
      return placed_placeholders(env.state_dir + "/cgroups").size() ==
             EngineOptions{}.warm_pool_size;
    }));
    std::string job = host.ask("start exec sleep 1000");
    BOOST_REQUIRE_MESSAGE(job.rfind("t", 0) == 0, job);
    // The job's record (once a starter took its entry: start() returns before that) and the
    // entries left; the emptied slot refills once the job settles. Records read whole.
    std::map<std::string, std::vector<std::string>> recs;
    BOOST_REQUIRE(eventually([&] {
      recs = records_in(env.state_dir + "/cgroups");
      return recs.contains(job) &&
             std::all_of(recs.begin(), recs.end(), [](const auto& r) { return !r.second.empty(); });
    }));
    BOOST_REQUIRE(recs.size() == EngineOptions{}.warm_pool_size);
    for (const auto& [name, paths] : recs) {
      cgroups.insert(cgroups.end(), paths.begin(), paths.end());
      if (!is_pool_cgroup_name(name)) {
        continue;  // the job's
      }
      // The entry's placeholder, once it sits in its cgroup.
      std::set<pid_t> procs;
      BOOST_REQUIRE(eventually([&] { return !(procs = procs_of(paths[0])).empty(); }));
      BOOST_REQUIRE(procs.size() == 1);
      placeholders.push_back(pidfd_of(*procs.begin()));
    }
    host.sigkill();
  }
  // The spawner saw EOF (or died of its own PDEATHSIG) and took its placeholders with it.
  for (const auto& fd : placeholders) {
    BOOST_TEST(readable(fd.get()));
  }
  // The next engine on the state dir sweeps every cgroup the dead one recorded.
  auto e = open_engine(env);
  for (const auto& p : cgroups) {
    BOOST_TEST(!fs::exists(p), p);
  }
  BOOST_TEST(env.sandbox_pids().empty());
}
