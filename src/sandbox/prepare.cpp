#include "sandbox/prepare.hpp"

#include <fcntl.h>
#include <glob.h>
#include <linux/landlock.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <span>

#include "base/strings.hpp"
#include "sandbox/executable.hpp"
#include "sandbox/plan_format.hpp"
#include "sandbox/userns.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {
namespace {

// Secrets under /etc that no sandbox sees (files become empty, directories empty).
const char* const kEtcSecrets[] = {
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/security/opasswd",
    "/etc/cordon",
    "/etc/subuid",
    "/etc/subgid",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
};
// Host keys of other names are masked too (etc_secret_paths).
constexpr const char* kSshHostKeyDir = "/etc/ssh";
constexpr const char* kSshHostKeys = "/etc/ssh/ssh_host_*key";
const char* const kDevNodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
// proc/pressure: its files are world-writable, and each write makes a PSI trigger, whose
// release waits for an RCU grace period: 200 processes holding 4000 triggers each took
// minutes to die after their SIGKILL, at a host load of 200 (a red-team review, session 36).
// Read-only, they still show the host's pressure, as before.
const char* const kProcReadOnly[] = {
    "proc/sys", "proc/sysrq-trigger", "proc/irq",        "proc/bus",
    "proc/fs",  "proc/latency_stats", "proc/timer_list", "proc/pressure"};

std::string rel(const std::string& abs) { return abs == "/" ? "." : abs.substr(1); }

// A detached copy of a host tree, with mount flags set before it ever reaches the sandbox.
Result<UniqueFd> clone_tree(int dirfd, const std::string& path, uint64_t attr_set,
                            int userns_fd = -1) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE;
  const char* p = path.c_str();
  if (dirfd >= 0 && path.empty()) {
    flags |= AT_EMPTY_PATH;
    p = "";
  }
  int fd = sys::open_tree(dirfd, p, flags);
  if (fd < 0) {
    return sys_error("open_tree `{}`", path);
  }
  UniqueFd tree(fd);
  struct mount_attr attr {};
  attr.attr_set = attr_set;
  attr.propagation = MS_PRIVATE;
  if (userns_fd >= 0) {
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
  }
  if (sys::mount_setattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0) {
    return sys_error("mount_setattr `{}`", path);
  }
  return tree;
}

}  // namespace

Result<std::vector<std::string>> etc_secret_paths(const SandboxSpec& spec, bool with_key_dir) {
  std::vector<std::string> secrets(std::begin(kEtcSecrets), std::end(kEtcSecrets));
  glob_t g{};
  if (::glob(kSshHostKeys, 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      secrets.emplace_back(g.gl_pathv[i]);
    }
  }
  globfree(&g);
  if (with_key_dir) {
    secrets.emplace_back(kSshHostKeyDir);
  }
  for (const auto& extra : spec.extra_masked_paths) {
    std::string n = normalize_path(extra);
    if (!path_within(n, "/etc") || n == "/etc") {
      return refusal("masked path `{}` must lie under /etc", extra);
    }
    secrets.push_back(n);
  }
  std::sort(secrets.begin(), secrets.end());
  secrets.erase(std::unique(secrets.begin(), secrets.end()), secrets.end());
  return secrets;
}

Result<std::vector<ShownTree>> shown_trees() {
  std::vector<ShownTree> shown;
  char etc_real[PATH_MAX];
  if (::realpath("/etc", etc_real) == nullptr) {
    return sys_error("realpath `/etc`");
  }
  shown.push_back({etc_real, "/etc"});
  for (const char* dir : kSystemDirs) {
    struct stat st {};
    char real[PATH_MAX];
    if (::lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && ::realpath(dir, real) != nullptr) {
      shown.push_back({real, dir});
    }
  }
  return shown;
}

std::vector<std::string> shown_at(const std::vector<ShownTree>& shown, const std::string& real) {
  std::vector<std::string> at;
  for (const auto& t : shown) {
    if (path_within(real, t.host) && real != t.host) {
      at.push_back(t.sandbox + real.substr(t.host.size()));
    }
  }
  return at;
}

Result<EtcMasks> etc_masks(const SandboxSpec& spec) {
  CORDON_TRY(shown, shown_trees());
  return etc_masks(spec, shown);
}

