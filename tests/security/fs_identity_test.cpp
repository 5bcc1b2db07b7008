// Security probes: the sandbox's PID 1, inherited descriptors, credentials, host files and
// /etc secrets, writes outside the working root, setuid/setgid/file capabilities reaching the
// host's disk, and the cwd check racing a symlink swap.
//
// Every case runs the escape probe (tests/helpers/probe.cpp) inside a real `cordon run`,
// asserts the exact answer of the wall it names, and runs a control through cordon-testwalls
// with only that wall removed (`--test-disable-wall`), which must answer differently. Where
// walls stack, each layer is asserted: the full sandbox, each wall standing alone, none.
#define BOOST_TEST_MODULE security_fs_identity
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <endian.h>
#include <fnmatch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "helpers/cordon_fixture.hpp"
#include "sandbox/prepare.hpp"

using namespace cordon::test;
using nlohmann::json;

namespace {

struct ProbeRun {
  ProcessResult proc;
  std::string line;  // the probe's one line, without "probe <name>: " and the newline
};

// Runs `probe <args>` in the sandbox: cordon itself when `walls_off` is empty, else
// cordon-testwalls with exactly those walls removed.
ProbeRun probe(const Sandbox& s, const std::vector<std::string>& args,
               std::initializer_list<const char*> walls_off = {},
               std::vector<std::string> opts = {}) {
  for (const char* w : walls_off) {
    opts.push_back("--test-disable-wall");
    opts.push_back(w);
  }
  std::vector<std::string> argv = {probe_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  ProbeRun r;
  r.proc = run_process(s.args(opts, argv, walls_off.size() > 0));
  std::string prefix = "probe " + args[0] + ": ";
  if (r.proc.out.rfind(prefix, 0) == 0 && !r.proc.out.empty() && r.proc.out.back() == '\n') {
    r.line = r.proc.out.substr(prefix.size(), r.proc.out.size() - prefix.size() - 1);
  } else {
    r.line = "<no probe line; exit " + std::to_string(r.proc.exit_code()) +
             "; stderr: " + r.proc.err + ">";
  }
  return r;
}

std::string hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 0xf];
  }
  return out;
}

// The whole file, or "" when it cannot be opened.
std::string slurp(const std::string& path) {
  std::string text;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return text;
  }
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

std::string dir_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

struct HostFile {
  bool exists = false;
  struct stat st {};
  bool has_file_caps = false;
};

HostFile host_file(const std::string& path) {
  HostFile f;
  f.exists = ::lstat(path.c_str(), &f.st) == 0;
  if (f.exists) {
    f.has_file_caps = ::lgetxattr(path.c_str(), "security.capability", nullptr, 0) >= 0;
    BOOST_TEST_REQUIRE((f.has_file_caps || errno == ENODATA),
                       "lgetxattr " << path << ": " << std::strerror(errno));
  }
  return f;
}

// Runs `argv` as a child in a private mount namespace of its own, after `setup` changed that
// namespace (the host's mount table and files stay untouched). Output of both streams.
template <class Setup>
ProcessResult run_in_private_mount_ns(const std::vector<std::string>& argv, Setup setup) {
  ProcessResult r;
  int out[2];
  BOOST_TEST_REQUIRE(::pipe2(out, O_CLOEXEC) == 0, "pipe2: " << std::strerror(errno));
  pid_t pid = ::fork();
  BOOST_TEST_REQUIRE(pid >= 0, "fork: " << std::strerror(errno));
  if (pid == 0) {
    // Private, recursively, before any mount: nothing may propagate back to the host.
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      ::_exit(90);
    }
    if (!setup()) {
      ::_exit(91);
    }
    int null = ::open("/dev/null", O_RDONLY);
    if (null < 0 || ::dup2(null, 0) < 0 || ::dup2(out[1], 1) < 0 || ::dup2(out[1], 2) < 0) {
      ::_exit(92);
    }
    std::vector<char*> av;
    for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    ::execv(av[0], av.data());
    ::_exit(93);
  }
  ::close(out[1]);
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.out.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  BOOST_TEST_REQUIRE(::waitpid(pid, &r.wait_status, 0) == pid);
  return r;
}

bool write_file(const std::string& path, const std::string& content, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  bool ok = ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ok = ::fchmod(fd, mode) == 0 && ok;
  return ::close(fd) == 0 && ok;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PID 1 (cordon-init): walls dumpable, seccomp-profile, landlock (ptrace scoping)
// ---------------------------------------------------------------------------------------------

// ptrace and process_vm_readv make the same PTRACE_MODE_ATTACH check; three walls each refuse
// it alone: the profile (EPERM for ptrace/process_vm_*), init's non-dumpable mm, and Landlock
// (the command's domain is not an ancestor of init's, which confined itself separately).
BOOST_AUTO_TEST_CASE(init_cannot_be_traced_and_each_of_three_walls_alone_refuses) {
  Sandbox s;
  for (const char* name : {"ptrace-init", "process-vm-readv"}) {
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(probe(s, {name}).line == "errno EPERM");
      // Only the profile left.
      BOOST_TEST(probe(s, {name}, {"dumpable", "landlock"}).line == "errno EPERM");
      // Only the non-dumpable init left.
      BOOST_TEST(probe(s, {name}, {"seccomp-profile", "landlock"}).line == "errno EPERM");
      // Only Landlock left.
      BOOST_TEST(probe(s, {name}, {"seccomp-profile", "dumpable"}).line == "errno EPERM");
      // None: the attach (or the 8-byte read of init's memory) goes through.
      auto open = probe(s, {name}, {"seccomp-profile", "dumpable", "landlock"});
      BOOST_TEST(open.line.rfind("allowed", 0) == 0u, open.line);
    }
  }
}

// /proc/1/mem (O_RDWR) and /proc/1/environ go through mm_access: refused by the non-dumpable
// init and by Landlock's ptrace scoping, each alone (the profile allows open/read).
BOOST_AUTO_TEST_CASE(init_memory_and_environ_are_closed_by_dumpable_and_by_landlock) {
  Sandbox s;
  for (const char* name : {"proc1-mem", "proc1-environ"}) {
    BOOST_TEST_CONTEXT(name) {
      BOOST_TEST(probe(s, {name}).line == "errno EACCES");
      BOOST_TEST(probe(s, {name}, {"seccomp-profile"}).line == "errno EACCES");
      BOOST_TEST(probe(s, {name}, {"landlock"}).line == "errno EACCES");
      BOOST_TEST(probe(s, {name}, {"dumpable"}).line == "errno EACCES");
      auto open = probe(s, {name}, {"dumpable", "landlock"});
      BOOST_TEST(open.line.rfind("allowed", 0) == 0u, open.line);
    }
  }
}

// /proc/1/fd is mode 0500 owned by init's owner; a non-dumpable process's /proc entries belong
// to root (unmapped here), so the listing is refused by DAC. Landlock does not cover it.
BOOST_AUTO_TEST_CASE(init_fd_table_is_closed_by_dumpable) {
  Sandbox s;
  BOOST_TEST(probe(s, {"proc1-fd"}).line == "errno EACCES");
  BOOST_TEST(probe(s, {"proc1-fd"}, {"seccomp-profile", "landlock"}).line == "errno EACCES");
  auto open = probe(s, {"proc1-fd"}, {"dumpable"});
  BOOST_TEST(open.line.rfind("allowed ", 0) == 0u, open.line);
}

