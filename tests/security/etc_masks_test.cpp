// Security: where the /etc secret masks land. A sandbox is prepared (its masks computed from the
// host's /etc) and then built by its setup child, which binds each mask before pivot_root while
// it still sees the host's tree. These cases change the host's /etc between the two, as a host
// that updates /etc while a sandbox starts does, and read what the sandbox shows.
//
// Real sandboxes: PreparedSandbox::prepare and spawn_sandbox from this process (the engine's
// one-shot path), real namespaces, cgroups and seccomp; secrets in /etc of this host, removed
// after each case.
#define BOOST_TEST_MODULE security_etc_masks

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "base/scope_exit.hpp"
#include "base/strings.hpp"
#include "helpers/spawner_fixture.hpp"
#include "policy/seccomp_profile.hpp"
#include "sandbox/prepare.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/spawn.hpp"
#include "sandbox/status.hpp"

using namespace cordon;
using namespace cordon::sandbox;
using namespace cordon::test;

namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  BOOST_REQUIRE_MESSAGE(f.flush(), "write " << path);
}

// The seccomp programs of the shipped default profile, compiled once.
struct Programs {
  CompiledFilters filters;
  BpfProgram init;
  Programs() {
    auto profile = policy::load_seccomp_profile(std::string(CORDON_SECCOMP_DIR) + "/default.json");
    BOOST_REQUIRE_MESSAGE(profile.has_value(), error_of(profile));
    auto f = compile_filters(*profile, {});
    BOOST_REQUIRE_MESSAGE(f.has_value(), error_of(f));
    auto i = compile_init_filter();
    BOOST_REQUIRE_MESSAGE(i.has_value(), error_of(i));
    filters = std::move(*f);
    init = std::move(*i);
  }
  SeccompPrograms view() const {
    return {filters.profile.insns, filters.fixed.insns, init.insns, false};
  }
};

// What a sandbox did: its stdout, and the setup step that failed (with its errno), if one did.
struct Built {
  std::string out;
  bool setup_failed = false;
  SetupStep step{};
  int err = 0;
  int exit_code = -1;
};

// Prepares a sandbox running `script` (sh -c) with `masked` added to the masks, calls
// `between` (the host changing /etc after the masks were computed), then builds and runs it.
Built prepare_change_run(SpawnerFixture& fx, const std::string& script,
                         const std::vector<std::string>& masked,
                         const std::function<void()>& between) {
  static const Programs programs;
  auto cg = fx.cgroup();
  auto req = fx.request(cg, {"/bin/sh", "-c", script});
  req.spec.extra_masked_paths = masked;
  auto prepared =
      PreparedSandbox::prepare(req.spec, programs.view(), fx.lease->id(), req.init_path);
  BOOST_REQUIRE_MESSAGE(prepared.has_value(), error_of(prepared));
  between();
  SpawnOptions so;
  so.host_id = fx.lease->id();
  so.cgroup_fd = cg.v2_dirfd();
  so.cgroupns_at_clone = req.cgroupns_at_clone;
  so.v1_cgroup_dirs = fx.v1_fds(cg);
  auto spawned = spawn_sandbox(**prepared, so);
  BOOST_REQUIRE_MESSAGE(spawned.has_value(), error_of(spawned));
  (*prepared)->stdin_write.reset();
  Built b;
  b.out = drain((*prepared)->stdout_read.get());
  for (const StatusRecord& rec : records_until_eof((*prepared)->status_parent.get())) {
    if (rec.kind == RecordKind::kSetupError) {
      b.setup_failed = true;
      b.step = rec.step;
      b.err = rec.err;
    } else if (rec.kind == RecordKind::kCommandExited && WIFEXITED(rec.wait_status)) {
      b.exit_code = WEXITSTATUS(rec.wait_status);
    }
  }
  siginfo_t info{};
  BOOST_REQUIRE(::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(spawned->pidfd.get()),
                         &info, WEXITED) == 0);
  return b;
}

// A scratch directory under /etc named after this process, removed with everything in it.
// A run killed before its destructor (a timeout's SIGKILL) leaves one behind: those of
// processes that no longer exist are removed first.
struct EtcScratch {
  static constexpr const char* kPrefix = "cordon-etc-masks-";
  std::string top;
  explicit EtcScratch(const std::string& name)
      : top("/etc/" + std::string(kPrefix) + name + "-" + std::to_string(::getpid())) {
    remove_dead_runs_scratch("/etc", kPrefix);
    fs::create_directories(top);
  }
  ~EtcScratch() {
    std::error_code ec;
    fs::remove_all(top, ec);
  }
  EtcScratch(const EtcScratch&) = delete;
  EtcScratch& operator=(const EtcScratch&) = delete;
};

}  // namespace