Result<EtcMasks> etc_masks(const SandboxSpec& spec, const std::vector<ShownTree>& shown) {
  CORDON_TRY(secrets, etc_secret_paths(spec, false));
  EtcMasks out;
  std::vector<MaskedId> file_ids, dir_ids;
  auto add = [&](const std::string& path, const struct stat& st) {
    MaskedId id{st.st_dev, st.st_ino, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
    if (S_ISDIR(st.st_mode)) {
      out.dirs.push_back(rel(path));
      dir_ids.push_back(id);
    } else {
      out.files.push_back(rel(path));
      file_ids.push_back(id);
    }
  };
  // Each secret is masked where it resolves, by a path without symlinks: the binds are made
  // before pivot_root (child.cpp), where an absolute symlink on the way would lead into the
  // host's tree and the mask would land there, not on the sandbox's copy (failure fixed,
  // session 27, found by a review: /etc/a -> /etc/b made /etc/a/secret readable). It is
  // masked in every tree that shows it (/etc -> /usr/etc: found by a review, session 28).
  std::set<std::string> masked;
  std::vector<std::pair<std::string, struct stat>> found;
  for (const auto& s : secrets) {
    char real[PATH_MAX];
    if (::realpath(s.c_str(), real) == nullptr) {
      continue;
    }
    struct stat rs {};
    if (::stat(real, &rs) != 0 || !(S_ISDIR(rs.st_mode) || S_ISREG(rs.st_mode))) {
      continue;
    }
    for (auto& at : shown_at(shown, real)) {
      if (masked.insert(at).second) {
        found.emplace_back(std::move(at), rs);
      }
    }
  }
  // Nothing is masked inside a masked directory: it shows empty already, and a bind there
  // would find no way once the directory's own mask is in place (a masked directory inside
  // a masked directory, e.g. `maskPaths: ["/etc/ssl"]` with /etc/ssl/private, failed every
  // sandbox with ENOENT: the directories were bound in order; fixed, session 28).
  for (const auto& [at, st] : found) {
    bool inside = std::any_of(found.begin(), found.end(), [&](const auto& other) {
      return S_ISDIR(other.second.st_mode) && other.first != at && path_within(at, other.first);
    });
    if (!inside) {
      add(at, st);
    }
  }
  out.ids = std::move(file_ids);
  out.ids.insert(out.ids.end(), dir_ids.begin(), dir_ids.end());
  return out;
}

void grow_output_pipe(int fd, size_t n, bool& grown) {
  if (grown || n < kDefaultPipeBytes) {
    return;
  }
  grown = true;
  (void)::fcntl(fd, F_SETPIPE_SZ, kBulkPipeBytes);
}

const char* PreparedSandbox::keep(std::string s) {
  strings_.push_back(std::make_unique<std::string>(std::move(s)));
  return strings_.back()->c_str();
}

void PreparedSandbox::finalize_keep_fds() {
  const ChildPlan& p = plan_;
  keep_fds_.clear();
  for (int fd :
       {p.status_fd, p.plan_fd, p.exec_fd, p.init_fd, p.stdin_fd, p.stdout_fd, p.stderr_fd}) {
    if (fd >= 0) {
      keep_fds_.push_back(fd);
    }
  }
  for (size_t i = 0; i < p.n_system_trees; ++i) {
    keep_fds_.push_back(p.system_trees[i].fd);
  }
  for (size_t i = 0; i < p.n_user_trees; ++i) {
    keep_fds_.push_back(p.user_trees[i].fd);
  }
  for (size_t i = 0; i < p.n_v1_tasks_fds; ++i) {
    keep_fds_.push_back(p.v1_tasks_fds[i]);
  }
  std::sort(keep_fds_.begin(), keep_fds_.end());
  keep_fds_.erase(std::unique(keep_fds_.begin(), keep_fds_.end()), keep_fds_.end());
  plan_.keep_fds = keep_fds_.data();
  plan_.n_keep_fds = keep_fds_.size();
}

void PreparedSandbox::close_child_ends() {
  status_child.reset();
  stdout_write.reset();
  stderr_write.reset();
  stdin_read.reset();
  fds_.clear();
  exec_fd_.reset();
  init_fd_.reset();
  plan_fd_.reset();
}

Result<void> PreparedSandbox::open_root(const SandboxSpec& spec) {
  // The working root, opened once; every later check is relative to this fd. The caller
  // passes the path it resolved and checked, so no symlink may appear in it now: a component
  // swapped for a symlink after the check fails here instead of binding somewhere else.
  CORDON_TRY_CTX(root_fd,
                 sys::openat2_fd(AT_FDCWD, spec.root, O_PATH | O_DIRECTORY,
                                 RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS),
                 "open the working root");
  CORDON_TRY(root_path, sys::fd_path(root_fd.get()));
  root_ = root_path;
  root_fd_ = std::move(root_fd);
  return {};
}

Result<void> PreparedSandbox::resolve_cwd(const SandboxSpec& spec) {
  // The cwd resolves beneath the root: symlinks inside are followed, one leading out is not.
  std::string cwd_rel = ".";
  if (!path_within(spec.cwd, spec.root)) {
    return refusal("the cwd `{}` is not inside the working root `{}`", spec.cwd, spec.root);
  }
  if (spec.cwd.size() > spec.root.size()) {
    cwd_rel = spec.cwd.substr(spec.root == "/" ? 1 : spec.root.size() + 1);
  }
  // Nothing a link out leads to is looked at, nor named beyond the link's own text (before
  // session 40 the refusal gave its realpath on the host).
  auto cwd_fd = sys::open_within(root_fd_.get(), root_, cwd_rel, O_DIRECTORY);
  if (!cwd_fd) {
    if (cwd_fd.error().sys_errno() == EXDEV) {
      return refusal(
          "the cwd `{}` leads outside the working root `{}`: {}; use a directory "
          "inside the root",
          spec.cwd, root_, cwd_fd.error().message());
    }
    return std::unexpected(std::move(cwd_fd.error()).wrap("open the cwd"));
  }
  CORDON_TRY(cwd_path, sys::fd_path(cwd_fd->get()));
  CORDON_TRY(cwd_st, sys::fstat_fd(cwd_fd->get()));
  plan_.cwd = keep(cwd_path);
  plan_.cwd_dev = cwd_st.st_dev;
  plan_.cwd_ino = cwd_st.st_ino;
  return {};
}

Result<void> PreparedSandbox::resolve_command(const SandboxSpec& spec,
                                              const std::vector<std::string>& visible,
                                              const EtcMasks& masks) {
  // What the sandbox shows masked is not visible either: a `#!` naming a file in a masked
  // directory (/etc/ssl/private/x) was answered with what the host has there (a review,
  // session 36).
  std::vector<std::string> hidden;
  for (const auto* list : {&masks.files, &masks.dirs}) {
    for (const auto& m : *list) {
      hidden.push_back("/" + m);
    }
  }
  // The program: pinned when outside the root, by path inside it.
  CORDON_TRY(exe, resolve_executable(spec.argv, root_, root_fd_.get(), visible, spec.exec_dev,
                                     spec.exec_ino, hidden));
  argv_ = exe.argv;
  applied_.pinned_executable = exe.pinned;
  applied_.interpreter = exe.interpreter;
  exec_fd_ = std::move(exe.fd);
  plan_.exec_fd = exec_fd_.get();
  exec_path_ = exe.exec_path;
  return {};
}

Result<std::unique_ptr<PreparedSandbox>> PreparedSandbox::prepare(const SandboxSpec& spec,
                                                                  const SeccompPrograms& seccomp,
                                                                  uid_t host_id,
                                                                  const std::string& init_path,
                                                                  Mode mode) {
  const bool park = mode == Mode::kPark;
  if (park && spec.tty) {
    return invalid("a parked sandbox has no tty (its pty is made by the child for its job)");
  }
  std::unique_ptr<PreparedSandbox> p(new PreparedSandbox());
  ChildPlan& plan = p->plan_;
  CORDON_CHECK(p->open_root(spec));
  if (!park) {
    CORDON_CHECK(p->resolve_cwd(spec));
  }
  CORDON_CHECK(p->prepare_mounts(spec, host_id));
  if (!park) {
    CORDON_CHECK(p->resolve_command(spec, p->visible_, p->etc_masks_));
  }

  // The init binary: root-owned and not writable by anyone else, so /proc/1/exe (the runc
  // CVE-2019-5736 analogue) leads to a file no sandbox can change.
  CORDON_TRY_CTX(init_fd, sys::openat2_fd(AT_FDCWD, init_path, O_PATH, RESOLVE_NO_MAGICLINKS),
                 "open the sandbox init");
  CORDON_TRY(init_st, sys::fstat_fd(init_fd.get()));
  if (!S_ISREG(init_st.st_mode) || init_st.st_uid != 0 || (init_st.st_mode & 022) != 0) {
    return refusal(
        "the sandbox init `{}` must be a root-owned file writable only by root "
        "(mode {:o}, owner {})",
        init_path, init_st.st_mode & 07777, init_st.st_uid);
  }
  p->init_fd_ = std::move(init_fd);
  plan.init_fd = p->init_fd_.get();

  CORDON_CHECK(p->prepare_landlock(spec));
  if (park) {
    // Only the walls' flags and, when init may load them ahead, the command's two filters: the
    // job's plan brings its argv, environment and init's own filter.
    SandboxSpec bare = spec;  // the flags only: no argv, no environment in a parked plan
    bare.env.clear();
    SeccompPrograms ahead;
    uint32_t flags = kPlanParked;
    if (seccomp.preload) {
      ahead.profile = seccomp.profile;
      ahead.fixed = seccomp.fixed;
      flags |= kPlanPreloadFilters;
    }
    CORDON_CHECK(p->prepare_plan_file(bare, ahead, {}, "", flags));
  } else {
    CORDON_CHECK(p->prepare_plan_file(spec, seccomp, p->argv_, p->exec_path_));
  }
  // A parked sandbox gets its job's pipes from prepare_job().
  CORDON_CHECK(p->prepare_channels(spec, host_id, true, !park));

  plan.loopback_up = spec.network == NetworkMode::kNone;
  p->applied_.network_namespace = spec.network == NetworkMode::kNone;
  plan.hostname = p->keep(spec.hostname);
  p->rlimits_ = spec.rlimits;
  plan.rlimits = p->rlimits_.data();
  plan.n_rlimits = p->rlimits_.size();
  plan.tty = spec.tty;
  plan.tty_cols = spec.tty_cols;
  plan.tty_rows = spec.tty_rows;
  plan.uid = spec.inside_uid;
  plan.gid = spec.inside_gid;
  auto last_cap = read_small_file("/proc/sys/kernel/cap_last_cap");
  auto last = last_cap ? parse_uint(last_cap->substr(0, last_cap->find('\n'))) : std::nullopt;
  plan.cap_last_cap = last ? static_cast<int>(*last) : 63;
  plan.disabled_walls = spec.disabled_walls;
  p->finalize_keep_fds();
  return p;
}

ParkedShape PreparedSandbox::parked_shape() const {
  ParkedShape s;
  s.root = root_;
  struct stat st {};
  if (root_fd_ && ::fstat(root_fd_.get(), &st) == 0) {
    s.root_dev = st.st_dev;
    s.root_ino = st.st_ino;
    s.root_uid = st.st_uid;
    s.root_gid = st.st_gid;
  }
  s.masks = etc_masks_;
  s.read_only_ids = ro_ids_;
  s.visible = visible_;
  s.landlock_handled = plan_.landlock_handled;
  s.preloaded_profile = preloaded_profile_;
  s.preloaded_fixed = preloaded_fixed_;
  return s;
}

bool PreparedSandbox::shape_still_holds(const SandboxSpec& spec, const ParkedShape& shape,
                                        bool masks_unchanged) {
  auto stat_of = [](const std::string& path, int extra_flags) -> std::optional<struct stat> {
    auto fd = sys::openat2_fd(AT_FDCWD, path, O_PATH | extra_flags,
                              RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    if (!fd) {
      return std::nullopt;
    }
    auto st = sys::fstat_fd(fd->get());
    return st ? std::optional<struct stat>(*st) : std::nullopt;
  };
  auto same = [&](const std::string& path, uint64_t dev, uint64_t ino, int extra_flags) {
    auto st = stat_of(path, extra_flags);
    return st && st->st_dev == dev && st->st_ino == ino;
  };
  // The root's owner decides the idmapping (files it owns are the sandbox user's); the
  // /etc secrets present decide what is masked.
  auto root = stat_of(spec.root, O_DIRECTORY);
  if (!root || root->st_dev != shape.root_dev || root->st_ino != shape.root_ino ||
      root->st_uid != shape.root_uid || root->st_gid != shape.root_gid ||
      spec.read_only_paths.size() != shape.read_only_ids.size()) {
    return false;
  }
  // The same secrets, and each still the file that was masked: one renamed over since has
  // taken its mask down in the parked sandbox.
  if (!masks_unchanged) {
    auto masks = etc_masks(spec);
    if (!masks || masks->files != shape.masks.files || masks->dirs != shape.masks.dirs ||
        masks->ids != shape.masks.ids) {
      return false;
    }
  }
  for (size_t i = 0; i < spec.read_only_paths.size(); ++i) {
    const auto& [dev, ino] = shape.read_only_ids[i];
    if (!same(spec.read_only_paths[i], dev, ino, 0)) {
      return false;
    }
  }
  return true;
}

Result<std::unique_ptr<PreparedSandbox>> PreparedSandbox::prepare_job(
    const SandboxSpec& spec, const SeccompPrograms& seccomp, uid_t host_id,
    const ParkedShape& shape) {
  std::unique_ptr<PreparedSandbox> p(new PreparedSandbox());
  CORDON_CHECK(p->open_root(spec));
  CORDON_TRY(root_st, sys::fstat_fd(p->root_fd_.get()));
  if (p->root_ != shape.root || root_st.st_dev != shape.root_dev ||
      root_st.st_ino != shape.root_ino || root_st.st_uid != shape.root_uid ||
      root_st.st_gid != shape.root_gid) {
    // Replaced since shape_still_holds looked: fail closed rather than resolve the cwd and the
    // executable in a tree the parked sandbox does not show.
    return refusal("the working root `{}` changed while its job was being started; start it again",
                   spec.root);
  }
  CORDON_CHECK(p->resolve_cwd(spec));
  CORDON_CHECK(p->resolve_command(spec, shape.visible, shape.masks));
  CORDON_CHECK(p->prepare_plan_file(spec, seccomp, p->argv_, p->exec_path_));
  CORDON_CHECK(p->prepare_channels(spec, host_id, false, true));
  p->plan_.landlock_handled = shape.landlock_handled;
  return p;
}

Result<void> PreparedSandbox::prepare_mounts(const SandboxSpec& spec, uid_t host_id) {
  ChildPlan& plan = plan_;
  const uint64_t kRo = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

  // System paths read-only; merged-usr symlinks recreated as on the host.
  for (const char* dir : kSystemDirs) {
    struct stat st {};
    if (::lstat(dir, &st) != 0) {
      continue;
    }
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = ::readlink(dir, target, sizeof target - 1);
      if (n < 0) {
        return sys_error("readlink `{}`", dir);
      }
      symlinks_.push_back({keep(std::string(target, static_cast<size_t>(n))), keep(rel(dir))});
    } else if (S_ISDIR(st.st_mode)) {
      CORDON_TRY(tree, clone_tree(AT_FDCWD, dir, kRo));
      system_trees_.push_back({tree.get(), keep(rel(dir)), false});
      fds_.push_back(std::move(tree));
      visible_.push_back(dir);
    }
  }
  CORDON_TRY(etc, clone_tree(AT_FDCWD, "/etc", kRo | MOUNT_ATTR_NOEXEC));
  system_trees_.push_back({etc.get(), "etc", false});
  fds_.push_back(std::move(etc));
  visible_.push_back("/etc");
  plan.system_trees = system_trees_.data();
  plan.n_system_trees = system_trees_.size();
  plan.symlinks = symlinks_.data();
  plan.n_symlinks = symlinks_.size();

  // /etc: generated identity files, masked secrets. Each generated file, like each mask, is
  // placed wherever the sandbox shows the host's file (session 29: with /etc -> /usr/etc, the
  // sandbox's /usr/etc/passwd was the host's; with /etc/passwd itself a link, the sandbox
  // followed it to the host's file, none being generated).
  CORDON_TRY(shown, shown_trees());
  std::string user = "cordon";
  auto add_generated = [&](const char* path, std::string data) {
    char real[PATH_MAX];
    struct stat st {};
    if (::realpath(path, real) == nullptr || ::stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
      return;
    }
    const char* d = keep(std::move(data));
    for (const auto& at : shown_at(shown, real)) {
      generated_.push_back({keep(rel(at)), d, std::strlen(d)});
    }
  };
  add_generated("/etc/passwd",
                fmt::format("root:x:0:0:root:/root:/usr/sbin/nologin\n"
                            "{0}:x:{1}:{2}:cordon sandbox:/tmp/home:/bin/sh\n"
                            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                            user, spec.inside_uid, spec.inside_gid));
  add_generated("/etc/group",
                fmt::format("root:x:0:\n{0}:x:{1}:\nnogroup:x:65534:\n", user, spec.inside_gid));
  add_generated("/etc/hostname", spec.hostname + "\n");
  add_generated("/etc/hosts", fmt::format("127.0.0.1\tlocalhost\n127.0.1.1\t{0}\n"
                                          "::1\tlocalhost ip6-localhost ip6-loopback\n",
                                          spec.hostname));
  plan.generated = generated_.data();
  plan.n_generated = generated_.size();

  CORDON_TRY(masks, etc_masks(spec, shown));
  for (const auto& f : masks.files) {
    mask_files_.push_back(keep(f));
  }
  for (const auto& d : masks.dirs) {
    mask_dirs_.push_back(keep(d));
  }
  etc_masks_ = std::move(masks);
  plan.mask_files = mask_files_.data();
  plan.n_mask_files = mask_files_.size();
  plan.mask_dirs = mask_dirs_.data();
  plan.n_mask_dirs = mask_dirs_.size();

  for (const char* node : kDevNodes) {
    std::string host = std::string("/dev/") + node;
    struct stat st {};
    if (::stat(host.c_str(), &st) == 0 && S_ISCHR(st.st_mode)) {
      dev_nodes_.push_back(node);
    }
  }
  plan.dev_nodes = dev_nodes_.data();
  plan.n_dev_nodes = dev_nodes_.size();
  proc_ro_.assign(std::begin(kProcReadOnly), std::end(kProcReadOnly));
  plan.proc_read_only = proc_ro_.data();
  plan.n_proc_read_only = proc_ro_.size();
  sysctls_.push_back({"proc/sys/user/max_user_namespaces", "0"});
  sysctls_.push_back(
      {"proc/sys/user/max_inotify_instances", keep(std::to_string(spec.inotify_instances))});
  sysctls_.push_back(
      {"proc/sys/user/max_inotify_watches", keep(std::to_string(spec.inotify_watches))});
  plan.sysctls = sysctls_.data();
  plan.n_sysctls = sysctls_.size();
  // TCP sockets closed with data still to send ("orphans") count against one host-wide limit,
  // net.ipv4.tcp_max_orphans (131072 here), past which the kernel resets every orphan on the
  // host, other users' connections and their unsent data included. An orphan behind a zero
  // window lives ~200 s by default, so one job that closed such sockets in a loop held the
  // count above the limit for its whole run (a red-team review, session 38). One retry in the
  // sandbox's own namespace: its orphans go within ~2 s. The other long-lived kind, FIN_WAIT2
  // kept by TCP_LINGER2, the fixed filter answers (seccomp.cpp).
  net_sysctls_.push_back({"proc/sys/net/ipv4/tcp_orphan_retries", "1"});
  plan.net_sysctls = net_sysctls_.data();
  plan.n_net_sysctls = net_sysctls_.size();
  // One tmpfs for the root, /tmp and /dev/shm: what the command may write there (tmp_size_bytes)
  // plus the 4 MiB the root tmpfs had when it was a tmpfs of its own (generated /etc files).
  // Bounded: tmpfs reads size=0 as no limit, and a size near 2^64 wraps to 0 in its page count.
  constexpr uint64_t kRootOwnBytes = 4ULL << 20;
  constexpr uint64_t kMaxTmpBytes = 1ULL << 40;
  if (spec.tmp_size_bytes == 0 || spec.tmp_size_bytes > kMaxTmpBytes) {
    return invalid("tmp_size_bytes {} is outside 1..{} (1 TiB)", spec.tmp_size_bytes, kMaxTmpBytes);
  }
  plan.root_options = keep(fmt::format("size={},mode=0755", spec.tmp_size_bytes + kRootOwnBytes));

  // The working root: read-write, nosuid, nodev, idmapped so files look owned by the sandbox
  // user inside and what it creates lands on disk owned by the root's owner.
  CORDON_TRY(root_st, sys::fstat_fd(root_fd_.get()));
  uint64_t root_attr = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  if (spec.root_read_only) {
    root_attr |= MOUNT_ATTR_RDONLY;
#ifdef CORDON_TEST_WALLS
    if (spec.disabled_walls & static_cast<uint32_t>(Wall::kReadOnlyPaths)) {
      root_attr &= ~static_cast<uint64_t>(MOUNT_ATTR_RDONLY);
    }
#endif
  }
  UniqueFd root_tree;
  auto userns = make_idmap_userns(root_st.st_uid, root_st.st_gid, host_id, host_id);
  if (userns) {
    auto idmapped = clone_tree(root_fd_.get(), "", root_attr | MOUNT_ATTR_IDMAP, userns->get());
    if (idmapped) {
      root_tree = std::move(*idmapped);
      applied_.idmapped_root = true;
    } else {
      applied_.idmap_fallback = idmapped.error().message();
    }
  } else {
    applied_.idmap_fallback = userns.error().message();
  }
  if (!root_tree) {
    CORDON_TRY_CTX(plain, clone_tree(root_fd_.get(), "", root_attr), "clone the working root");
    root_tree = std::move(plain);
    applied_.warnings.push_back("working root not idmapped (" + applied_.idmap_fallback +
                                "): the command writes as its host uid");
  }
  struct Pending {
    std::string path;
    int fd;
    bool is_file;
    bool onto_itself = false;
  };
  std::vector<Pending> pending;
  pending.push_back({root_, root_tree.get(), false});
  fds_.push_back(std::move(root_tree));
  visible_.push_back(root_);
  for (size_t i = 0; i < spec.read_only_paths.size(); ++i) {
    const std::string& ro = spec.read_only_paths[i];
    // Resolved and checked by the caller: no symlink may have appeared since.
    CORDON_TRY_CTX(
        fd, sys::openat2_fd(AT_FDCWD, ro, O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS),
        "open read-only path");
    CORDON_TRY(path, sys::fd_path(fd.get()));
    CORDON_TRY(st, sys::fstat_fd(fd.get()));
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
      return refusal("--ro `{}` is neither a directory nor a regular file", ro);
    }
    // What the policy bound, when it lies in the working root: a job may have moved it since
    // the start's check (it renames a directory above it in a loop), and the path now names
    // the job's directory (a review, session 40).
    if (i < spec.read_only_ids.size() && spec.read_only_ids[i] != std::pair<uint64_t, uint64_t>{} &&
        spec.read_only_ids[i] != std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(st.st_dev),
                                                               static_cast<uint64_t>(st.st_ino)}) {
      return refusal("{}", moved_read_only_path(ro));
    }
    uint64_t ro_attr = kRo;
#ifdef CORDON_TEST_WALLS
    // Test control only: shows that Landlock alone still refuses writes below a --ro path.
    if (spec.disabled_walls & static_cast<uint32_t>(Wall::kReadOnlyPaths)) {
      ro_attr &= ~static_cast<uint64_t>(MOUNT_ATTR_RDONLY);
    }
#endif
    CORDON_TRY(tree, clone_tree(fd.get(), "", ro_attr));
    ro_ids_.emplace_back(st.st_dev, st.st_ino);
    pending.push_back({path, tree.get(), S_ISREG(st.st_mode), path_within(path, root_)});
    fds_.push_back(std::move(tree));
    visible_.push_back(path);
  }
  // Parents before children, so a --ro path inside the root lands on top of it.
  std::stable_sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return std::count(a.path.begin(), a.path.end(), '/') <
           std::count(b.path.begin(), b.path.end(), '/');
  });
  // The working root must be first in user_trees_ (step names); equal depth keeps order.
  for (const auto& pe : pending) {
    user_trees_.push_back({pe.fd, keep(rel(pe.path)), pe.is_file, pe.onto_itself});
  }
  plan.user_trees = user_trees_.data();
  plan.n_user_trees = user_trees_.size();
  return {};
}