// CVE-2019-5736 (runc): open /proc/1/exe for writing and overwrite the runtime on the host.
// The wall is the init file itself: root-owned (unmapped, so "nobody" inside) and writable
// only by root, which prepare() insists on. Removing dumpable, Landlock and the profile does
// not open it; the control is the check: a group-writable init makes cordon refuse to start.
BOOST_AUTO_TEST_CASE(init_binary_cannot_be_opened_for_writing_and_stays_unchanged) {
  Sandbox s;
  std::string init = dir_of(cordon_bin()) + "/cordon-init";
  std::string before = slurp(init);
  BOOST_TEST_REQUIRE(!before.empty(), init);
  BOOST_TEST(probe(s, {"proc1-exe-write"}).line == "errno EACCES");
  BOOST_TEST(probe(s, {"proc1-exe-write"}, {"dumpable", "landlock", "seccomp-profile"}).line ==
             "errno EACCES");
  struct stat st {};
  BOOST_TEST_REQUIRE(::stat(init.c_str(), &st) == 0);
  BOOST_TEST(st.st_uid == 0u);
  BOOST_TEST((st.st_mode & 022) == 0u);
  BOOST_TEST((slurp(init) == before), "cordon-init changed on the host");

  // Control: the same cordon next to a group-writable init is refused before anything runs.
  std::string dir = s.base + "/bin";
  std::filesystem::create_directories(dir + "/seccomp");
  std::filesystem::copy_file(cordon_bin(), dir + "/cordon");
  std::filesystem::copy_file(init, dir + "/cordon-init");
  std::filesystem::copy_file(dir_of(cordon_bin()) + "/seccomp/default.json",
                             dir + "/seccomp/default.json");
  BOOST_TEST_REQUIRE(::chmod((dir + "/cordon-init").c_str(), 0775) == 0);
  auto r = run_process({dir + "/cordon", "run", "--root", s.root, "--state-dir", s.state, "--",
                        probe_bin(), "proc1-exe-write"});
  BOOST_TEST(r.exit_code() == 125);
  BOOST_TEST(r.out.empty(), r.out);
  BOOST_TEST(r.err.find("must be a root-owned file writable only by root") != std::string::npos,
             r.err);
}

// ---------------------------------------------------------------------------------------------
// Descriptors: wall close-fds
// ---------------------------------------------------------------------------------------------

// cordon started with a host file open at fd 20 (not CLOEXEC, as a careless caller leaves it):
// the command sees only 0/1/2. With the wall removed, the descriptor reaches the command, and
// read(2) on it returns a file no mount shows (fd 20 is above the fixed numbers 3..8 the
// child arranges, so none of those overwrites it).
BOOST_AUTO_TEST_CASE(the_command_inherits_no_descriptor_cordon_was_started_with) {
  Sandbox s;
  std::string secret = s.base + "/outside-secret";
  BOOST_TEST_REQUIRE(write_file(secret, "host-only\n", 0644));
  int fd = ::open(secret.c_str(), O_RDONLY);  // deliberately without O_CLOEXEC
  BOOST_TEST_REQUIRE(fd >= 0);
  constexpr int kLeaked = 20;
  BOOST_TEST_REQUIRE(::dup2(fd, kLeaked) == kLeaked);
  ::close(fd);
  auto fds = probe(s, {"fds"});
  auto via = probe(s, {"read-fd", "20"});
  auto fds_ctl = probe(s, {"fds"}, {"close-fds"});
  auto via_ctl = probe(s, {"read-fd", "20"}, {"close-fds"});
  // Reopening it through /proc/self/fd is a path lookup: Landlock refuses that on its own.
  auto reopen_ctl = probe(s, {"read-file", "/proc/self/fd/20"}, {"close-fds"});
  ::close(kLeaked);
  BOOST_TEST(fds.line == "value -");
  BOOST_TEST(via.line == "errno EBADF");
  BOOST_TEST((" " + fds_ctl.line + " ").find(" 20 ") != std::string::npos, fds_ctl.line);
  BOOST_TEST(via_ctl.line == "value " + hex("host-only\n"));
  BOOST_TEST(reopen_ctl.line == "errno EACCES");
}

// ---------------------------------------------------------------------------------------------
// Credentials: walls cap-drop, no-new-privs
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(capability_sets_are_empty_and_securebits_locked) {
  Sandbox s;
  const std::string zero = "0000000000000000";
  BOOST_TEST(probe(s, {"caps"}).line == "value CapInh=" + zero + " CapPrm=" + zero + " CapEff=" +
                                            zero + " CapBnd=" + zero + " CapAmb=" + zero);
  // NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, each with its lock, and KEEP_CAPS_LOCKED.
  BOOST_TEST(probe(s, {"securebits"}).line == "value 0xef");
  // Even as uid 0 inside, nothing comes back at exec.
  auto as_root = probe(s, {"caps"}, {}, {"--user", "0"});
  BOOST_TEST(as_root.line.find("CapEff=" + zero) != std::string::npos, as_root.line);
  BOOST_TEST(as_root.line.find("CapBnd=" + zero) != std::string::npos, as_root.line);
  // Control: without the drop the bounding set is full, securebits unset, and uid 0 gets
  // every capability of its namespace at exec.
  auto caps_ctl = probe(s, {"caps"}, {"cap-drop"});
  BOOST_TEST(caps_ctl.line.find("CapBnd=" + zero) == std::string::npos, caps_ctl.line);
  BOOST_TEST(probe(s, {"securebits"}, {"cap-drop"}).line == "value 0x0");
  auto root_ctl = probe(s, {"caps"}, {"cap-drop"}, {"--user", "0"});
  BOOST_TEST(root_ctl.line.find("CapEff=" + zero) == std::string::npos, root_ctl.line);
}

BOOST_AUTO_TEST_CASE(ids_are_the_user_value_with_no_supplementary_groups) {
  Sandbox s;
  BOOST_TEST(probe(s, {"groups"}).line == "value uid=1000,1000,1000 gid=1000,1000,1000 groups=");
  BOOST_TEST(probe(s, {"groups"}, {}, {"--user", "4242"}).line ==
             "value uid=4242,4242,4242 gid=4242,4242,4242 groups=");
  // Control: without the drop the real ids stay the (unmapped) ones of the spawner.
  auto ctl = probe(s, {"groups"}, {"cap-drop"}, {"--user", "4242"});
  BOOST_TEST(ctl.line.rfind("value uid=4242,4242,4242 ", 0) != 0u, ctl.line);
}

namespace {

// `cordon run` started by a process holding the supplementary groups `groups` (a child of the
// test that sets them just before its exec): stdout, and the exit code; -1 when the child
// could not take the groups.
std::pair<std::string, int> run_holding_groups(const std::vector<std::string>& args,
                                               const std::vector<gid_t>& groups) {
  int out[2];
  BOOST_REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    std::vector<gid_t> held(groups.size() + 1);
    if (::setgroups(groups.size(), groups.data()) != 0 ||
        ::getgroups(static_cast<int>(held.size()), held.data()) !=
            static_cast<int>(groups.size()) ||
        ::dup2(out[1], 1) != 1) {
      ::_exit(97);
    }
    std::vector<char*> av;
    for (const auto& a : args) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    ::execv(av[0], av.data());
    ::_exit(98);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  BOOST_REQUIRE(::waitpid(pid, &status, 0) == pid);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  BOOST_REQUIRE_MESSAGE(code != 97, "the child could not take the supplementary groups");
  return {text, code};
}

}  // namespace

// The groups above are those of a test holding none. A caller holding supplementary groups
// (adm 4, sudo 27: groups that open host files) passes them through clone and exec; the
// child's setgroups(0) drops them, so the command holds none. Control: without the drop the
// command holds both (shown as the overflow gid, since neither is mapped into the sandbox,
// but the kernel still grants their access on host files).
BOOST_AUTO_TEST_CASE(a_callers_supplementary_groups_never_reach_the_command) {
  Sandbox s;
  const std::vector<gid_t> groups = {4, 27};
  auto [out, code] = run_holding_groups(s.args({}, {probe_bin(), "groups"}), groups);
  BOOST_TEST(code == 0);
  BOOST_TEST(out == "probe groups: value uid=1000,1000,1000 gid=1000,1000,1000 groups=\n");
  auto [ctl, ctl_code] = run_holding_groups(
      s.args({"--test-disable-wall", "cap-drop"}, {probe_bin(), "groups"}, true), groups);
  BOOST_TEST(ctl_code == 0);
  BOOST_TEST(ctl.find(" groups=65534,65534\n") != std::string::npos, ctl);
}

