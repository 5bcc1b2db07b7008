#define BOOST_TEST_MODULE sandbox_executable
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <linux/fuse.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "helpers/process.hpp"
#include "sandbox/executable.hpp"

using namespace cordon;
using namespace cordon::sandbox;

namespace {

std::string why(const Result<ResolvedExecutable>& r) { return r ? "ok" : r.error().message(); }

struct Root {
  std::string path;
  int fd;
  Root() {
    char tmpl[] = "/tmp/cordon-exe.XXXXXX";
    path = ::mkdtemp(tmpl);
    fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  }
  ~Root() {
    ::close(fd);
    std::filesystem::remove_all(path);
  }
  std::string write(const std::string& rel, const std::string& text, mode_t mode) const {
    std::string p = path + "/" + rel;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  }
  std::vector<std::string> visible() const { return {"/usr", "/etc", path}; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(program_outside_the_root_is_pinned_by_fd) {
  Root root;
  auto r = resolve_executable({"/usr/bin/env", "x"}, root.path, root.fd, root.visible());
  BOOST_REQUIRE_MESSAGE(r.has_value(), why(r));
  BOOST_TEST(r->pinned);
  BOOST_TEST(r->fd.valid());
  BOOST_TEST(r->exec_path.empty());
  BOOST_TEST((r->argv == std::vector<std::string>{"/usr/bin/env", "x"}));
}

BOOST_AUTO_TEST_CASE(program_inside_the_root_runs_by_path) {
  Root root;
  std::string p = root.write("build/tool",
                             "\x7f"
                             "ELF",
                             0755);
  auto r = resolve_executable({p}, root.path, root.fd, root.visible());
  BOOST_REQUIRE_MESSAGE(r.has_value(), why(r));
  BOOST_TEST(!r->pinned);
  BOOST_TEST(r->exec_path == p);
}

BOOST_AUTO_TEST_CASE(script_gets_its_interpreter_pinned_and_its_path_as_argument) {
  Root root;
  std::string p = root.write("run.sh", "#!/bin/sh -e\necho hi\n", 0755);
  auto r = resolve_executable({p, "a"}, root.path, root.fd, root.visible());
  BOOST_REQUIRE_MESSAGE(r.has_value(), why(r));
  BOOST_TEST(r->pinned);
  BOOST_TEST(r->interpreter == "/usr/bin/dash");
  BOOST_TEST((r->argv == std::vector<std::string>{"/bin/sh", "-e", p, "a"}));
}

BOOST_AUTO_TEST_CASE(interpreter_the_sandbox_cannot_see_is_refused_by_name) {
  Root root;
  Root other;
  std::string interp = other.write("interp",
                                   "\x7f"
                                   "ELF",
                                   0755);
  std::string p = root.write("run", "#!" + interp + "\n", 0755);
  auto r = resolve_executable({p}, root.path, root.fd, root.visible());
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find(interp) != std::string::npos, r.error().message());
  BOOST_TEST(r.error().message().find("not visible") != std::string::npos);
  // Said once, not under a context naming the script again (session 38's first walk did).
  BOOST_TEST(r.error().message().rfind("`" + p + "`: its `#!` interpreter", 0) == 0u,
             r.error().message());
  // What to do names both ways in: the CLI's flag and the daemon's policy key (an agent over
  // MCP has no --ro; its operator has the policy).
  BOOST_TEST(r.error().message().find("--ro PATH") != std::string::npos, r.error().message());
  BOOST_TEST(r.error().message().find("readOnlyPaths") != std::string::npos);
}

// Why a script in `root` whose `#!` names `interp` is refused ("ok" if it is not), for a
// sandbox that sees `visible` and shows `hidden` masked.
std::string refusal_for(const Root& root, const std::string& interp,
                        const std::vector<std::string>& visible,
                        const std::vector<std::string>& hidden = {}) {
  std::string p = root.write("run", "#!" + interp + "\n", 0755);
  return why(resolve_executable({p}, root.path, root.fd, visible, 0, 0, hidden));
}

// What the host has at a `#!` path the sandbox cannot see is not told: a missing file, one
// that is not executable and a directory are refused alike, as not visible (it said "does not
// exist", "is not executable (mode 600)": a red-team review, session 36). Control: the same
// paths under a visible tree keep their own reasons.
BOOST_AUTO_TEST_CASE(the_refusal_of_an_unseen_interpreter_says_nothing_of_the_host) {
  Root root;
  Root hidden;
  std::string unexec = hidden.write("secret", "x", 0600);
  std::string dir = hidden.path + "/sub";
  std::filesystem::create_directories(dir);
  std::string missing = hidden.path + "/nope";
  std::vector<std::string> replies;
  for (const std::string& interp : {unexec, dir, missing}) {
    std::string m = refusal_for(root, interp, root.visible());
    BOOST_TEST(m.find("not visible inside the sandbox") != std::string::npos, m);
    BOOST_TEST(m.find("mode") == std::string::npos, m);
    BOOST_TEST(m.find("does not exist") == std::string::npos, m);
    BOOST_TEST(m.find("regular file") == std::string::npos, m);
    // Apart from the path named, the three read the same.
    size_t at = m.find(interp);
    BOOST_REQUIRE(at != std::string::npos);
    replies.push_back(m.erase(at, interp.size()));
  }
  BOOST_TEST(replies[0] == replies[1]);
  BOOST_TEST(replies[1] == replies[2]);
  std::vector<std::string> seen = root.visible();
  seen.push_back(hidden.path);
  BOOST_TEST(refusal_for(root, unexec, seen).find("mode 600") != std::string::npos);
  BOOST_TEST(refusal_for(root, missing, seen).find("does not exist") != std::string::npos);
}

// A path the sandbox shows masked (an /etc secret, or anything in a masked directory) is not
// visible either, though it lies under a visible tree: `#!/etc/ssl/private/<name>` said what
// the host has there (a review, session 36). Control: without the mask, the host's answer.
BOOST_AUTO_TEST_CASE(an_interpreter_under_a_masked_path_is_not_visible) {
  Root root;
  Root hidden;
  std::string secret = hidden.write("private/key", "x", 0600);
  std::vector<std::string> seen = root.visible();
  seen.push_back(hidden.path);
  for (const std::string& mask : {hidden.path + "/private", secret}) {
    std::string m = refusal_for(root, secret, seen, {mask});
    BOOST_TEST(m.find("not visible inside the sandbox") != std::string::npos, m);
    BOOST_TEST(m.find("mode") == std::string::npos, m);
  }
  BOOST_TEST(refusal_for(root, secret, seen).find("mode 600") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(script_the_sandbox_cannot_see_is_refused_naming_the_read_only_paths) {
  Root root;
  Root other;
  std::string p = other.write("run", "#!/usr/bin/dash\n", 0755);
  auto r = resolve_executable({p}, root.path, root.fd, root.visible());
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("not visible") != std::string::npos, r.error().message());
  BOOST_TEST(r.error().message().find("--ro DIR") != std::string::npos);
  BOOST_TEST(r.error().message().find("readOnlyPaths") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(script_interpreter_that_is_a_script_is_refused) {
  Root root;
  std::string inner = root.write("inner", "#!/bin/sh\n", 0755);
  std::string outer = root.write("outer", "#!" + inner + "\n", 0755);
  auto r = resolve_executable({outer}, root.path, root.fd, root.visible());
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("itself a script") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(symlink_from_the_root_to_outside_is_refused) {
  Root root;
  ::symlink("/usr/bin/env", (root.path + "/env").c_str());
  auto r = resolve_executable({root.path + "/env"}, root.path, root.fd, root.visible());
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().message().find("leads outside the working root") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(not_executable_and_missing_are_distinct_errors) {
  Root root;
  std::string p = root.write("data", "x", 0644);
  auto r = resolve_executable({p}, root.path, root.fd, root.visible());
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST(r.error().sys_errno() == EACCES);
  auto m = resolve_executable({root.path + "/nope"}, root.path, root.fd, root.visible());
  BOOST_REQUIRE(!m.has_value());
  BOOST_TEST((m.error().code() == ErrorCode::kNotFound));
  auto rel = resolve_executable({"make"}, root.path, root.fd, root.visible());
  BOOST_TEST(!rel.has_value());
}

BOOST_AUTO_TEST_CASE(a_file_swapped_in_after_the_check_is_refused) {
  Root root;
  std::string p = root.write("tool",
                             "\x7f"
                             "ELF",
                             0755);
  struct stat st {};
  BOOST_REQUIRE(::stat(p.c_str(), &st) == 0);
  auto same = resolve_executable({p}, root.path, root.fd, root.visible(), st.st_dev, st.st_ino);
  BOOST_TEST(same.has_value(), why(same));
  // Replace it by another file at the same path: created while the old one still exists, so
  // its inode differs, then renamed over it.
  std::string other = root.write("tool.new",
                                 "\x7f"
                                 "ELF2",
                                 0755);
  BOOST_REQUIRE(::rename(other.c_str(), p.c_str()) == 0);
  auto swapped = resolve_executable({p}, root.path, root.fd, root.visible(), st.st_dev, st.st_ino);
  BOOST_REQUIRE(!swapped.has_value());
  BOOST_TEST(swapped.error().message().find("changed after it was checked") != std::string::npos);
}

// A job owns the files of its root and may take a write lease on one (F_SETLEASE). Reading a
// script's `#!` line must not wait out the lease break (fs.lease-break-time, 45 s here): the
// spawner reads it, and every other start waits behind it. Failure fixed (a review, session
// 35): the open blocked 45 s, then read the file. Now the start is refused at once, naming the
// lease; with the lease gone the same script resolves (the control).
BOOST_AUTO_TEST_CASE(a_leased_script_is_refused_at_once_not_waited_for) {
  Root root;
  std::string p = root.write("build.sh", "#!/usr/bin/dash\necho hi\n", 0755);
  int ready[2];
  BOOST_REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  pid_t holder = ::fork();
  BOOST_REQUIRE(holder >= 0);
  if (holder == 0) {
    ::signal(SIGIO, SIG_IGN);  // the lease break's notice
    int fd = ::open(p.c_str(), O_RDWR);
    char ok = (fd >= 0 && ::fcntl(fd, F_SETLEASE, F_WRLCK) == 0) ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  BOOST_REQUIRE(::read(ready[0], &ok, 1) == 1);
  ::close(ready[0]);
  BOOST_REQUIRE_MESSAGE(ok == 'y', "fcntl F_SETLEASE F_WRLCK failed in the holder");
  auto r = resolve_executable({p}, root.path, root.fd, root.visible());
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  BOOST_REQUIRE(!r.has_value());
  BOOST_TEST((r.error().code() == ErrorCode::kRefused), r.error().message());
  BOOST_TEST(r.error().message().find("leased") != std::string::npos, r.error().message());
  auto after = resolve_executable({p}, root.path, root.fd, root.visible());
  BOOST_TEST(after.has_value(), why(after));
}

namespace {

// A FUSE file system that only answers, mounted in a mount namespace of a child's own: it
// records every name the kernel asks it to look up, the way an automounter (autofs `/net`)
// or another user's FUSE server would see a host lookup.
struct LookupRecorder {
  int fd = -1;
  std::mutex mu;
  std::vector<std::string> names;

  void serve() {
    std::vector<char> buf(FUSE_MIN_READ_BUFFER + (1 << 17));
    for (;;) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == ENOENT)) {
        continue;
      }
      if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) {
        return;  // ENODEV: unmounted
      }
      fuse_in_header in{};
      std::memcpy(&in, buf.data(), sizeof in);
      fuse_out_header out{sizeof out, 0, in.unique};
      if (in.opcode == FUSE_INIT) {
        fuse_init_out init{};
        init.major = FUSE_KERNEL_VERSION;
        init.minor = FUSE_KERNEL_MINOR_VERSION;
        init.max_write = 4096;
        reply(out, &init, sizeof init);
      } else if (in.opcode == FUSE_LOOKUP) {
        {
          std::lock_guard lock(mu);
          names.emplace_back(buf.data() + sizeof in);
        }
        out.error = -ENOENT;
        reply(out, nullptr, 0);
      } else if (in.opcode == FUSE_GETATTR) {
        fuse_attr_out attr{};
        attr.attr.ino = FUSE_ROOT_ID;
        attr.attr.mode = S_IFDIR | 0755;
        attr.attr.nlink = 2;
        reply(out, &attr, sizeof attr);
      } else if (in.opcode != FUSE_FORGET && in.opcode != FUSE_BATCH_FORGET &&
                 in.opcode != FUSE_INTERRUPT) {
        out.error = -ENOSYS;
        reply(out, nullptr, 0);
      }
    }
  }
  void reply(fuse_out_header out, const void* body, size_t size) {
    out.len = static_cast<uint32_t>(sizeof out + size);
    struct iovec iov[2] = {{&out, sizeof out}, {const_cast<void*>(body), size}};
    (void)!::writev(fd, iov, size == 0 ? 1 : 2);
  }
  bool asked_for(const std::string& name) {
    std::lock_guard lock(mu);
    return std::find(names.begin(), names.end(), name) != names.end();
  }
};

}  // namespace

// The spawner looks no name up on the host in a directory the sandbox does not show, whatever
// a script's `#!` line names (the job writes it): such a lookup would trigger an automount
// (autofs `/net/<name>` resolves any host name the job chooses, a way out of a sandbox without
// a network), wait on a hung FUSE or NFS mount, or reach another user's FUSE server. A FUSE
// file system mounted outside what the sandbox sees, or only on the way to it, records the
// lookups. Before session 38 the interpreter's whole path was opened first and its
// visibility checked after: the file system was asked for `probe`. Control: the same file system
// among the visible paths is asked, and the host's answer (it does not exist) is given.
BOOST_AUTO_TEST_CASE(no_name_is_looked_up_where_the_sandbox_cannot_see) {
  Root root;
  Root mnt;
  const std::string got = cordon::test::report_from_child([&] {
    std::string out;
    auto say = [&](const std::string& line) { out += line + "\n"; };
    LookupRecorder fuse;
    fuse.fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    std::string opts = "fd=" + std::to_string(fuse.fd) + ",rootmode=40000,user_id=0,group_id=0";
    if (fuse.fd < 0 || ::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("cordon-test", mnt.path.c_str(), "fuse", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      say(std::string("setup: /dev/fuse, unshare or mount: ") + std::strerror(errno));
    } else {
      std::thread(&LookupRecorder::serve, &fuse).detach();
      for (const auto& [name, visible] :
           std::vector<std::pair<std::string, std::vector<std::string>>>{
               {"unseen", root.visible()},
               // The file system's root only on the way to what the sandbox shows: it shows
               // `shown` there and nothing else (a review of session 38's first version: the
               // job's name was looked up in such a directory).
               {"ancestor", {"/usr", "/etc", root.path, mnt.path + "/shown"}},
               {"seen", {"/usr", "/etc", root.path, mnt.path}}}) {
        std::string probe = name + "-probe";
        std::string m = refusal_for(root, mnt.path + "/" + probe + "/interp", visible);
        say(name + ": " + (fuse.asked_for(probe) ? "asked" : "not asked") + ": " + m);
      }
    }
    return out;
  });
  BOOST_TEST(got.find("setup: ") == std::string::npos, got);
  BOOST_TEST(got.find("unseen: not asked: ") != std::string::npos, got);
  BOOST_TEST(got.find("ancestor: not asked: ") != std::string::npos, got);
  BOOST_TEST(got.find("not visible inside the sandbox") != std::string::npos, got);
  BOOST_TEST(got.find("seen: asked: ") != std::string::npos, got);
  BOOST_TEST(got.find("does not exist") != std::string::npos, got);
}

// Symlinks on the way are followed by hand as the kernel would: relative, absolute, through
// `..`, from a directory the sandbox does not show into one it does (`/bin` → `usr/bin`), and
// a loop is refused rather than followed forever.
BOOST_AUTO_TEST_CASE(an_interpreter_reached_through_symlinks_resolves_as_the_kernel_would) {
  Root root;
  Root links;
  std::string base = std::filesystem::path(links.path).filename();
  BOOST_REQUIRE(::mkdir((links.path + "/d").c_str(), 0755) == 0);
  BOOST_REQUIRE(::symlink("/usr/bin", (links.path + "/abs").c_str()) == 0);
  BOOST_REQUIRE(
      ::symlink(("../../" + base + "/abs/dash").c_str(), (links.path + "/d/rel").c_str()) == 0);
  BOOST_REQUIRE(::symlink("loop2", (links.path + "/loop1").c_str()) == 0);
  BOOST_REQUIRE(::symlink("loop1", (links.path + "/loop2").c_str()) == 0);
  std::vector<std::string> seen = root.visible();
  seen.push_back(links.path);
  for (const std::string& interp :
       std::vector<std::string>{links.path + "/abs/dash", links.path + "/d/rel", "/bin/sh"}) {
    std::string p = root.write("run", "#!" + interp + "\n", 0755);
    auto r = resolve_executable({p}, root.path, root.fd, seen);
    BOOST_REQUIRE_MESSAGE(r.has_value(), interp + ": " + why(r));
    BOOST_TEST(r->interpreter == "/usr/bin/dash", interp);
    BOOST_TEST(r->pinned);
  }
  BOOST_TEST(refusal_for(root, links.path + "/loop1", seen).find("too many symbolic links") !=
             std::string::npos);
  // Not shown: the links are not followed out of a directory the sandbox cannot see.
  BOOST_TEST(refusal_for(root, links.path + "/abs/dash", root.visible()).find("not visible") !=
             std::string::npos);
}