uint64_t landlock_handled_access(int abi) {
  return abi >= 5   ? (1ULL << 16) - 1
         : abi >= 3 ? (1ULL << 15) - 1
         : abi >= 2 ? (1ULL << 14) - 1
                    : (1ULL << 13) - 1;
}

uint64_t landlock_scopes(int abi) {
  return abi >= 6 ? sys::kLandlockScopeAbstractUnixSocket | sys::kLandlockScopeSignal : 0;
}

Result<void> PreparedSandbox::prepare_landlock(const SandboxSpec& spec) {
  int abi = sys::landlock_abi();
  if (abi < 1) {
    return unsupported(
        "Landlock is not available (landlock_create_ruleset: {}); cordon "
        "refuses to run without its second wall",
        errno_name(errno));
  }
  const uint64_t handled = landlock_handled_access(abi);
  const uint64_t kRead =
      LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  const uint64_t kDev = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                        sys::kLandlockAccessFsTruncate | sys::kLandlockAccessFsIoctlDev;
  // Landlock rules belong to inodes and are checked walking up the path the kernel used,
  // across mount points up to the sandbox's root: the root tmpfs's rule covers every tree
  // mounted under it (a test program showed a file of a bind-mounted /etc readable with that
  // rule alone, session 21), so these read rules repeat it, each tree on its own. The pinned
  // executable is reached through the host's mount, outside the sandbox's tree: it needs a rule
  // of its own (the child adds it from the exec fd). A sandbox that reads only the root and the
  // system's trees has no rule on the root tmpfs (so none on /etc, /proc, /sys beneath it).
  const bool narrow = spec.reads_root_and_system_only;
  if (!narrow) {
    landlock_rules_.push_back({"/", kRead});
  }
  for (const auto& v : visible_) {
    const bool system = std::any_of(std::begin(kSystemDirs), std::end(kSystemDirs),
                                    [&](const char* d) { return v == d; });
    if (v != root_ && (!narrow || system)) {
      landlock_rules_.push_back({keep(v), kRead});
    }
  }
  if (narrow) {
    // Two public files of /etc a program reads before its own code runs: the dynamic loader's
    // cache (a library found only through it: /usr/local/lib, ld.so.conf.d) and the local
    // time zone. A file rule: nothing else of /etc (a missing one is skipped by the child).
    for (const char* file : {"/etc/ld.so.cache", "/etc/localtime"}) {
      landlock_rules_.push_back({file, LANDLOCK_ACCESS_FS_READ_FILE});
    }
  }
  // Writes, and REFER (rename/link across directories), only in the writable places.
  // A read-only root (the git jobs' repository) gets no write right either: the second wall
  // behind the read-only mount.
  landlock_rules_.push_back({keep(root_), spec.root_read_only ? kRead : handled});
  landlock_rules_.push_back({"/tmp", handled});
  landlock_rules_.push_back({"/dev/shm", handled});
  for (const char* node : dev_nodes_) {
    landlock_rules_.push_back({keep(std::string("/dev/") + node), kDev});
  }
  landlock_rules_.push_back({"/dev/pts", kDev | LANDLOCK_ACCESS_FS_READ_DIR});
  // /proc/self/* files some programs write (oom_score_adj, comm); /proc/sys is read-only.
  // (`>` truncates: TRUNCATE too, else `echo x > /proc/self/comm` fails with EACCES.)
  landlock_rules_.push_back(
      {"/proc", LANDLOCK_ACCESS_FS_WRITE_FILE | sys::kLandlockAccessFsTruncate});
  plan_.landlock_abi = abi;
  plan_.landlock_handled = handled;
  plan_.landlock_scoped = landlock_scopes(abi);
  plan_.landlock_rules = landlock_rules_.data();
  plan_.n_landlock_rules = landlock_rules_.size();
  applied_.landlock_abi = abi;
  applied_.landlock_scopes = abi >= 6;
  return {};
}