// Landlock and seccomp need no_new_privs from an unprivileged process, so removing that wall
// alone makes the sandbox fail closed; only with both removed as well does the command run
// with NoNewPrivs=0.
BOOST_AUTO_TEST_CASE(no_new_privs_is_set_and_without_it_the_sandbox_fails_closed) {
  Sandbox s;
  BOOST_TEST(probe(s, {"nonewprivs"}).line == "value 1");
  std::string status = s.base + "/nnp.json";
  auto r = run_process(s.args({"--json-status", status, "--test-disable-wall", "no-new-privs"},
                              {probe_bin(), "nonewprivs"}, true));
  BOOST_TEST(r.exit_code() == 125);
  BOOST_TEST(r.out.empty(), r.out);
  json st = json::parse(slurp(status), nullptr, false);
  BOOST_TEST(st["state"] == "setup-failed");
  BOOST_TEST(st["setup"]["step"] == "command: Landlock");
  BOOST_TEST(st["setup"]["errno"] == "EPERM");
  BOOST_TEST(
      probe(s, {"nonewprivs"}, {"no-new-privs", "landlock", "seccomp-profile", "seccomp-fixed"})
          .line == "value 0");
}

// ---------------------------------------------------------------------------------------------
// Host files and /etc secrets: walls etc-mask and the mount tree
// ---------------------------------------------------------------------------------------------

// On the real /etc: the mask makes /etc/shadow an empty read-only file; without the mask the
// host's own DAC (0640 root:shadow, root unmapped inside) still refuses.
BOOST_AUTO_TEST_CASE(etc_shadow_is_an_empty_file) {
  Sandbox s;
  BOOST_TEST(probe(s, {"read-file", "/etc/shadow"}).line == "value -");
  auto st = probe(s, {"stat", "/etc/shadow"});
  BOOST_TEST(st.line.find(" size=0") != std::string::npos, st.line);
  BOOST_TEST(probe(s, {"read-file", "/etc/shadow"}, {"etc-mask"}).line == "errno EACCES");
}

