#define BOOST_TEST_MODULE sandbox_cgroup
#include "sandbox/cgroup.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <fmt/format.h>

#include <boost/test/unit_test.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "sys/fs.hpp"

using namespace cordon;
using namespace cordon::sandbox;

namespace {

// This development machine, verbatim: v1 memory/pids/cpu, cgroup2 without controllers.
constexpr std::string_view kHybridCgroup =
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n"
    "4:memory:/process_api/5614f88f\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";
constexpr std::string_view kHybridMountinfo =
    "23 1 0:22 / /sys rw,nosuid - sysfs sysfs rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

// A systemd host on pure v2 running cordon as a delegated service.
constexpr std::string_view kUnifiedCgroup = "0::/system.slice/cordon.service\n";
constexpr std::string_view kUnifiedMountinfo =
    "25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "28 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
constexpr std::string_view kAllControllers = "cpuset cpu io memory hugetlb pids rdma misc\n";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cgroup_test.XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    BOOST_REQUIRE(made != nullptr);
    path = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The message of a failed Result; BOOST_TEST evaluates its message argument even on success.
template <class R>
std::string why(const R& r) {
  return r.has_value() ? std::string() : r.error().message();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// What the kernel puts in a new v2 cgroup `dir` whose parent passes `controllers` on.
void fake_new_cgroup(const std::string& dir, const std::string& controllers) {
  BOOST_TEST_REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  put(dir + "/cgroup.controllers", controllers + "\n");
  put(dir + "/cgroup.subtree_control", "");
}

// `dir` made and laid out like a non-root v2 cgroup of `type` holding `procs` (this process by
// default) that passes no controller on.
void fake_own_cgroup(const std::string& dir, const std::string& type = "domain",
                     const std::string& procs = std::to_string(::getpid()) + "\n") {
  BOOST_TEST_REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  put(dir + "/cgroup.type", type + "\n");
  put(dir + "/cgroup.procs", procs);
  put(dir + "/cgroup.subtree_control", "");
}

}  // namespace

BOOST_AUTO_TEST_CASE(detects_hybrid_layout_of_this_machine) {
  auto layout = detect_cgroup_layout(kHybridCgroup, kHybridMountinfo, "hugetlb\n");
  BOOST_TEST_REQUIRE(layout.has_value(), why(layout));
  BOOST_TEST((layout->mode == CgroupMode::kHybrid));
  BOOST_TEST(layout->v2_parent == "/sys/fs/cgroup/unified/cordon");
  BOOST_TEST(layout->v1_memory_parent == "/sys/fs/cgroup/memory/process_api/5614f88f/cordon");
  BOOST_TEST(layout->v1_pids_parent == "/sys/fs/cgroup/pids/cordon");
  BOOST_TEST(layout->v1_cpu_parent == "/sys/fs/cgroup/cpu/cordon");
  auto own = own_v2_cgroup_dir(kHybridCgroup, kHybridMountinfo);
  BOOST_TEST_REQUIRE(own.has_value());
  BOOST_TEST(*own == "/sys/fs/cgroup/unified");
}

BOOST_AUTO_TEST_CASE(detects_unified_layout_under_own_cgroup) {
  auto layout = detect_cgroup_layout(kUnifiedCgroup, kUnifiedMountinfo, kAllControllers);
  BOOST_TEST_REQUIRE(layout.has_value(), why(layout));
  BOOST_TEST((layout->mode == CgroupMode::kUnified));
  BOOST_TEST(layout->v2_parent == "/sys/fs/cgroup/system.slice/cordon.service/cordon");
  BOOST_TEST(layout->v1_memory_parent.empty());

  // A cordon that moved itself into its leaf (prepare_parents) counts the cgroup above as its
  // own, so every cordon process of that service puts jobs in the same place.
  auto moved = detect_cgroup_layout("0::/system.slice/cordon.service/cordon-self\n",
                                    kUnifiedMountinfo, kAllControllers);
  BOOST_TEST_REQUIRE(moved.has_value(), why(moved));
  BOOST_TEST(moved->v2_parent == "/sys/fs/cgroup/system.slice/cordon.service/cordon");
}

BOOST_AUTO_TEST_CASE(finds_comounted_controllers_and_escaped_mount_points) {
  std::string cgroup = "3:memory:/a\n2:pids:/\n1:cpu,cpuacct:/b\n0::/\n";
  std::string mountinfo =
      "40 31 0:37 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
      "41 31 0:38 / /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n"
      "42 31 0:39 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
      "43 31 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  auto layout = detect_cgroup_layout(cgroup, mountinfo, "");
  BOOST_TEST_REQUIRE(layout.has_value(), why(layout));
  BOOST_TEST(layout->v1_cpu_parent == "/sys/fs/cgroup/cpu,cpuacct/b/cordon");
  BOOST_TEST(layout->v1_memory_parent == "/sys/fs/cgroup/mem ory/a/cordon");
}

BOOST_AUTO_TEST_CASE(maps_own_cgroup_through_a_mount_of_a_subtree) {
  // A container's view: the cgroup2 mount's root is /machine/c1, our cgroup is below it.
  std::string cgroup = "0::/machine/c1/app\n";
  std::string mountinfo = "50 40 0:30 /machine/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  auto layout = detect_cgroup_layout(cgroup, mountinfo, "memory pids cpu");
  BOOST_TEST_REQUIRE(layout.has_value(), why(layout));
  BOOST_TEST(layout->v2_parent == "/sys/fs/cgroup/app/cordon");

  // ...and a sibling subtree that is not visible through that mount is an error.
  auto hidden = detect_cgroup_layout("0::/machine/c2\n", mountinfo, "memory pids cpu");
  BOOST_TEST_REQUIRE(!hidden.has_value());
  BOOST_TEST(hidden.error().message().find("not visible") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_host_without_cgroup2_mount) {
  std::string mountinfo(kHybridMountinfo.substr(0, kHybridMountinfo.find("41 31")));
  auto layout = detect_cgroup_layout(kHybridCgroup, mountinfo, "");
  BOOST_TEST_REQUIRE(!layout.has_value());
  BOOST_TEST((layout.error().code() == ErrorCode::kUnsupported));
  BOOST_TEST(layout.error().message().find("no cgroup2 mount") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(names_the_missing_controller) {
  auto layout = detect_cgroup_layout(kUnifiedCgroup, kUnifiedMountinfo, "cpu memory io");
  BOOST_TEST_REQUIRE(!layout.has_value());
  BOOST_TEST((layout.error().code() == ErrorCode::kUnsupported));
  BOOST_TEST(layout.error().message().find("pids: missing") != std::string::npos,
             layout.error().message());
  BOOST_TEST(layout.error().message().find("memory: v2") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(refuses_controllers_split_between_v1_and_v2) {
  std::string cgroup = "2:memory:/\n0::/\n";
  std::string mountinfo =
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  auto layout = detect_cgroup_layout(cgroup, mountinfo, "pids cpu");
  BOOST_TEST_REQUIRE(!layout.has_value());
  BOOST_TEST(layout.error().message().find("memory: v1, pids: v2, cpu: v2") != std::string::npos,
             layout.error().message());
}

BOOST_AUTO_TEST_CASE(refuses_v1_controller_that_is_not_mounted) {
  std::string cgroup = "3:memory:/\n2:pids:/\n1:cpu:/\n0::/\n";
  std::string mountinfo =
      "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
  auto layout = detect_cgroup_layout(cgroup, mountinfo, "");
  BOOST_TEST_REQUIRE(!layout.has_value());
  BOOST_TEST(layout.error().message().find("`memory`") != std::string::npos,
             layout.error().message());
}

BOOST_AUTO_TEST_CASE(refuses_malformed_proc_text) {
  BOOST_TEST(!detect_cgroup_layout("garbage\n", kHybridMountinfo, "").has_value());
  BOOST_TEST(!detect_cgroup_layout(kHybridCgroup, "1 2 3\n", "").has_value());
}

BOOST_AUTO_TEST_CASE(refuses_job_names_that_escape_the_parent) {
  BOOST_TEST(check_job_name("job-1_a.b").has_value());
  for (const char* bad : {"", ".", "..", "../x", "a/b", ".hidden", "a b", "a\nb"}) {
    BOOST_TEST(!check_job_name(bad).has_value(), bad);
  }
  BOOST_TEST(!check_job_name(std::string(129, 'a')).has_value());
  auto paths =
      JobCgroup::paths_for(CgroupLayout{CgroupMode::kUnified, "/x/cordon", "", "", ""}, "../evil");
  BOOST_TEST(!paths.has_value());
}

BOOST_AUTO_TEST_CASE(hybrid_paths_dedupe_comounted_hierarchies) {
  CgroupLayout layout{CgroupMode::kHybrid, "/u/cordon", "/m/cordon", "/p/cordon", "/m/cordon"};
  auto paths = JobCgroup::paths_for(layout, "j");
  BOOST_TEST_REQUIRE(paths.has_value());
  std::vector<std::string> want = {"/u/cordon/j", "/m/cordon/j", "/p/cordon/j"};
  BOOST_TEST(*paths == want, boost::test_tools::per_element());
}

// The pure-v2 path cannot run on this hybrid machine, so it runs against a temp dir laid out
// like cgroupfs: the files a v2 cgroup with memory, pids and cpu enabled would have.
BOOST_AUTO_TEST_CASE(prepares_unified_parent_and_enables_controllers) {
  TempDir tmp;
  std::string own = tmp.path + "/own";
  BOOST_TEST_REQUIRE(::mkdir(own.c_str(), 0755) == 0);
  CgroupLayout layout{CgroupMode::kUnified, own + "/cordon", "", "", ""};
  // Our own cgroup is the hierarchy's root here: no cgroup.type, the rule's one exemption.
  put(own + "/cgroup.subtree_control", "cpu memory pids\n");
  // A real cgroupfs fills the new dir itself; here the "kernel" does it before the call.
  fake_new_cgroup(layout.v2_parent, "cpu io memory pids");
  auto ok = prepare_parents(layout);
  BOOST_TEST_REQUIRE(ok.has_value(), why(ok));
  BOOST_TEST(slurp(layout.v2_parent + "/cgroup.subtree_control") == "+memory +pids +cpu");

  put(layout.v2_parent + "/cgroup.controllers", "cpu io\n");
  auto refused = prepare_parents(layout);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().message().find("`memory pids` are not delegated") != std::string::npos,
             refused.error().message());
}

// cgroup v2's no-internal-process rule (a review, session 12): a cgroup other than the root
// that holds processes (cordon's own does: cordon is in it) can pass no controller on, so jobs
// beneath it could never get limits. Refused before anything is made, with the reason; a
// cgroup that already passes the three on is fine. (Laid out like cgroupfs, as above: this
// hybrid machine has no v2 controllers.)
BOOST_AUTO_TEST_CASE(a_unified_own_cgroup_that_holds_processes_is_refused_before_anything_is_made) {
  TempDir tmp;
  std::string own = tmp.path + "/own";
  // Ours, and pid 1: someone else's, so not cordon's to move.
  fake_own_cgroup(own, "domain", std::to_string(::getpid()) + "\n1\n");
  CgroupLayout layout{CgroupMode::kUnified, own + "/cordon", "", "", ""};
  auto checked = check_v2_delegation(layout);
  BOOST_TEST_REQUIRE(!checked.has_value());
  for (std::string_view want :
       {"no-internal-process rule", "pid 1 `", "Delegate=yes", "systemd-run --scope"}) {
    BOOST_TEST(checked.error().message().find(want) != std::string::npos,
               want << " in: " << checked.error().message());
  }
  BOOST_TEST(checked.error().message().find(std::to_string(::getpid())) == std::string::npos);
  auto refused = prepare_parents(layout);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().message() == checked.error().message());
  BOOST_TEST(!std::filesystem::exists(layout.v2_parent));  // nothing left in a cgroup not ours
  BOOST_TEST(!std::filesystem::exists(own + "/cordon-self"));
  BOOST_TEST(slurp(own + "/cgroup.subtree_control").empty());
  // Passing the three on already (delegated and set up so), the check holds, nothing to move.
  put(own + "/cgroup.subtree_control", "cpu io memory pids\n");
  auto passed = check_v2_delegation(layout);
  BOOST_TEST_REQUIRE(passed.has_value(), why(passed));
  BOOST_TEST(passed->leaf.empty());
  // Hybrid never needs it.
  BOOST_TEST(
      check_v2_delegation(CgroupLayout{CgroupMode::kHybrid, "/nonexistent/cordon", "", "", ""})
          .has_value());
}

// A cgroup that holds only cordon (a systemd scope or service with Delegate=yes): cordon moves
// itself into `<own>/cordon-self` and passes the controllers on, as a delegated cgroup's owner
// does. Laid out like cgroupfs here; tests/vm (vm_cgroup_v2) does it on a real pure v2 kernel,
// where the leaf does not exist before.
BOOST_AUTO_TEST_CASE(a_unified_own_cgroup_that_holds_only_cordon_is_passed_on_after_a_move) {
  TempDir tmp;
  std::string own = tmp.path + "/own";
  fake_own_cgroup(own);
  CgroupLayout layout{CgroupMode::kUnified, own + "/cordon", "", "", ""};
  auto checked = check_v2_delegation(layout);
  BOOST_TEST_REQUIRE(checked.has_value(), why(checked));
  BOOST_TEST(checked->own == own);
  BOOST_TEST(checked->leaf == own + "/cordon-self");
  BOOST_TEST(!std::filesystem::exists(own + "/cordon-self"));  // the check only reads

  // What the kernel would put in the new cgroups.
  BOOST_TEST_REQUIRE(::mkdir((own + "/cordon-self").c_str(), 0755) == 0);
  put(own + "/cordon-self/cgroup.procs", "");
  fake_new_cgroup(layout.v2_parent, "cpu memory pids");
  auto ok = prepare_parents(layout);
  BOOST_TEST_REQUIRE(ok.has_value(), why(ok));
  BOOST_TEST(slurp(own + "/cordon-self/cgroup.procs") == "0");  // the writer: cordon itself
  BOOST_TEST(slurp(own + "/cgroup.subtree_control") == "+memory +pids +cpu");
  BOOST_TEST(slurp(layout.v2_parent + "/cgroup.subtree_control") == "+memory +pids +cpu");
}

// A threaded cgroup (or one the kernel marks `domain invalid`) can hold no memory-limited job
// below it: refused by its cgroup.type before anything moves (a review, session 17: only the
// file's presence was checked, and the move happened before the kernel said no).
BOOST_AUTO_TEST_CASE(a_unified_own_cgroup_that_is_not_a_domain_is_refused) {
  for (std::string type : {"threaded", "domain threaded", "domain invalid"}) {
    TempDir tmp;
    std::string own = tmp.path + "/own";
    fake_own_cgroup(own, type);
    CgroupLayout layout{CgroupMode::kUnified, own + "/cordon", "", "", ""};
    auto refused = prepare_parents(layout);
    BOOST_TEST_REQUIRE(!refused.has_value(), type);
    BOOST_TEST(refused.error().message().find("of type `" + type + "`") != std::string::npos,
               refused.error().message());
    BOOST_TEST(!std::filesystem::exists(own + "/cordon-self"));
    BOOST_TEST(!std::filesystem::exists(layout.v2_parent));
    BOOST_TEST(slurp(own + "/cgroup.subtree_control").empty());
  }
}

// systemd is the only writer of the cgroups it made for its units unless a unit has
// Delegate=yes, which it marks with the xattr `trusted.delegate` (and `user.delegate`) "1".
// A unit's cgroup without the mark is refused before anything is written, one with either
// mark is passed on; a cgroup not named like a unit (a container's, an administrator's) needs
// no mark. On the real cgroupfs below as well. (A review, session 17: delegation was assumed.)
BOOST_AUTO_TEST_CASE(a_systemd_unit_cgroup_without_delegate_yes_is_refused) {
  TempDir tmp;
  for (std::string name : {"cordon.service", "run-r1.scope", "own"}) {
    for (std::string mark : {"", "trusted.delegate", "user.delegate", "user.delegate=0"}) {
      std::string own = tmp.path + "/" + name;
      std::filesystem::remove_all(own);
      fake_own_cgroup(own);
      bool marked = false;
      if (!mark.empty()) {
        std::string xattr = mark.substr(0, mark.find('='));
        std::string value = mark.ends_with("=0") ? "0" : "1";
        int rc = ::setxattr(own.c_str(), xattr.c_str(), value.data(), value.size(), 0);
        BOOST_TEST_REQUIRE(rc == 0, "setxattr " << xattr << ": " << std::strerror(errno));
        marked = value == "1";
      }
      CgroupLayout layout{CgroupMode::kUnified, own + "/cordon", "", "", ""};
      auto checked = check_v2_delegation(layout);
      bool want_ok = marked || name == "own";
      BOOST_TEST(checked.has_value() == want_ok, name << " " << mark << ": " << why(checked));
      if (!checked) {
        for (std::string_view want : {"not delegated", "trusted.delegate", "Delegate=yes"}) {
          BOOST_TEST(checked.error().message().find(want) != std::string::npos,
                     want << " in: " << checked.error().message());
        }
        auto refused = prepare_parents(layout);
        BOOST_TEST_REQUIRE(!refused.has_value());
        BOOST_TEST(!std::filesystem::exists(own + "/cordon-self"));
        BOOST_TEST(!std::filesystem::exists(layout.v2_parent));
        BOOST_TEST(slurp(own + "/cgroup.subtree_control").empty());
      }
    }
  }
}

// On this machine's real cgroup2 hierarchy (/sys/fs/cgroup/unified, where no controller is
// enabled: they are on v1), the kernel refuses `+memory +pids +cpu` in a cgroup's
// subtree_control (ENOENT) after cordon moved into its leaf: a real failure at the worst point.
// cordon moves back and removes the leaf it made, and says so with the kernel's errno (a
// review, session 17: cordon stayed in the leaf, the leaf stayed, and the message guessed
// EBUSY). The same cgroup named like a systemd service is refused untouched until it carries
// the delegate mark. A child process plays cordon (it moves itself); the cgroup is this test's.
BOOST_AUTO_TEST_CASE(a_failed_pass_on_moves_cordon_back_and_removes_the_leaf_on_a_real_cgroupfs) {
  const std::string root = "/sys/fs/cgroup/unified";
  BOOST_TEST_REQUIRE(std::filesystem::exists(root + "/cgroup.procs"),
                     "this machine's cgroup2 hierarchy is at " + root);
  const std::string own = fmt::format("{}/cordon-test-{}.service", root, ::getpid());
  BOOST_TEST_REQUIRE(::mkdir(own.c_str(), 0755) == 0,
                     "mkdir " << own << ": " << std::strerror(errno));
  struct RemoveAtEnd {  // this test's cgroups only, whatever failed
    std::string own;
    ~RemoveAtEnd() {
      for (const char* sub : {"/cordon-self", "/cordon", ""}) (void)::rmdir((own + sub).c_str());
    }
  } remove_at_end{own};
  // Runs prepare_parents in a child that joined `own`; returns the child's report: its error
  // message, then the v2 line of its /proc/self/cgroup after the call.
  auto run_in_own = [&](const std::string& start) -> std::string {
    int p[2];
    BOOST_TEST_REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    pid_t child = ::fork();
    BOOST_TEST_REQUIRE(child >= 0);
    if (child == 0) {
      std::string out;
      if (!sys::write_file(start + "/cgroup.procs", "0")) {
        out = "could not join " + start;
      } else {
        auto r = prepare_parents(CgroupLayout{CgroupMode::kUnified, own + "/cordon", "", "", ""});
        out = (r ? std::string("ok") : r.error().message()) + "\n";
        std::string cg = slurp("/proc/self/cgroup");
        out += cg.substr(cg.find("0::"));
      }
      (void)!::write(p[1], out.data(), out.size());
      ::_exit(0);
    }
    ::close(p[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) out.append(buf, n);
    ::close(p[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    return out;
  };
  const std::string rel = own.substr(root.size());

  std::string refused = run_in_own(own);
  BOOST_TEST(refused.find("is a systemd unit's that is not delegated") != std::string::npos,
             refused);
  BOOST_TEST(refused.find("0::" + rel + "\n") != std::string::npos, refused);
  BOOST_TEST(!exists(own + "/cordon-self"));
  BOOST_TEST(!exists(own + "/cordon"));

  BOOST_TEST_REQUIRE(::setxattr(own.c_str(), "trusted.delegate", "1", 1, 0) == 0,
                     "setxattr trusted.delegate: " << std::strerror(errno));
  std::string failed = run_in_own(own);
  for (std::string_view want :
       {"enable memory, pids and cpu in", "ENOENT", "cordon moved back, nothing is left changed"}) {
    BOOST_TEST(failed.find(want) != std::string::npos, want << " in: " << failed);
  }
  BOOST_TEST(failed.find("EBUSY") == std::string::npos, failed);
  BOOST_TEST(failed.find("0::" + rel + "\n") != std::string::npos, failed);  // moved back
  BOOST_TEST(!exists(own + "/cordon-self"));                                 // leaf removed
  BOOST_TEST(!exists(own + "/cordon"));
  BOOST_TEST(slurp(own + "/cgroup.subtree_control").empty());

  // A cordon that starts in the leaf (an earlier cordon's, or systemd's DelegateSubgroup=)
  // stays there when the kernel refuses, and the leaf it did not make stays too (a review,
  // session 17: the undo "moved it back" into `<own>`, where it had never been).
  BOOST_TEST_REQUIRE(::mkdir((own + "/cordon-self").c_str(), 0755) == 0);
  std::string from_leaf = run_in_own(own + "/cordon-self");
  BOOST_TEST(from_leaf.find("cordon stays in the leaf it started in") != std::string::npos,
             from_leaf);
  BOOST_TEST(from_leaf.find("0::" + rel + "/cordon-self\n") != std::string::npos, from_leaf);
  BOOST_TEST(exists(own + "/cordon-self"));
  BOOST_TEST(slurp(own + "/cgroup.procs").empty());
}

BOOST_AUTO_TEST_CASE(unified_job_writes_v2_limits_reads_usage_and_kills) {
  TempDir tmp;
  CgroupLayout layout{CgroupMode::kUnified, tmp.path, "", "", ""};
  auto job = JobCgroup::create(layout, "job1", {});
  BOOST_TEST_REQUIRE(job.has_value(), why(job));
  std::string dir = tmp.path + "/job1";
  BOOST_TEST(job->paths() == std::vector<std::string>{dir}, boost::test_tools::per_element());
  BOOST_TEST(job->v2_dirfd() >= 0);
  BOOST_TEST((::fcntl(job->v2_dirfd(), F_GETFD) & FD_CLOEXEC) != 0);

  // What the kernel would have put in a fresh v2 cgroup (empty so one write shows exactly).
  for (const char* f : {"memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.kill"}) {
    put(dir + "/" + f, "");
  }
  put(dir + "/cgroup.events", "populated 1\nfrozen 0\n");
  put(dir + "/cgroup.procs", "");
  put(dir + "/memory.peak", "7340032\n");
  put(dir + "/memory.events", "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n");
  put(dir + "/pids.events", "max 3\n");
  put(dir + "/cpu.stat", "usage_usec 4242\nuser_usec 4000\nsystem_usec 242\n");

  auto set = job->set_limits({100ULL << 20, 32, 1.5});
  BOOST_TEST_REQUIRE(set.has_value(), why(set));
  BOOST_TEST(slurp(dir + "/memory.max") == "104857600");
  BOOST_TEST(slurp(dir + "/memory.swap.max") == "0");
  BOOST_TEST(slurp(dir + "/pids.max") == "32");
  BOOST_TEST(slurp(dir + "/cpu.max") == "150000 100000");

  auto usage = job->usage();
  BOOST_TEST_REQUIRE(usage.has_value(), why(usage));
  BOOST_TEST(usage->peak_memory_bytes == 7340032u);
  BOOST_TEST(usage->oom_kills == 2u);
  BOOST_TEST(usage->pids_max_hits == 3u);
  BOOST_TEST(usage->cpu_usec == 4242u);

  auto populated = job->populated();
  BOOST_TEST_REQUIRE(populated.has_value());
  BOOST_TEST(*populated);
  BOOST_TEST_REQUIRE(job->kill().has_value());
  BOOST_TEST(slurp(dir + "/cgroup.kill") == "1");

  // A second job of the same name must not adopt this one's directory.
  auto again = JobCgroup::create(layout, "job1", {});
  BOOST_TEST_REQUIRE(!again.has_value());
  BOOST_TEST(again.error().sys_errno() == EEXIST);
  BOOST_TEST(again.error().message().find("mkdir `" + dir + "`") != std::string::npos,
             again.error().message());

  // The "kernel" removes the interface files once the cgroup is empty; destroy removes it.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::filesystem::remove(e.path(), ec);
  }
  auto destroyed = job->destroy();
  BOOST_TEST_REQUIRE(destroyed.has_value(), why(destroyed));
  BOOST_TEST(!exists(dir));
  BOOST_TEST(job->paths().empty());
  BOOST_TEST(job->destroy().has_value());  // idempotent
}

BOOST_AUTO_TEST_CASE(unified_limits_skip_missing_swap_file_and_reject_bad_cpus) {
  TempDir tmp;
  CgroupLayout layout{CgroupMode::kUnified, tmp.path, "", "", ""};
  auto job = JobCgroup::create(layout, "j", {});
  BOOST_TEST_REQUIRE(job.has_value(), why(job));
  std::string dir = tmp.path + "/j";
  put(dir + "/memory.max", "");
  BOOST_TEST_REQUIRE(job->set_limits({1ULL << 20, 0, 0}).has_value());
  BOOST_TEST(slurp(dir + "/memory.max") == "1048576");
  BOOST_TEST(!exists(dir + "/memory.swap.max"));

  auto negative = job->set_limits({0, 0, -1});
  BOOST_TEST_REQUIRE(!negative.has_value());
  BOOST_TEST((negative.error().code() == ErrorCode::kInvalid));
  BOOST_TEST(!job->set_limits({0, 0, 0.001}).has_value());
  // A limit the "kernel" lacks the file for fails and names the cgroup and the file.
  auto pids = job->set_limits({0, 7, 0});
  BOOST_TEST_REQUIRE(!pids.has_value());
  BOOST_TEST(pids.error().message().find("`" + dir + "`") != std::string::npos);
  BOOST_TEST(pids.error().message().find("pids.max") != std::string::npos);
  std::filesystem::remove(dir + "/memory.max");
}

BOOST_AUTO_TEST_CASE(failed_create_leaves_nothing_behind) {
  TempDir tmp;
  CgroupLayout layout{CgroupMode::kUnified, tmp.path, "", "", ""};
  // No memory.max in the new dir: the limit write fails and the dir must be removed again.
  auto job = JobCgroup::create(layout, "j", {1 << 20, 0, 0});
  BOOST_TEST_REQUIRE(!job.has_value());
  BOOST_TEST(!exists(tmp.path + "/j"));

  CgroupLayout missing{CgroupMode::kUnified, tmp.path + "/nope", "", "", ""};
  auto no_parent = JobCgroup::create(missing, "j", {});
  BOOST_TEST_REQUIRE(!no_parent.has_value());
  BOOST_TEST(no_parent.error().sys_errno() == ENOENT);
}

BOOST_AUTO_TEST_CASE(records_are_written_atomically_and_locked) {
  TempDir tmp;
  std::string dir = tmp.path + "/state/records";
  auto records = CgroupRecords::open(dir);
  BOOST_TEST_REQUIRE(records.has_value(), why(records));
  struct stat st {};
  BOOST_TEST_REQUIRE(::stat(dir.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0700u);

  auto lock = records->add("j1", {"/sys/fs/cgroup/unified/cordon/j1", "/x/cordon/j1"});
  BOOST_TEST_REQUIRE(lock.has_value(), why(lock));
  BOOST_TEST(lock->path() == dir + "/j1.cgroups");
  BOOST_TEST(slurp(dir + "/j1.cgroups") == "/sys/fs/cgroup/unified/cordon/j1\n/x/cordon/j1\n");
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    left.push_back(e.path().filename().string());
  }
  BOOST_TEST(left == std::vector<std::string>{"j1.cgroups"}, boost::test_tools::per_element());

  // Another open file description cannot take the lock while the record is held.
  int fd = ::open((dir + "/j1.cgroups").c_str(), O_RDONLY | O_CLOEXEC);
  BOOST_TEST_REQUIRE(fd >= 0);
  BOOST_TEST(::flock(fd, LOCK_EX | LOCK_NB) == -1);
  BOOST_TEST(errno == EWOULDBLOCK);
  ::close(fd);

  auto dup = records->add("j1", {"/a/j1"});
  BOOST_TEST_REQUIRE(!dup.has_value());
  BOOST_TEST(dup.error().sys_errno() == EEXIST);
  BOOST_TEST(!records->add("j2", {"relative/j2"}).has_value());

  // Held: the sweep leaves it alone.
  auto swept = records->sweep();
  BOOST_TEST_REQUIRE(swept.has_value(), why(swept));
  BOOST_TEST(*swept == 0u);
  BOOST_TEST(exists(dir + "/j1.cgroups"));

  BOOST_TEST_REQUIRE(lock->remove().has_value());
  BOOST_TEST(!exists(dir + "/j1.cgroups"));
  BOOST_TEST(!lock->held());
}

BOOST_AUTO_TEST_CASE(sweeps_dead_record_whose_cgroups_are_gone) {
  TempDir tmp;
  auto records = CgroupRecords::open(tmp.path + "/r");
  BOOST_TEST_REQUIRE(records.has_value());
  {
    auto lock = records->add("gone", {tmp.path + "/nowhere/gone"});
    BOOST_TEST_REQUIRE(lock.has_value());
  }  // owner "died": lock released, record kept
  BOOST_TEST(exists(tmp.path + "/r/gone.cgroups"));
  auto swept = records->sweep();
  BOOST_TEST_REQUIRE(swept.has_value(), why(swept));
  BOOST_TEST(*swept == 1u);
  BOOST_TEST(!exists(tmp.path + "/r/gone.cgroups"));
}

BOOST_AUTO_TEST_CASE(sweep_refuses_paths_off_cgroupfs_and_foreign_names) {
  TempDir tmp;
  std::string victim = tmp.path + "/victim";
  std::string other = tmp.path + "/other";
  BOOST_TEST_REQUIRE(::mkdir(victim.c_str(), 0755) == 0);
  BOOST_TEST_REQUIRE(::mkdir(other.c_str(), 0755) == 0);
  auto records = CgroupRecords::open(tmp.path + "/r");
  BOOST_TEST_REQUIRE(records.has_value());
  { BOOST_TEST_REQUIRE(records->add("victim", {victim}).has_value()); }
  { BOOST_TEST_REQUIRE(records->add("job", {other}).has_value()); }
  auto swept = records->sweep();
  BOOST_TEST_REQUIRE(!swept.has_value());
  BOOST_TEST(swept.error().message().find("2 failed") != std::string::npos,
             swept.error().message());
  // Neither directory was removed and both records are kept for a person to look at.
  BOOST_TEST(exists(victim));
  BOOST_TEST(exists(other));
  BOOST_TEST(exists(tmp.path + "/r/victim.cgroups"));
  BOOST_TEST(exists(tmp.path + "/r/job.cgroups"));
}

BOOST_AUTO_TEST_CASE(refuses_records_dir_writable_by_others) {
  TempDir tmp;
  std::string dir = tmp.path + "/open";
  BOOST_TEST_REQUIRE(::mkdir(dir.c_str(), 0777) == 0);
  BOOST_TEST_REQUIRE(::chmod(dir.c_str(), 0777) == 0);
  auto records = CgroupRecords::open(dir);
  BOOST_TEST_REQUIRE(!records.has_value());
  BOOST_TEST((records.error().code() == ErrorCode::kRefused));
}

BOOST_AUTO_TEST_CASE(sweep_deletes_unlocked_temp_records_but_not_locked_ones) {
  TempDir tmp;
  auto records = CgroupRecords::open(tmp.path + "/r");
  BOOST_TEST_REQUIRE(records.has_value());
  std::string stale = tmp.path + "/r/.dead.123.tmp";
  std::string busy = tmp.path + "/r/.busy.456.tmp";
  put(stale, "/x/dead\n");
  put(busy, "/x/busy\n");
  int fd = ::open(busy.c_str(), O_RDONLY | O_CLOEXEC);
  BOOST_TEST_REQUIRE(fd >= 0);
  BOOST_TEST_REQUIRE(::flock(fd, LOCK_EX) == 0);  // a writer between flock and rename
  auto swept = records->sweep();
  BOOST_TEST_REQUIRE(swept.has_value(), why(swept));
  BOOST_TEST(*swept == 0u);  // temp files are not records: nothing was made for them yet
  BOOST_TEST(!exists(stale));
  BOOST_TEST(exists(busy));
  ::close(fd);
}