Result<void> PreparedSandbox::prepare_plan_file(const SandboxSpec& spec,
                                                const SeccompPrograms& seccomp,
                                                const std::vector<std::string>& argv,
                                                const std::string& exec_path,
                                                uint32_t extra_flags) {
  std::string strings;
  for (const auto& a : argv) {
    if (a.find('\0') != std::string::npos) {
      return invalid("argv contains a NUL byte");
    }
    strings += a;
    strings.push_back('\0');
  }
  for (const auto& e : spec.env) {
    if (e.find('\0') != std::string::npos) {
      return invalid("an environment entry contains a NUL byte");
    }
    strings += e;
    strings.push_back('\0');
  }
  strings += exec_path;
  strings.push_back('\0');

  PlanHeader h{};
  h.magic = kPlanMagic;
  h.argc = static_cast<uint32_t>(argv.size());
  h.envc = static_cast<uint32_t>(spec.env.size());
  h.flags = extra_flags;
  if (spec.tty) {
    h.flags |= kPlanTty;
  }
  if (!exec_path.empty()) {
    h.flags |= kPlanExecByPath;
  }
#ifdef CORDON_TEST_WALLS
  auto off = [&](Wall w) { return (spec.disabled_walls & static_cast<uint32_t>(w)) != 0; };
  if (off(Wall::kSeccompProfile)) h.flags |= kPlanNoProfileFilter;
  if (off(Wall::kSeccompFixed)) h.flags |= kPlanNoFixedFilter;
  if (off(Wall::kLandlock)) h.flags |= kPlanNoLandlock;
  if (off(Wall::kNoNewPrivs)) h.flags |= kPlanNoNoNewPrivs;
  if (off(Wall::kDumpable)) h.flags |= kPlanKeepDumpable;
  applied_.seccomp_profile = !off(Wall::kSeccompProfile);
  applied_.seccomp_fixed = !off(Wall::kSeccompFixed);
#endif
  // A preload needs no_new_privs and both filters, and no tty (never parked anyway).
  if ((h.flags & kPlanPreloadFilters) &&
      ((h.flags & (kPlanTty | kPlanNoProfileFilter | kPlanNoFixedFilter | kPlanNoNoNewPrivs)) ||
       seccomp.profile.empty() || seccomp.fixed.empty())) {
    h.flags &= ~static_cast<uint32_t>(kPlanPreloadFilters);
  }
  if (h.flags & kPlanPreloadFilters) {
    preloaded_profile_.assign(seccomp.profile.begin(), seccomp.profile.end());
    preloaded_fixed_.assign(seccomp.fixed.begin(), seccomp.fixed.end());
  }
  // The plan reaches its memfd in one writev of its pieces where they are: the filters (~7 KiB)
  // are not copied into a buffer first. The spawner's heap is write-protected by every park's
  // clone3 until that child execs, so each page a copy wrote took a fault (~20 µs in a PVM
  // guest) on the job's path (docs/performance-history.md, "Spawn run of session 22").
  if (seccomp.init.size() > kMaxInitFilterInsns) {
    return invalid("init's seccomp filter has {} instructions, more than the {} init can hold",
                   seccomp.init.size(), kMaxInitFilterInsns);
  }
  static constexpr char kPad[8] = {};
  constexpr size_t kSections = 5;                    // the header, the strings, three programs
  std::array<struct iovec, 2 * kSections> pieces{};  // each after its padding
  size_t n_pieces = 0, at = 0;
  auto place = [&](const void* data, size_t size) {
    size_t aligned = (at + 7) & ~size_t{7};
    if (aligned > at) {
      pieces[n_pieces++] = {const_cast<char*>(kPad), aligned - at};
    }
    if (size > 0) {
      pieces[n_pieces++] = {const_cast<void*>(data), size};
    }
    at = aligned + size;
    return static_cast<uint32_t>(aligned);
  };
  place(&h, sizeof h);  // written with the offsets below filled in (writev reads it then)
  h.strings_off = place(strings.data(), strings.size());
  h.strings_len = static_cast<uint32_t>(strings.size());
  h.profile_off = place(seccomp.profile.data(), seccomp.profile.size_bytes());
  h.profile_count = static_cast<uint32_t>(seccomp.profile.size());
  h.fixed_off = place(seccomp.fixed.data(), seccomp.fixed.size_bytes());
  h.fixed_count = static_cast<uint32_t>(seccomp.fixed.size());
  h.init_off = place(seccomp.init.data(), seccomp.init.size_bytes());
  h.init_count = static_cast<uint32_t>(seccomp.init.size());
  h.total_size = static_cast<uint32_t>(at);

  int fd = ::memfd_create("cordon-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return sys_error("memfd_create");
  }
  plan_fd_.reset(fd);
  CORDON_CHECK_CTX(sys::writev_all(fd, std::span(pieces.data(), n_pieces)), "write the plan");
  // Sealed: nothing can change the plan between here and init's read of it.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return sys_error("fcntl F_ADD_SEALS");
  }
  plan_.plan_fd = fd;
  return {};
}