// The mask alone against a world-readable secret: cordon runs in a private mount namespace
// where /etc/shadow is a readable fake and /etc/ssh holds a readable fake host key (this host
// has none), so the host's /etc is never changed. Masked: empty. Control: the contents.
BOOST_AUTO_TEST_CASE(etc_mask_alone_hides_readable_secrets_and_ssh_host_keys) {
  Sandbox s;
  std::string fake_shadow = s.base + "/fake-shadow";
  BOOST_TEST_REQUIRE(write_file(fake_shadow, "root:$6$fake:19000::::::\n", 0644));
  auto setup = [&] {
    return ::mount(fake_shadow.c_str(), "/etc/shadow", nullptr, MS_BIND, nullptr) == 0 &&
           ::mount("tmpfs", "/etc/ssh", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755") == 0 &&
           write_file("/etc/ssh/ssh_host_ed25519_key", "FAKE HOST KEY\n", 0644);
  };
  for (const char* path : {"/etc/shadow", "/etc/ssh/ssh_host_ed25519_key"}) {
    BOOST_TEST_CONTEXT(path) {
      auto masked = run_in_private_mount_ns(s.args({}, {probe_bin(), "read-file", path}), setup);
      BOOST_TEST(masked.exit_code() == 0, masked.out);
      BOOST_TEST(masked.out == "probe read-file: value -\n");
      auto ctl = run_in_private_mount_ns(
          s.args({"--test-disable-wall", "etc-mask"}, {probe_bin(), "read-file", path}, true),
          setup);
      std::string want =
          std::string(path) == "/etc/shadow" ? "root:$6$fake:19000::::::\n" : "FAKE HOST KEY\n";
      BOOST_TEST(ctl.out == "probe read-file: value " + hex(want) + "\n");
    }
  }
  // The private namespace is gone with its last process: the host's /etc/shadow is intact.
  struct stat st {};
  BOOST_TEST_REQUIRE(::stat("/etc/shadow", &st) == 0);
  BOOST_TEST((st.st_mode & 0004) == 0u);
}

// Every path of the masked list (etc_secret_paths(), the list prepare() masks from), each a
// world-readable fake, so only the mask stands between the command and it: cordon runs in a
// private mount namespace whose /etc is an overlay of the host's with the fakes written into
// its upper layer (the host's /etc is never changed). A masked file reads empty; a masked
// directory is an empty one of mode 000, so the file put in it (`/etc/sudoers.d/x`,
// `/etc/cordon/policy.json`) cannot be looked up: EACCES. A host key of a name the list does
// not spell (`ssh_host_xmss_key`) is masked by the glob. Control without the etc-mask wall:
// every fake is read.
BOOST_AUTO_TEST_CASE(every_path_of_the_masked_etc_list_hides_a_world_readable_secret) {
  Sandbox s;
  auto listed = cordon::sandbox::etc_secret_paths(cordon::sandbox::SandboxSpec{}, false);
  BOOST_TEST_REQUIRE(listed.has_value(), (listed ? "" : listed.error().message()));
  // The secrets that are directories on a standard host: the fake goes inside.
  const std::set<std::string> dirs = {"/etc/sudoers.d", "/etc/ssl/private", "/etc/cordon"};
  const std::map<std::string, std::string> inside = {
      {"/etc/sudoers.d", "x"}, {"/etc/ssl/private", "key.pem"}, {"/etc/cordon", "policy.json"}};
  struct Fake {
    std::string secret, read_at, content;
  };
  std::vector<Fake> fakes;
  std::vector<std::string> secrets = *listed;
  secrets.push_back("/etc/ssh/ssh_host_xmss_key");
  for (const auto& secret : secrets) {
    auto d = inside.find(secret);
    std::string at = d == inside.end() ? secret : secret + "/" + d->second;
    fakes.push_back({secret, at, "FAKE SECRET " + at + "\n"});
  }
  BOOST_TEST_REQUIRE(fakes.size() >= 17u);
  const std::string layers = s.base + "/etc-layers";
  BOOST_TEST_REQUIRE(::mkdir(layers.c_str(), 0755) == 0);
  auto setup = [&] {
    const std::string opts =
        "lowerdir=/etc,upperdir=" + layers + "/upper,workdir=" + layers + "/work";
    if (::mount("tmpfs", layers.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0 ||
        ::mkdir((layers + "/upper").c_str(), 0755) != 0 ||
        ::mkdir((layers + "/work").c_str(), 0755) != 0 ||
        ::mount("overlay", "/etc", "overlay", 0, opts.c_str()) != 0) {
      return false;
    }
    for (const auto& f : fakes) {
      std::error_code ec;
      std::filesystem::create_directories(dir_of(f.read_at), ec);
      if (dirs.count(f.secret) != 0 && ::chmod(f.secret.c_str(), 0755) != 0) {
        return false;
      }
      if (!write_file(f.read_at, f.content, 0644)) {
        return false;
      }
    }
    return true;
  };
  // One sandbox reads them all, the probe (static) copied into the root so the loop can run it.
  const std::string probe_copy = s.root + "/probe";
  std::filesystem::copy_file(probe_bin(), probe_copy);
  BOOST_TEST_REQUIRE(::chmod(probe_copy.c_str(), 0755) == 0);
  std::string script;
  for (const auto& f : fakes) {
    script += "printf '%s ' " + f.read_at + "; " + probe_copy + " read-file " + f.read_at + "; ";
  }
  auto masked = run_in_private_mount_ns(s.args({}, {"/bin/sh", "-c", script}), setup);
  auto ctl = run_in_private_mount_ns(
      s.args({"--test-disable-wall", "etc-mask"}, {"/bin/sh", "-c", script}, true), setup);
  BOOST_TEST(masked.exit_code() == 0, masked.out);
  BOOST_TEST(ctl.exit_code() == 0, ctl.out);
  std::string want_masked, want_ctl;
  for (const auto& f : fakes) {
    const bool dir = dirs.count(f.secret) != 0;
    want_masked += f.read_at + " probe read-file: " + (dir ? "errno EACCES" : "value -") + "\n";
    want_ctl += f.read_at + " probe read-file: value " + hex(f.content) + "\n";
  }
  BOOST_TEST(masked.out == want_masked);
  BOOST_TEST(ctl.out == want_ctl);
  // The overlay went with the namespace: nothing of it reached the host's /etc.
  BOOST_TEST(!std::filesystem::exists("/etc/cordon/policy.json"));
  BOOST_TEST(!std::filesystem::exists("/etc/ssh/ssh_host_xmss_key"));
}

// The /etc row of docs/security.md names the masked list; it must be the list prepare() masks
// (every literal path in it, nothing else but host keys the documented glob matches).
BOOST_AUTO_TEST_CASE(the_documented_etc_secrets_are_the_masked_list) {
  std::ifstream in(std::string(CORDON_SOURCE_DIR) + "/docs/security.md");
  std::string line, row;
  while (std::getline(in, line)) {
    if (line.rfind("| `/etc` secrets", 0) == 0) {
      row = line;
    }
  }
  const std::string marker = "the masked list: ";
  auto from = row.find(marker);
  BOOST_TEST_REQUIRE(from != std::string::npos, "no `" << marker << "` in the /etc row");
  auto to = row.find(')', from);
  BOOST_TEST_REQUIRE(to != std::string::npos);
  std::set<std::string> documented;
  std::vector<std::string> globs;
  const std::string text = row.substr(from, to - from);
  for (size_t a = text.find('`'); a != std::string::npos; a = text.find('`', a + 1)) {
    size_t b = text.find('`', a + 1);
    BOOST_TEST_REQUIRE(b != std::string::npos);
    std::string item = text.substr(a + 1, b - a - 1);
    if (item.find('*') != std::string::npos) {
      globs.push_back(item);
    } else {
      documented.insert(item);
    }
    a = b;
  }
  BOOST_TEST(globs == std::vector<std::string>{"/etc/ssh/ssh_host_*key"});
  auto listed = cordon::sandbox::etc_secret_paths(cordon::sandbox::SandboxSpec{}, false);
  BOOST_TEST_REQUIRE(listed.has_value(), (listed ? "" : listed.error().message()));
  const std::set<std::string> masked(listed->begin(), listed->end());
  for (const auto& d : documented) {
    BOOST_TEST(masked.count(d) == 1u, d << " is documented but not masked");
  }
  for (const auto& m : masked) {
    bool by_glob = std::any_of(globs.begin(), globs.end(), [&](const std::string& g) {
      return ::fnmatch(g.c_str(), m.c_str(), FNM_PATHNAME) == 0;
    });
    BOOST_TEST((documented.count(m) == 1u || by_glob), m << " is masked but not documented");
  }
}

// A masked secret that is a symlink into a system tree: /etc/ssl/private pointing into /usr.
// The mask is bound where it resolves (made before pivot_root, a bind by the link's path would
// follow it into the host's tree), translated into the sandbox's own /usr: both ways to the
// key show the masked directory (mode 000). In a private mount namespace: tmpfs on /usr/local
// (the key) and on /etc/ssl (the link). Control without the etc-mask wall: the key is read.
BOOST_AUTO_TEST_CASE(a_secret_resolving_into_usr_is_masked_there) {
  Sandbox s;
  auto setup = [&] {
    return ::mount("tmpfs", "/usr/local", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755") ==
               0 &&
           ::mkdir("/usr/local/cordon-private", 0755) == 0 &&
           write_file("/usr/local/cordon-private/key", "FAKE KEY\n", 0644) &&
           ::mount("tmpfs", "/etc/ssl", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755") == 0 &&
           ::symlink("/usr/local/cordon-private", "/etc/ssl/private") == 0;
  };
  for (const char* path : {"/etc/ssl/private/key", "/usr/local/cordon-private/key"}) {
    BOOST_TEST_CONTEXT(path) {
      auto masked = run_in_private_mount_ns(s.args({}, {probe_bin(), "read-file", path}), setup);
      BOOST_TEST(masked.out == "probe read-file: errno EACCES\n");
      auto ctl = run_in_private_mount_ns(
          s.args({"--test-disable-wall", "etc-mask"}, {probe_bin(), "read-file", path}, true),
          setup);
      BOOST_TEST(ctl.out == "probe read-file: value " + hex("FAKE KEY\n") + "\n");
    }
  }
}

// /etc itself a symlink (/etc -> /etc-real, as on hosts that keep /etc elsewhere): the masks
// are bound in the sandbox's /etc, a copy of what the link resolves to, not at the resolved
// path (etc-real does not exist in the sandbox; a mask there failed every sandbox, fixed in
// session 27 before it shipped). And /etc a link into a system tree (/etc ->
// /usr/local/etc-real): the sandbox's /usr shows the same file, masked there too (it was not:
// found by a review, session 28). The test runs cordon in a root of its own: a private mount
// namespace, a tmpfs root holding the host's top-level directories bound recursively (its
// top-level symlinks copied), the real /etc bound from the host's with a readable fake shadow,
// and /etc a symlink to it. Control without the etc-mask wall: the fake.
BOOST_AUTO_TEST_CASE(etc_itself_a_symlink_still_has_its_secrets_masked) {
  Sandbox s;
  const std::string fake = "root:$6$fake:19000::::::\n";
  const std::string fake_shadow = s.base + "/fake-shadow";
  const std::string root = s.base + "/host-root";
  BOOST_TEST_REQUIRE(write_file(fake_shadow, fake, 0644));
  BOOST_TEST_REQUIRE(::mkdir(root.c_str(), 0755) == 0);
  struct stat host_etc {};
  BOOST_TEST_REQUIRE(::lstat("/etc", &host_etc) == 0);
  for (const std::string etc_real : {"/etc-real", "/usr/local/etc-real"}) {
    BOOST_TEST_CONTEXT("/etc -> " << etc_real) {
      auto setup = [&] {
        if (::mount("tmpfs", root.c_str(), "tmpfs", 0, "size=1m,mode=0755") != 0) {
          return false;
        }
        for (const auto& e : std::filesystem::directory_iterator("/")) {
          const std::string name = e.path().filename();
          const std::string at = root + "/" + name;
          if (e.is_symlink() && name != "etc") {
            if (::symlink(std::filesystem::read_symlink(e.path()).c_str(), at.c_str()) != 0) {
              return false;
            }
          } else if (e.is_directory() && name != "etc") {
            if (::mkdir(at.c_str(), 0755) != 0 ||
                ::mount(e.path().c_str(), at.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
              return false;
            }
          }
        }
        if (etc_real.starts_with("/usr/local/") && ::mount("tmpfs", (root + "/usr/local").c_str(),
                                                           "tmpfs", 0, "size=64k,mode=0755") != 0) {
          return false;
        }
        const std::string real = root + etc_real;
        if (::mkdir(real.c_str(), 0755) != 0 ||
            ::mount("/etc", real.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0 ||
            ::mount(fake_shadow.c_str(), (real + "/shadow").c_str(), nullptr, MS_BIND, nullptr) !=
                0 ||
            ::symlink(etc_real.c_str(), (root + "/etc").c_str()) != 0 ||
            ::mkdir((root + "/.old").c_str(), 0700) != 0 || ::chdir(root.c_str()) != 0 ||
            ::syscall(SYS_pivot_root, ".", ".old") != 0 || ::umount2("/.old", MNT_DETACH) != 0 ||
            ::chdir("/") != 0) {
          return false;
        }
        char real_etc[PATH_MAX];
        return ::realpath("/etc", real_etc) != nullptr && real_etc == etc_real;
      };
      std::vector<std::string> paths = {"/etc/shadow"};
      if (etc_real.starts_with("/usr/")) {
        paths.push_back(etc_real + "/shadow");
      }
      for (const auto& path : paths) {
        auto masked = run_in_private_mount_ns(s.args({}, {probe_bin(), "read-file", path}), setup);
        BOOST_TEST(masked.exit_code() == 0, masked.out);
        BOOST_TEST(masked.out == "probe read-file: value -\n", path);
        auto ctl = run_in_private_mount_ns(
            s.args({"--test-disable-wall", "etc-mask"}, {probe_bin(), "read-file", path}, true),
            setup);
        BOOST_TEST(ctl.out == "probe read-file: value " + hex(fake) + "\n", path);
      }
      // The generated identity files too: /usr/local/etc-real/passwd is the sandbox's passwd,
      // not the host's (it was the host's before session 29; the probe reads 64 bytes).
      if (etc_real.starts_with("/usr/")) {
        auto generated =
            run_in_private_mount_ns(s.args({}, {probe_bin(), "read-file", "/etc/passwd"}), setup);
        auto in_usr = run_in_private_mount_ns(
            s.args({}, {probe_bin(), "read-file", etc_real + "/passwd"}), setup);
        BOOST_TEST(generated.out.find(hex("\ncordon:x:")) != std::string::npos, generated.out);
        BOOST_TEST(in_usr.out == generated.out);
      }
    }
  }
  // The tmpfs root went with the namespace: the host's /etc is what it was, and nothing was
  // made in its /usr.
  struct stat after {
  }, made{};
  BOOST_TEST_REQUIRE(::lstat("/etc", &after) == 0);
  BOOST_TEST(S_ISDIR(after.st_mode) == S_ISDIR(host_etc.st_mode));
  BOOST_TEST(::lstat("/usr/local/etc-real", &made) != 0);
}

// A mask is a bind over the secret's dentry, and the kernel detaches a mount whose dentry is
// renamed over, in every namespace: a host that replaces a masked secret while a sandbox runs
// (a new file renamed over it, as editors and shadow-utils do) takes the mask down in that
// sandbox (docs/security.md, "Known limits"). What still holds there is the file's mode: the
// sandbox's user has no capability over host files, so a secret only its owner may read stays
// unreadable. The control replaces it with a world-readable file, which the command then reads:
// the replacement did reach the running sandbox. In a private mount namespace with a tmpfs on
// /etc/ssh, as above; a helper there replaces the key once the command says it is ready.
BOOST_AUTO_TEST_CASE(a_secret_replaced_while_a_sandbox_runs_is_still_refused_by_its_mode) {
  const std::string key = "/etc/ssh/ssh_host_ed25519_key";
  for (mode_t mode : {mode_t{0600}, mode_t{0644}}) {
    BOOST_TEST_CONTEXT("replaced by a file of mode " << std::oct << mode) {
      Sandbox s;
      auto setup = [&] {
        if (::mount("tmpfs", "/etc/ssh", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755") !=
                0 ||
            !write_file(key, "OLD HOST KEY\n", 0600)) {
          return false;
        }
        pid_t helper = ::fork();
        if (helper == 0) {
          for (int i = 0; i < 400 && ::access((s.root + "/ready").c_str(), F_OK) != 0; ++i) {
            ::usleep(25'000);
          }
          bool ok = write_file(key + ".new", "NEW HOST KEY\n", mode) &&
                    ::rename((key + ".new").c_str(), key.c_str()) == 0 &&
                    write_file(s.root + "/renamed", "", 0644);
          ::_exit(ok ? 0 : 1);
        }
        return helper > 0;
      };
      auto r = run_in_private_mount_ns(
          s.args({}, {"/bin/sh", "-c",
                      "cat " + key + "; : > " + s.root + "/ready; i=0; while [ ! -e " + s.root +
                          "/renamed ] && [ $i -lt 400 ]; do sleep 0.025; i=$((i+1)); done; cat " +
                          key + " && echo read"}),
          setup);
      BOOST_TEST(::access((s.root + "/renamed").c_str(), F_OK) == 0, r.out);
      if (mode == 0600) {
        // Masked at first (empty); then the new file's mode refuses it.
        BOOST_TEST(r.out.find("HOST KEY") == std::string::npos, r.out);
        BOOST_TEST(r.out.find("Permission denied") != std::string::npos, r.out);
        BOOST_TEST(r.exit_code() != 0);
      } else {
        BOOST_TEST(r.out.find("OLD HOST KEY") == std::string::npos, r.out);
        BOOST_TEST(r.out == "NEW HOST KEY\nread\n", r.out);
      }
    }
  }
}

// Only what cordon mounts exists inside. The control is the same probe run on the host,
// outside any sandbox: each path is there.
BOOST_AUTO_TEST_CASE(home_dirs_host_tmp_and_cordon_state_are_invisible) {
  Sandbox s;
  char marker[] = "/tmp/cordon-secfs-marker.XXXXXX";
  int mfd = ::mkstemp(marker);
  BOOST_TEST_REQUIRE(mfd >= 0);
  ::close(mfd);
  std::string sibling = s.base + "/next-to-the-root";
  BOOST_TEST_REQUIRE(write_file(sibling, "x", 0644));
  for (const std::string& path :
       {std::string("/root"), std::string("/home"), std::string(marker), s.state, sibling}) {
    BOOST_TEST_CONTEXT(path) {
      BOOST_TEST(probe(s, {"stat", path}).line == "errno ENOENT");
      auto host = run_process({probe_bin(), "stat", path});
      BOOST_TEST(host.out.rfind("probe stat: value ", 0) == 0u, host.out);
    }
  }
  // /tmp itself exists inside: the sandbox's own, empty tmpfs.
  BOOST_TEST(probe(s, {"stat", "/tmp"}).line.rfind("value mode=041777 ", 0) == 0u);
  ::unlink(marker);
}

// Superblocks cost kernel memory per sandbox and, worse, a shrinker slot in every memory
// cgroup on the machine: cordon mounts one tmpfs, the root; /tmp, /dev/shm, /dev and each
// masked /etc directory are bind mounts of its directories. Each keeps a mount of its own, so
// its flags and isolation stay as they were: the masked directory is empty, mode 000 and
// read-only, /dev and the root are read-only, /tmp and /dev/shm are writable and sticky, and
// nothing of the read-only root can be linked or moved into them (another mount: EXDEV).
BOOST_AUTO_TEST_CASE(root_tmp_dev_shm_dev_and_masked_dirs_share_one_tmpfs_superblock) {
  Sandbox s;
  auto mi = s.run({}, {"/bin/cat", "/proc/self/mountinfo"});
  BOOST_TEST_REQUIRE(mi.exit_code() == 0, mi.err);
  const std::string& text = mi.out;
  std::map<std::string, std::string> dev_of;   // mount point -> major:minor (the last mount)
  std::map<std::string, std::string> opts_of;  // mount point -> per-mount options (the last)
  std::set<std::string> tmpfs_devs;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, options;
    f >> id >> parent >> dev >> root >> point >> options;
    dev_of[point] = dev;
    opts_of[point] = "," + options + ",";
    size_t dash = line.find(" - ");
    if (dash != std::string::npos && line.compare(dash + 3, 6, "tmpfs ") == 0) {
      tmpfs_devs.insert(dev);
    }
  }
  auto has_opt = [](const std::string& opts, const char* opt) {
    return opts.find("," + std::string(opt) + ",") != std::string::npos;
  };
  BOOST_TEST(tmpfs_devs.size() == 1u, text);
  BOOST_TEST(dev_of.at("/tmp") == dev_of.at("/dev/shm"));
  BOOST_TEST(dev_of.at("/dev") == dev_of.at("/"));
  BOOST_TEST(dev_of.at("/tmp") == dev_of.at("/"));
  BOOST_TEST(has_opt(opts_of.at("/"), "ro"), opts_of.at("/"));
  // The writable mounts of the root's superblock reach none of the root's own files: a hard
  // link or a rename from the read-only root into them is refused, so is the reverse.
  // Sources on the root's own mount (/bin, /lib: symlinks of the root tmpfs), on /dev's and on
  // a generated file's.
  for (const char* into : {"/tmp/x", "/dev/shm/x"}) {
    for (const char* from : {"/bin", "/lib", "/dev/ptmx", "/dev/fd", "/etc/hostname"}) {
      BOOST_TEST(probe(s, {"link", from, into}).line == "errno EXDEV", from << " " << into);
      BOOST_TEST(probe(s, {"rename", from, into}).line == "errno EXDEV", from << " " << into);
    }
  }
  // The reverse, in one sandbox: a file of /tmp cannot be linked or moved into the root, /dev or
  // /etc (read-only, another mount), and stays where it was.
  static const char kReverse[] = R"(import errno, os
for f in ("/tmp/t", "/dev/shm/t"):
    open(f, "w").close()
    for into in ("/t", "/dev/t", "/etc/t"):
        for op in (os.link, os.rename):
            try:
                op(f, into)
                print(op.__name__, f, into, "allowed")
            except OSError as e:
                print(op.__name__, f, into, errno.errorcode[e.errno])
print(sorted(os.listdir("/tmp")), sorted(os.listdir("/dev/shm")),
      [p for p in ("/t", "/dev/t", "/etc/t") if os.path.lexists(p)])
)";
  auto rev = s.run({}, {"/usr/bin/python3", "-c", kReverse});
  BOOST_TEST_REQUIRE(rev.exit_code() == 0, rev.err);
  std::istringstream rev_lines(rev.out);
  int refused = 0;
  for (std::string line; std::getline(rev_lines, line);) {
    if (line.rfind("link ", 0) != 0 && line.rfind("rename ", 0) != 0) continue;
    BOOST_TEST((line.ends_with(" EXDEV") || line.ends_with(" EROFS")), line);
    ++refused;
  }
  BOOST_TEST(refused == 12, rev.out);
  BOOST_TEST(rev.out.ends_with("['home', 't'] ['t'] []\n"), rev.out);
  for (const char* dir : {"/tmp", "/dev/shm"}) {
    BOOST_TEST(probe(s, {"stat", dir}).line.rfind("value mode=041777 ", 0) == 0u, dir);
    BOOST_TEST(probe(s, {"write-file", std::string(dir) + "/x"}).line == "allowed", dir);
  }
  BOOST_TEST(probe(s, {"write-file", "/dev/x"}).line == "errno EROFS");
  // The flags each mount had when it was a tmpfs of its own.
  auto has = [&](const char* point, const char* opt) { return has_opt(opts_of.at(point), opt); };
  for (const char* opt : {"ro", "nosuid", "noexec"}) {
    BOOST_TEST(has("/dev", opt), "/dev " << opt << ": " << opts_of.at("/dev"));
  }
  for (const char* point : {"/tmp", "/dev/shm"}) {
    for (const char* opt : {"rw", "nosuid", "nodev"}) {
      BOOST_TEST(has(point, opt), point << " " << opt << ": " << opts_of.at(point));
    }
  }
  // The generated /etc files and the masks: each a copy of the root's mount made read-only,
  // nosuid, nodev and noexec before it was attached (child.cpp bind_ro).
  for (const char* point : {"/etc/passwd", "/etc/group", "/etc/hostname", "/etc/hosts",
                            "/etc/shadow", "/etc/ssl/private"}) {
    // The generated four always; a mask where the host has the secret (Debian has both).
    BOOST_TEST_REQUIRE(opts_of.count(point) == 1u, point << " is not a mount: " << text);
    BOOST_TEST(dev_of.at(point) == dev_of.at("/"), point);
    for (const char* opt : {"ro", "nosuid", "nodev", "noexec"}) {
      BOOST_TEST(has(point, opt), point << " " << opt << ": " << opts_of.at(point));
    }
  }
  // /dev is 0755 whatever the umask, and the command, which owns it, cannot change that,
  // add a node, or put one anywhere it can write.
  BOOST_TEST(probe(s, {"stat", "/dev"}).line.rfind("value mode=040755 ", 0) == 0u,
             probe(s, {"stat", "/dev"}).line);
  auto chmod_dev = s.run({}, {"/bin/chmod", "0777", "/dev"});
  BOOST_TEST(chmod_dev.exit_code() != 0);
  BOOST_TEST(chmod_dev.err.find("Read-only file system") != std::string::npos, chmod_dev.err);
  for (const char* node : {"/dev/cordon-null", "/tmp/cordon-null", "/dev/shm/cordon-null"}) {
    BOOST_TEST(probe(s, {"mknod-dev", node}).line != "allowed", node);
  }
  // One size budget for both: the 10 MiB written to /tmp are used space of /dev/shm.
  auto shared = s.run(
      {},
      {"/bin/sh", "-c", "head -c 10485760 /dev/zero > /tmp/a && stat -f -c '%b %f %S' /dev/shm"});
  BOOST_TEST_REQUIRE(shared.exit_code() == 0, shared.err);
  std::istringstream sf(shared.out);
  uint64_t blocks = 0, free_blocks = 0, block_size = 0;
  sf >> blocks >> free_blocks >> block_size;
  BOOST_TEST((blocks - free_blocks) * block_size >= 10485760u, shared.out);
  struct stat st {};
  if (::lstat("/etc/ssl/private", &st) == 0 && S_ISDIR(st.st_mode)) {
    BOOST_TEST(dev_of.at("/etc/ssl/private") == dev_of.at("/"));
    BOOST_TEST(probe(s, {"stat", "/etc/ssl/private"}).line.rfind("value mode=040000 ", 0) == 0u);
    // Mode 000 answers first (the read-only mount and the removed directory stand behind).
    BOOST_TEST(probe(s, {"write-file", "/etc/ssl/private/x"}).line == "errno EACCES");
    BOOST_TEST(probe(s, {"mkdir", "/etc/ssl/private/x"}).line == "errno EACCES");
  }
}

// ---------------------------------------------------------------------------------------------
// Writes outside the working root: read-only mounts first, Landlock second
// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(writes_outside_the_root_hit_read_only_mounts) {
  Sandbox s;
  for (const char* path : {"/usr/cordon-probe", "/usr/bin/true", "/etc/cordon-probe",
                           "/etc/hostname", "/cordon-probe", "/dev/cordon-probe"}) {
    BOOST_TEST(probe(s, {"write-file", path}).line == "errno EROFS", path);
  }
  BOOST_TEST(probe(s, {"mkdir", "/usr/cordon-probe"}).line == "errno EROFS");
  BOOST_TEST(!std::filesystem::exists("/usr/cordon-probe"));
  BOOST_TEST(!std::filesystem::exists("/etc/cordon-probe"));
  // The working root is writable, and the file lands on the host.
  BOOST_TEST(probe(s, {"write-file", s.root + "/made-inside"}).line == "allowed");
  BOOST_TEST(slurp(s.root + "/made-inside") == "x");
}

// A --ro directory that anyone may write on the host (mode 0777): the read-only bind answers
// EROFS; with that bind made writable Landlock answers EACCES (the tree has read rights only);
// with both removed the write lands on the host.
BOOST_AUTO_TEST_CASE(a_read_only_path_is_refused_by_the_mount_then_by_landlock) {
  Sandbox s;
  std::string ro = s.base + "/shared";
  BOOST_TEST_REQUIRE(::mkdir(ro.c_str(), 0777) == 0);
  BOOST_TEST_REQUIRE(::chmod(ro.c_str(), 0777) == 0);
  std::string target = ro + "/written";
  std::vector<std::string> opts = {"--ro", ro};
  BOOST_TEST(probe(s, {"write-file", target}, {}, opts).line == "errno EROFS");
  BOOST_TEST(probe(s, {"write-file", target}, {"ro-paths"}, opts).line == "errno EACCES");
  BOOST_TEST(!std::filesystem::exists(target));
  BOOST_TEST(probe(s, {"write-file", target}, {"ro-paths", "landlock"}, opts).line == "allowed");
  BOOST_TEST(slurp(target) == "x");
}

// A --ro path inside the working root (a project's .git, say) has one wall, its read-only
// mount: Landlock's rights add up along the path, and the root's write rights cover all below
// it (docs/security.md, known limits). The mount alone holds against every way to change the
// files: write, remove, rename the path away, make something in it, hardlink out of it. The
// control shows the single wall: without the mount the write lands on the host.
BOOST_AUTO_TEST_CASE(a_read_only_path_inside_the_root_holds_by_its_mount_alone) {
  Sandbox s;
  const std::string proj = s.root + "/proj", git = proj + "/.git";
  std::filesystem::create_directories(git);
  std::ofstream(git + "/config") << "keep";
  for (const auto& d : {proj, git}) {
    BOOST_TEST_REQUIRE(::chmod(d.c_str(), 0777) == 0);
  }
  BOOST_TEST_REQUIRE(::chmod((git + "/config").c_str(), 0666) == 0);
  const std::string script =
      "cd " + proj +
      "; try() { if \"$@\" 2>/dev/null; then echo \"done $1\"; else echo \"refused $1\"; fi; }"
      "; try sh -c 'echo x > .git/config'; try rm -f .git/config; try mv .git moved"
      "; try mkdir .git/hooks; try ln .git/config ../linked; try chmod 0777 .git/config"
      "; try touch .git/new";
  auto r = s.run({"--ro", git}, {"/bin/sh", "-c", script});
  BOOST_TEST(r.exit_code() == 0, r.err);
  BOOST_TEST(r.out ==
                 "refused sh\nrefused rm\nrefused mv\nrefused mkdir\nrefused ln\nrefused "
                 "chmod\nrefused touch\n",
             r.out);
  BOOST_TEST(slurp(git + "/config") == "keep");
  BOOST_TEST(!std::filesystem::exists(proj + "/moved"));
  BOOST_TEST(!std::filesystem::exists(s.root + "/linked"));
  BOOST_TEST(!std::filesystem::exists(git + "/hooks"));
  // The control: the mount wall off, nothing else stops the write.
  auto c =
      run_process(s.args({"--ro", git, "--test-disable-wall", "ro-paths"},
                         {"/bin/sh", "-c", "echo x > " + git + "/config && echo wrote"}, true));
  BOOST_TEST(c.out == "wrote\n", c.err);
  BOOST_TEST(slurp(git + "/config") == "x\n");
}

// ---------------------------------------------------------------------------------------------
// No setuid/setgid file and no file capability lands on the host's disk
// ---------------------------------------------------------------------------------------------

// Every variant is refused by the fixed filter (openat2 by the profile: its mode is out of
// seccomp's sight, so the profile refuses the whole call). The files on the HOST carry no
// S_ISUID/S_ISGID. The control shows why the nosuid mount is not enough: it only stops setuid
// inside the sandbox. The idmapped root maps the sandbox user to the root's owner (root), so
// without the fixed filter a root-owned setuid file appears on the host disk, where the root
// is not nosuid — a local root for whoever wrote its contents.
BOOST_AUTO_TEST_CASE(setuid_and_setgid_bits_never_reach_the_host_disk) {
  Sandbox s;
  struct Case {
    std::vector<std::string> args;
    std::string file;
    const char* full;
  };
  const std::string r = s.root + "/";
  std::vector<Case> cases = {
      {{"setuid-file", r + "a"}, r + "a", "errno EPERM"},
      {{"fchmod-setuid", r + "b"}, r + "b", "errno EPERM"},
      {{"fchmodat-setuid", r + "c"}, r + "c", "errno EPERM"},
      {{"fchmodat2-setuid", r + "d"}, r + "d", "errno EPERM"},
      {{"open-creat-setuid", r + "f"}, r + "f", "errno EPERM"},
      {{"creat-setuid", r + "g"}, r + "g", "errno EPERM"},
      {{"openat2-setuid", r + "h"}, r + "h", "errno ENOSYS"},
      {{"mknod-setuid", r + "i"}, r + "i", "errno EPERM"},
      {{"tmpfile-setuid", s.root, "j"}, r + "j", "errno EPERM"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.args[0]) {
      BOOST_TEST(probe(s, c.args).line == c.full);
      HostFile f = host_file(c.file);
      BOOST_TEST((!f.exists || (f.st.st_mode & (S_ISUID | S_ISGID)) == 0));
    }
  }
  BOOST_TEST(probe(s, {"setgid-dir", r + "e"}).line == "errno EPERM");
  BOOST_TEST(!host_file(r + "e").exists);

  // Controls: each file removed first, so the probe creates it again.
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.args[0] << " (control)") {
      std::filesystem::remove(c.file);
      auto ctl = c.args[0] == "openat2-setuid"
                     ? probe(s, c.args, {"seccomp-fixed", "seccomp-profile"})
                     : probe(s, c.args, {"seccomp-fixed"});
      BOOST_TEST(ctl.line.rfind("allowed", 0) == 0u, ctl.line);
      HostFile f = host_file(c.file);
      BOOST_TEST_REQUIRE(f.exists);
      BOOST_TEST((f.st.st_mode & S_ISUID) != 0u);
      BOOST_TEST(f.st.st_uid == 0u);  // a root-owned setuid file on the host
    }
  }
  // mkdir drops S_ISGID from its mode by itself: the kernel is the second layer here.
  auto dir_ctl = probe(s, {"setgid-dir", r + "e"}, {"seccomp-fixed"});
  BOOST_TEST(dir_ctl.line == "allowed mode=040755");
  BOOST_TEST((host_file(r + "e").st.st_mode & S_ISGID) == 0u);
}

// security.capability is refused for want of CAP_SETFCAP, also for uid 0 inside (empty sets,
// locked NOROOT). The control, uid 0 with the capability drop removed, writes a revision-2
// (not namespaced) capability on the host's file: the idmapped root maps the namespace's root
// to the disk's root, so the kernel does not convert it to a v3 rootid-bound one.
BOOST_AUTO_TEST_CASE(file_capabilities_never_reach_the_host_disk) {
  Sandbox s;
  std::string file = s.root + "/capped";
  BOOST_TEST(probe(s, {"setcap", file}).line == "errno EPERM");
  BOOST_TEST(probe(s, {"setcap", file}, {}, {"--user", "0"}).line == "errno EPERM");
  BOOST_TEST(!host_file(file).has_file_caps);
  BOOST_TEST(probe(s, {"setcap", file}, {"cap-drop"}, {"--user", "0"}).line == "allowed");
  BOOST_TEST_REQUIRE(host_file(file).has_file_caps);
  vfs_ns_cap_data cap{};
  ssize_t n = ::getxattr(file.c_str(), "security.capability", &cap, sizeof cap);
  BOOST_TEST(n == static_cast<ssize_t>(XATTR_CAPS_SZ_2), "getxattr: " << n);
  BOOST_TEST((le32toh(cap.magic_etc) & VFS_CAP_REVISION_MASK) ==
             static_cast<uint32_t>(VFS_CAP_REVISION_2));
}

// ---------------------------------------------------------------------------------------------
// The cwd race: a directory swapped with a symlink to /etc while sandboxes start in it
// ---------------------------------------------------------------------------------------------

// One thread exchanges `work` (a directory) and `swap` (a symlink to /etc) with
// renameat2(RENAME_EXCHANGE) every ~20 µs while sandboxes start with --cwd <root>/work.
// Each run must be refused by the parent's openat2(RESOLVE_BENEATH) check ("leads outside"),
// fail in the child's re-check with ESTALE, or run in exactly the directory recorded before
// the race. Fewer than 10 % refused-or-ESTALE runs means the test did not race: it fails.
// Exchanges two paths (renameat2 RENAME_EXCHANGE) every ~20 µs until finish(), as a job
// sharing the working root could.
struct Swapper {
  std::atomic<bool> stop{false};
  std::atomic<long> swaps{0};
  std::atomic<int> error{0};
  std::thread thread;
  Swapper(const std::string& a, const std::string& b)
      : thread([this, a, b] {
          while (!stop.load(std::memory_order_relaxed)) {
            if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
              error = errno;
              return;
            }
            swaps.fetch_add(1, std::memory_order_relaxed);
            // A short pause between exchanges: the path still flips thousands of times during
            // each run (the race is hit as often as with a busy loop), and the thread no longer
            // takes a whole core from the tests running beside it.
            const timespec pause = {.tv_sec = 0, .tv_nsec = 20'000};
            ::nanosleep(&pause, nullptr);
          }
        }) {}
  // Stops and joins; fails the test if an exchange failed. Returns how many were made.
  long finish() {
    stop = true;
    thread.join();
    BOOST_TEST_REQUIRE(error.load() == 0, "renameat2: " << std::strerror(error.load()));
    return swaps.load();
  }
};

// The races run cordon a few hundred times on the same path. In the sanitized build each run's
// exit leak check (LeakSanitizer, ~0.1 s a run here) would be half of the test's time, and every
// other test leak-checks the same `cordon run` path: these runs skip it.
namespace {
ProcessOptions without_leak_check() {
  ProcessOptions o;
  o.env.emplace();
  bool asan = false;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v = *e;
    if (v.starts_with("ASAN_OPTIONS=")) {
      v += ":detect_leaks=0";
      asan = true;
    }
    o.env->push_back(v);
  }
  if (!asan) {
    o.env->push_back("ASAN_OPTIONS=detect_leaks=0");
  }
  return o;
}
}  // namespace

BOOST_AUTO_TEST_CASE(cwd_swapped_for_a_symlink_never_leads_outside) {
  Sandbox s;
  std::string work = s.root + "/work";
  std::string swap = s.root + "/swap";
  BOOST_TEST_REQUIRE(::mkdir(work.c_str(), 0755) == 0);
  BOOST_TEST_REQUIRE(::symlink("/etc", swap.c_str()) == 0);
  struct stat real {};
  BOOST_TEST_REQUIRE(::stat(work.c_str(), &real) == 0);
  const std::string real_ident =
      "value " + std::to_string(real.st_dev) + " " + std::to_string(real.st_ino);

  Swapper swapper(work, swap);

  constexpr int kRuns = 300;
  const ProcessOptions quick = without_leak_check();
  int refused = 0, estale = 0, inside = 0;
  std::vector<std::string> bad;
  auto start = std::chrono::steady_clock::now();
  std::string status = s.base + "/race.json";
  for (int i = 0; i < kRuns; ++i) {
    ::unlink(status.c_str());
    auto r = run_process(
        s.args({"--json-status", status, "--cwd", work}, {probe_bin(), "cwd-ident"}), quick);
    json st = json::parse(slurp(status), nullptr, false);
    if (r.exit_code() == 125 && r.err.find("leads outside") != std::string::npos) {
      ++refused;
    } else if (r.exit_code() == 125 && !st.is_discarded() && st.contains("setup") &&
               st["setup"]["errno"] == "ESTALE") {
      ++estale;
    } else if (r.exit_code() == 0 && r.out == "probe cwd-ident: " + real_ident + "\n") {
      ++inside;
    } else {
      bad.push_back("exit " + std::to_string(r.exit_code()) + " out `" + r.out + "` err `" + r.err +
                    "` status " + (st.is_discarded() ? "(none)" : st.dump()));
    }
  }
  auto took = std::chrono::steady_clock::now() - start;
  long swaps = swapper.finish();
  BOOST_TEST_MESSAGE(
      "cwd race: " << kRuns << " runs in "
                   << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms, "
                   << swaps << " swaps; refused " << refused << ", ESTALE " << estale
                   << ", ran inside " << inside);
  BOOST_TEST(bad.empty(), bad.size()
                              << " runs escaped or failed otherwise (the working dir is `"
                              << real_ident << "`); first: " << (bad.empty() ? "" : bad.front()));
  BOOST_TEST((refused + estale) * 10 >= kRuns,
             "only " << refused + estale << " of " << kRuns << " runs hit the race");
  // No bound on `took`: it is reported above. A slower machine (51 s here in a sanitized
  // build in session 9) is not a security failure; meson's timeout catches a hang.
}

// Failure fixed (a review, session 11): the setup child made the mount point of a --ro path by
// walking its path string while it still saw the host's tree, so a job sharing the working root
// that swapped a component for an absolute symlink made the child create directories outside
// (13 runs put one in the host's /dev/shm). Here the test is the job: it swaps `sub` (holding
// the --ro directory `data`) with a symlink to a world-writable directory outside, every ~20
// µs, while cordon runs. Nothing may ever appear in that directory.
BOOST_AUTO_TEST_CASE(ro_path_swapped_for_a_symlink_during_setup_makes_nothing_outside) {
  Sandbox s;
  std::string sub = s.root + "/sub", lnk = s.root + "/lnk", outside = s.base + "/outside";
  BOOST_TEST_REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
  BOOST_TEST_REQUIRE(::mkdir((sub + "/data").c_str(), 0755) == 0);
  BOOST_TEST_REQUIRE(::mkdir(outside.c_str(), 0777) == 0);
  BOOST_TEST_REQUIRE(::chmod(outside.c_str(), 01777) == 0);  // the sandbox's uid could write
  BOOST_TEST_REQUIRE(::symlink(outside.c_str(), lnk.c_str()) == 0);

  Swapper swapper(sub, lnk);
  constexpr int kRuns = 200;
  int ran = 0, refused = 0, setup_eloop = 0;
  std::vector<std::string> bad, made;
  const ProcessOptions quick = without_leak_check();
  for (int i = 0; i < kRuns && made.empty(); ++i) {
    auto [r, st] = s.run_status({"--ro", sub + "/data"}, {"/bin/true"}, quick);
    if (r.exit_code() == 0) {
      ++ran;
    } else if (r.exit_code() == 125 && !st.is_discarded() && st.contains("setup") &&
               st["setup"].value("errno", "") == "ELOOP") {
      ++setup_eloop;  // the child met the symlink and stopped
    } else if (r.exit_code() == 125) {
      ++refused;  // the parent's check met it (or found no `data` through it)
    } else {
      bad.push_back("exit " + std::to_string(r.exit_code()) + " err `" + r.err + "`");
    }
    for (const auto& e : std::filesystem::directory_iterator(outside)) {
      made.push_back(e.path().string());
    }
  }
  long swaps = swapper.finish();
  BOOST_TEST_MESSAGE("--ro race: " << swaps << " swaps; ran " << ran << ", refused " << refused
                                   << ", setup stopped at a symlink " << setup_eloop);
  BOOST_TEST(made.empty(),
             "the setup made `" << (made.empty() ? "" : made.front()) << "` outside the root");
  BOOST_TEST(bad.empty(),
             bad.size() << " runs failed otherwise; first: " << (bad.empty() ? "" : bad.front()));
  BOOST_TEST(setup_eloop >= 1, "no run reached the child's walk while the symlink was there");
}