// The masks are computed with the secret's directory a real one; before the setup child binds
// them, the host moves that directory aside and puts a symlink in its place, to another
// directory holding a file of the same name. The masked path then leads to that file. Failure
// fixed (session 28): the child's bind followed the symlink: an absolute one into the host's
// tree (the binds are made before pivot_root), where the mask landed, so the masked path read
// the other file's contents in the sandbox; a relative one onto that other file in the
// sandbox's /etc. The child now opens each mask's way beneath the new root with no symlink on
// it: the setup stops with ELOOP at the mask step and nothing runs.
BOOST_AUTO_TEST_CASE(a_secrets_directory_replaced_by_a_symlink_before_the_binds_stops_the_setup) {
  SpawnerFixture fx("etc-masks");
  for (bool absolute : {true, false}) {
    BOOST_TEST_CONTEXT((absolute ? "absolute" : "relative") << " symlink") {
      EtcScratch scratch("way");
      const std::string dir = scratch.top + "/keys", moved = scratch.top + "/keys.old",
                        other = scratch.top + "/other";
      fs::create_directories(dir);
      fs::create_directories(other);
      write_text(dir + "/secret", "top secret\n");
      write_text(other + "/secret", "other file\n");
      Built b = prepare_change_run(fx, "cat " + dir + "/secret", {dir + "/secret"}, [&] {
        BOOST_REQUIRE(::rename(dir.c_str(), moved.c_str()) == 0);
        BOOST_REQUIRE(::symlink(absolute ? other.c_str() : "other", dir.c_str()) == 0);
      });
      // With the absolute link the old code let the masked path read the other file; with the
      // relative one it masked that file, so only the three checks after this one catch it.
      BOOST_TEST(b.out.find("other file") == std::string::npos, b.out);
      BOOST_TEST(b.setup_failed, "the setup went on; the command printed `" << b.out << "`");
      BOOST_TEST((b.step == SetupStep::kMountEtcMask), step_name(b.step));
      BOOST_TEST(b.err == ELOOP, errno_name(b.err));
    }
  }
}

// The control: with /etc unchanged between prepare and build, the same sandbox runs and reads
// the secret empty (a setup that always failed would pass the case above).
BOOST_AUTO_TEST_CASE(with_etc_unchanged_the_same_sandbox_runs_and_reads_the_secret_empty) {
  SpawnerFixture fx("etc-masks");
  EtcScratch scratch("same");
  const std::string dir = scratch.top + "/keys";
  fs::create_directories(dir);
  write_text(dir + "/secret", "top secret\n");
  Built b = prepare_change_run(fx, "wc -c < " + dir + "/secret", {dir + "/secret"}, [] {});
  BOOST_TEST(!b.setup_failed, step_name(b.step) << " " << errno_name(b.err));
  BOOST_TEST(b.exit_code == 0);
  BOOST_TEST(b.out == "0\n");
}

// A masked directory holding other masked paths, a directory among them (`maskPaths:
// ["/etc/ssl"]` holds /etc/ssl/private). Failure fixed (session 28): the directories were bound
// in order, the inner one then found no way (ENOENT) and every sandbox of such a policy failed
// at the mask step (files were bound before directories, so masked files inside were fine).
// Nothing inside a masked directory is masked again: it shows empty.
BOOST_AUTO_TEST_CASE(a_masked_directory_holding_masked_paths_shows_empty) {
  SpawnerFixture fx("etc-masks");
  EtcScratch scratch("nested");
  const std::string dir = scratch.top + "/ssh";
  fs::create_directories(dir + "/keys.d");
  write_text(dir + "/host_key", "top secret\n");
  write_text(dir + "/keys.d/key", "top secret\n");
  Built b =
      prepare_change_run(fx, "cat " + dir + "/host_key " + dir + "/keys.d/key 2>&1; echo end",
                         {dir, dir + "/host_key", dir + "/keys.d", dir + "/keys.d/key"}, [] {});
  BOOST_TEST(!b.setup_failed, step_name(b.step) << " " << errno_name(b.err));
  BOOST_TEST(b.exit_code == 0);
  // The empty directory over it has mode 000: nothing in it can even be looked up.
  BOOST_TEST(b.out == "cat: " + dir + "/host_key: Permission denied\ncat: " + dir +
                          "/keys.d/key: Permission denied\nend\n");
}

// The host removes secrets after the masks were computed and before the setup child binds them
// (an ssh host key being rotated: the old one removed, the new one not yet written): a file,
// a directory, and a file whose directory went. Failure fixed (session 30): the bind found no
// way (ENOENT) and the whole sandbox failed at the mask step; concurrent tests that rotate a
// host key failed other tests' sandboxes that way. A secret that is not there has nothing to
// show: the setup goes on and the command finds none of them. A secret put back before the
// binds (the rotation done) is masked: the new file reads empty.
BOOST_AUTO_TEST_CASE(a_secret_removed_before_the_binds_is_skipped_and_one_put_back_is_masked) {
  SpawnerFixture fx("etc-masks");
  EtcScratch scratch("gone");
  const std::string file = scratch.top + "/host_key", dir = scratch.top + "/private.d",
                    way = scratch.top + "/keys", in_way = way + "/key",
                    back = scratch.top + "/rotated_key";
  fs::create_directories(dir);
  fs::create_directories(way);
  write_text(file, "top secret\n");
  write_text(dir + "/key", "top secret\n");
  write_text(in_way, "top secret\n");
  write_text(back, "old secret\n");
  const std::string script = "for p in " + file + " " + dir + " " + in_way +
                             "; do [ -e $p ] && echo \"$p there\"; done; wc -c < " + back;
  Built b = prepare_change_run(fx, script, {file, dir, in_way, back}, [&] {
    BOOST_REQUIRE(::unlink(file.c_str()) == 0);
    fs::remove_all(dir);
    fs::remove_all(way);
    BOOST_REQUIRE(::unlink(back.c_str()) == 0);
    write_text(back, "new secret\n");
  });
  BOOST_TEST(!b.setup_failed, step_name(b.step) << " " << errno_name(b.err));
  BOOST_TEST(b.exit_code == 0);
  BOOST_TEST(b.out == "0\n");
}