Result<void> PreparedSandbox::prepare_channels(const SandboxSpec& spec, uid_t host_id, bool status,
                                               bool pipes) {
  if (status) {
    int sp[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) {
      return sys_error("socketpair");
    }
    status_parent.reset(sp[0]);
    status_child.reset(sp[1]);
    plan_.status_fd = status_child.get();
  }
  if (spec.tty || !pipes) {
    return {};
  }
  // The command reopens its pipes by name (`echo x > /dev/stderr`, `cat /dev/stdin`): through
  // /proc/self/fd the kernel checks the pipe's owner and mode like a file's, and pipe2 makes
  // it ours (host root) and 0600, which the sandbox user is not: EACCES. So each pipe is given
  // to the host uid and gid the command runs as (both ends share the inode). The mode stays
  // 0600: that uid is leased to this sandbox alone, host-wide, and given back only after its
  // processes are gone, so no other sandbox or host user gains a way in.
  auto make_pipe = [host_id](UniqueFd& r, UniqueFd& w) -> Result<void> {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      return sys_error("pipe2");
    }
    r.reset(p[0]);
    w.reset(p[1]);
    if (::fchown(p[0], host_id, host_id) != 0) {
      return sys_error("fchown a pipe to {}", host_id);
    }
    // All three keep the default size: stdout and stderr are grown by their reader once
    // output flows in bulk (grow_output_pipe); stdin carries the engine's small writes.
    return {};
  };
  CORDON_CHECK(make_pipe(stdout_read, stdout_write));
  CORDON_CHECK(make_pipe(stderr_read, stderr_write));
  CORDON_CHECK(make_pipe(stdin_read, stdin_write));
  plan_.stdout_fd = stdout_write.get();
  plan_.stderr_fd = stderr_write.get();
  plan_.stdin_fd = stdin_read.get();
  return {};
}

}  // namespace cordon::sandbox
