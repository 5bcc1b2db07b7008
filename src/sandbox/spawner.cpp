#include "sandbox/spawner.hpp"

#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "sandbox/etc_watch.hpp"
#include "sandbox/plan_format.hpp"
#include "sandbox/spawn.hpp"
#include "sandbox/status.hpp"
#include "sandbox/spec_codec.hpp"
#include "sys/fs.hpp"
#include "sys/syscalls.hpp"

namespace cordon::sandbox {
namespace {

// The most descriptors either side ever sends in one datagram.
constexpr size_t kMaxRequestFds = 2 + kMaxCgroupV1Fds;
constexpr size_t kMaxReplyFds = 6;
constexpr uint32_t kRequiredSeals = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;

struct Datagram {
  std::string bytes;
  std::vector<UniqueFd> fds;
  bool eof = false;
  bool truncated = false;  // data or descriptors did not fit: a protocol violation
};

// One recvmsg. Descriptors arrive O_CLOEXEC and are owned by the result at once, so every
// path out of a request closes them.
Result<Datagram> receive_datagram(int sock, size_t max_bytes, size_t max_fds) {
  Datagram d;
  d.bytes.resize(max_bytes + 1);  // one spare byte: a longer datagram shows as MSG_TRUNC
  std::vector<char> control(CMSG_SPACE(sizeof(int) * max_fds));
  struct iovec iov {
    d.bytes.data(), d.bytes.size()
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return sys_error("recvmsg");
  }
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        d.fds.emplace_back(fd);
      }
    }
  }
  d.eof = n == 0 && d.fds.empty();
  d.truncated =
      (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > max_bytes;
  d.bytes.resize(std::min(static_cast<size_t>(n), max_bytes));
  return d;
}

Result<void> send_datagram(int sock, const void* data, size_t size, std::span<const int> fds) {
  struct iovec iov {
    const_cast<void*>(data), size
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr) {  // cannot happen with a control buffer of CMSG_SPACE bytes
      return errno_error(EINVAL, "sendmsg: no room for SCM_RIGHTS");
    }
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return sys_error("sendmsg");
  }
  if (static_cast<size_t>(n) != size) {
    return errno_error(EMSGSIZE, "sendmsg: short send of {} of {} bytes", n, size);
  }
  return {};
}

// A sealed memfd holding `bytes`: the receiver reads exactly what was checked here.
Result<UniqueFd> sealed_memfd(const char* name, std::string_view bytes) {
  int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return sys_error("memfd_create");
  }
  UniqueFd mem(fd);
  CORDON_CHECK_CTX(sys::write_all(fd, bytes.data(), bytes.size()), "write memfd");
  if (::fcntl(fd, F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) {
    return sys_error("fcntl F_ADD_SEALS");
  }
  return mem;
}

// Reads a memfd another process sealed. The seals are checked (F_GET_SEALS fails with EINVAL
// on anything but a memfd), so the size cannot change under us, and the size is bounded
// before anything is allocated.
Result<std::string> read_sealed_memfd(int fd, size_t max_bytes) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return sys_error("fcntl F_GET_SEALS (not a memfd?)");
  }
  if ((static_cast<uint32_t>(seals) & kRequiredSeals) != kRequiredSeals) {
    return invalid("the memfd is not sealed against writes, growing and shrinking");
  }
  CORDON_TRY(st, sys::fstat_fd(fd));
  if (!S_ISREG(st.st_mode) || st.st_size < 0 || static_cast<size_t>(st.st_size) > max_bytes) {
    return invalid("the memfd holds {} bytes, more than the {} allowed", st.st_size, max_bytes);
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return sys_error("pread memfd");
    }
    if (n == 0) {
      return invalid("the memfd ended after {} of {} bytes", done, bytes.size());
    }
    done += static_cast<size_t>(n);
  }
  return bytes;
}

Result<void> check_cgroup_dir(int fd, long magic, const char* what) {
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0) {
    return sys_error("fstatfs the {} dirfd", what);
  }
  CORDON_TRY(st, sys::fstat_fd(fd));
  if (sfs.f_type != magic || !S_ISDIR(st.st_mode)) {
    return invalid("the {} descriptor is not a directory on that cgroup filesystem", what);
  }
  return {};
}

ErrorCode error_code_from_wire(uint32_t code) {
  switch (static_cast<ErrorCode>(code)) {
    case ErrorCode::kSystem:
    case ErrorCode::kInvalid:
    case ErrorCode::kRefused:
    case ErrorCode::kUnsupported:
    case ErrorCode::kNotFound:
    case ErrorCode::kInternal:
      return static_cast<ErrorCode>(code);
  }
  return ErrorCode::kInternal;
}

Error protocol_error(std::string what) {
  return Error(ErrorCode::kInternal, 0, "spawner protocol: " + what);
}

// How long a pooled spawn waits for its parked sandbox to finish building (normally a few
// milliseconds, and it is usually long done).
constexpr int kParkedWaitMs = 10000;

// ---------------------------------------------------------------------------------------------
// Server

class Server {
 public:
  Server(int sock, const ProfileLoader& load_profile) : sock_(sock), load_profile_(load_profile) {}

  int run() {
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    // Blocked for the signalfd; the clone3 child empties its mask first thing.
    if (::sigprocmask(SIG_BLOCK, &chld, nullptr) != 0) {
      return 1;
    }
    sigfd_.reset(::signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC));
    if (!sigfd_) {
      return 1;
    }
    int status = 0;
    for (;;) {
      struct pollfd pfds[2] = {{sock_, POLLIN, 0}, {sigfd_.get(), POLLIN, 0}};
      if (::poll(pfds, 2, -1) < 0) {
        if (errno == EINTR) {
          continue;
        }
        status = 1;
        break;
      }
      if (pfds[1].revents != 0) {
        drain_signalfd();
      }
      if (pfds[0].revents != 0) {
        auto d = receive_datagram(sock_, sizeof(SpawnerRequestHeader), kMaxRequestFds);
        if (!d) {
          status = 1;
          break;
        }
        if (d->eof) {
          break;
        }
        if (!serve(*d)) {
          status = 1;  // the reply could not be sent: the engine is gone
          break;
        }
      }
      reap();  // also catches a SIGCHLD that raced the signalfd read
    }
    kill_all();
    return status;
  }

 private:
  struct Spawned {
    pid_t pid = -1;
    std::vector<UniqueFd> fds;
    uint32_t fd_bits = 0;
    std::string result;  // encoded SpawnResultBody
  };

  // A parked sandbox (warm pool): our child, built for `request`'s shape, waiting for a job.
  struct Slot {
    pid_t pid = -1;
    UniqueFd pidfd, status;  // handed to the engine with its job
    SpawnRequestBody request;
    ParkedShape shape;
    AppliedFeatures applied;
    uint64_t etc_generation = 0;  // etc_watch_'s, armed before the masks were looked at
  };

  void drain_signalfd() {
    struct signalfd_siginfo si;
    while (::read(sigfd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    }
  }

  // Every exited child, without blocking. Our only children are sandbox inits.
  void reap() {
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG) != 0 || info.si_pid == 0) {
        return;
      }
      live_.erase(info.si_pid);
      for (auto it = slots_.begin(); it != slots_.end(); ++it) {
        if (it->second.pid == info.si_pid) {
          slots_.erase(it);  // a slot lives exactly as long as its sandbox
          break;
        }
      }
    }
  }

  // The engine is gone: nothing of what it started may outlive us. An unreaped child's pid
  // cannot be reused, so kill(pid) reaches the init we started and nothing else.
  void kill_all() {
    for (pid_t pid : live_) {
      (void)::kill(pid, SIGKILL);
    }
    for (pid_t pid : live_) {
      siginfo_t info{};
      while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED) != 0 && errno == EINTR) {
      }
    }
    live_.clear();
  }

  // Answers one datagram; false when the answer could not be sent.
  bool serve(Datagram& d) {
    SpawnerRequestHeader h{};
    if (d.bytes.size() >= sizeof h) {
      std::memcpy(&h, d.bytes.data(), sizeof h);
    }
    SpawnerReplyHeader reply{};
    reply.request_id = h.request_id;
    reply.kind = h.kind;
    if (d.truncated || d.bytes.size() != sizeof h || h.body_len != 0 || h.magic != kSpawnerMagic ||
        h.version != kSpawnerProtocolVersion) {
      return send_error(
          reply, Error::invalid(fmt::format("malformed request header ({} bytes{})", d.bytes.size(),
                                            d.truncated ? ", truncated" : "")));
    }
    if (h.kind == SpawnerMessage::kHello) {
      if (!d.fds.empty()) {
        return send_error(reply, Error::invalid("a hello carries no descriptors"));
      }
      reply.ok = 1;
      reply.pid = ::getpid();
      return send_datagram(sock_, &reply, sizeof reply, {}).has_value();
    }
    if (h.kind == SpawnerMessage::kPark) {
      auto slot = park(h, d.fds);
      d.fds.clear();
      if (!slot) {
        return send_error(reply, slot.error());
      }
      reply.ok = 1;
      reply.pid = *slot;
      return send_datagram(sock_, &reply, sizeof reply, {}).has_value();
    }
    if (h.kind != SpawnerMessage::kSpawn) {
      return send_error(reply, Error::invalid("unknown request kind"));
    }
    if ((h.flags & kRequestPooled) != 0) {
      return spawn_parked(h, d.fds, reply);
    }
    auto spawned = spawn(h, d.fds);
    d.fds.clear();  // the request's descriptors are done with, whatever happened
    if (!spawned) {
      return send_error(reply, spawned.error());
    }
    return send_spawned(reply, *spawned);
  }

  bool send_error(SpawnerReplyHeader& reply, const Error& e) {
    reply.ok = 0;
    reply.pid = -1;
    reply.error_code = static_cast<uint32_t>(e.code());
    reply.sys_errno = e.sys_errno();
    const std::string& m = e.context();
    reply.message_len = static_cast<uint32_t>(std::min(m.size(), kMaxErrorMessage));
    std::memcpy(reply.message, m.data(), reply.message_len);
    return send_datagram(sock_, &reply, sizeof reply, {}).has_value();
  }

  bool send_spawned(SpawnerReplyHeader& reply, Spawned& s) {
    reply.ok = 1;
    reply.pid = s.pid;
    reply.fds = s.fd_bits;
    std::string buf(reinterpret_cast<const char*>(&reply), sizeof reply);
    std::vector<int> fds;
    for (const auto& fd : s.fds) {
      fds.push_back(fd.get());
    }
    UniqueFd result_mem;
    if (s.result.size() <= kMaxInlineResult) {
      reply.result_len = static_cast<uint32_t>(s.result.size());
      std::memcpy(buf.data(), &reply, sizeof reply);
      buf += s.result;
    } else {
      auto mem = sealed_memfd("cordon-spawn-result", s.result);
      if (!mem) {
        (void)::kill(s.pid, SIGKILL);  // the engine will never hear of this sandbox
        return send_error(reply, std::move(mem.error()).wrap("pass the spawn result"));
      }
      result_mem = std::move(*mem);
      fds.push_back(result_mem.get());
      reply.fds |= kReplyResultMemfd;
      std::memcpy(buf.data(), &reply, sizeof reply);
    }
    auto sent = send_datagram(sock_, buf.data(), buf.size(), fds);
    if (!sent) {
      (void)::kill(s.pid, SIGKILL);
    }
    return sent.has_value();
  }

  Result<SeccompPrograms> programs_for(const std::string& path, const SandboxSpec& spec) {
    if (!init_filter_) {
      CORDON_TRY_CTX(init, compile_init_filter(), "compile the init's filter");
      init_filter_ = std::make_unique<BpfProgram>(std::move(init));
    }
    auto key = std::make_pair(path, seccomp_options(spec));
    auto it = filters_.find(key);
    if (it == filters_.end()) {
      CORDON_TRY_CTX(profile, load_profile_(path), "load seccomp profile `{}`", path);
      CORDON_TRY_CTX(filters, compile_filters(profile, key.second), "compile seccomp profile `{}`",
                     path);
      it = filters_.emplace(key, std::move(filters)).first;
    }
    return SeccompPrograms{it->second.profile.insns, it->second.fixed.insns, init_filter_->insns,
                           it->second.init_may_preload};
  }

  struct CgroupFds {
    int v2 = -1;
    std::vector<int> v1;
  };
  // A spawn's or a park's descriptors: the memfd, then the cgroup dirfds, each checked to be
  // a directory of the right cgroup filesystem.
  Result<CgroupFds> cgroup_fds(const SpawnerRequestHeader& h, std::vector<UniqueFd>& fds) {
    bool has_v2 = (h.flags & kRequestHasCgroupV2) != 0;
    if ((h.flags & ~kRequestHasCgroupV2) != 0 || h.n_cgroup_v1 > kMaxCgroupV1Fds ||
        fds.size() != 1 + (has_v2 ? 1 : 0) + h.n_cgroup_v1) {
      return invalid(
          "a spawn or park request carries its memfd and {} cgroup descriptors; got {} "
          "descriptors (flags {:#x})",
          (has_v2 ? 1 : 0) + std::min(h.n_cgroup_v1, kMaxCgroupV1Fds), fds.size(), h.flags);
    }
    CgroupFds out;
    out.v2 = has_v2 ? fds[1].get() : -1;
    if (has_v2) {
      CORDON_CHECK(check_cgroup_dir(out.v2, CGROUP2_SUPER_MAGIC, "v2 cgroup"));
    }
    for (size_t i = has_v2 ? 2 : 1; i < fds.size(); ++i) {
      CORDON_CHECK(check_cgroup_dir(fds[i].get(), CGROUP_SUPER_MAGIC, "v1 cgroup"));
      out.v1.push_back(fds[i].get());
    }
    return out;
  }

  Result<Spawned> spawn(const SpawnerRequestHeader& h, std::vector<UniqueFd>& fds) {
    CORDON_TRY(cg, cgroup_fds(h, fds));
    return spawn_body(fds[0].get(), cg.v2, cg.v1);
  }

  Result<SpawnRequestBody> read_request(int memfd) {
    CORDON_TRY_CTX(bytes, read_sealed_memfd(memfd, kMaxRequestBytes), "read the request");
    CORDON_TRY(req, decode_spawn_request(bytes));
    // A root-owned user namespace would charge every sandbox's limits to root, and the id
    // switch around clone3 would be a no-op.
    if (req.host_id == 0 || req.host_id == static_cast<uid_t>(-1)) {
      return refusal("the host id {} is not a leased unprivileged id", req.host_id);
    }
    return req;
  }

  // Builds and clone3s the sandbox `prepared` describes into the given cgroups.
  Result<SpawnedSandbox> clone_sandbox(PreparedSandbox& prepared, const SpawnRequestBody& req,
                                       int v2_fd, const std::vector<int>& v1_fds) {
    SpawnOptions sp;
    sp.host_id = req.host_id;
    sp.cgroup_fd = v2_fd;
    sp.cgroupns_at_clone = req.cgroupns_at_clone;
    sp.network_namespace = req.spec.network == NetworkMode::kNone;
    sp.v1_cgroup_dirs = v1_fds;  // the child moves itself in (ChildPlan::v1_tasks_fds)
    CORDON_TRY(spawned, spawn_sandbox(prepared, sp));
    live_.insert(spawned.pid);
    return spawned;
  }

  // The reply's descriptors and result for a sandbox that runs its command.
  Result<Spawned> spawned_reply(pid_t pid, UniqueFd pidfd, UniqueFd status, PreparedSandbox& pipes,
                                AppliedFeatures applied, const SpawnRequestBody& req) {
    Spawned out;
    out.pid = pid;
    auto add = [&out](UniqueFd& fd, uint32_t bit) {
      if (fd.valid()) {
        out.fds.push_back(std::move(fd));
        out.fd_bits |= bit;
      }
    };
    add(pidfd, kReplyPidfd);
    add(status, kReplyStatus);
    add(pipes.stdout_read, kReplyStdoutRead);
    add(pipes.stderr_read, kReplyStderrRead);
    add(pipes.stdin_write, kReplyStdinWrite);
    SpawnResultBody result;
    result.applied = std::move(applied);
    for (const auto& w :
         filters_.at({req.seccomp_profile_path, seccomp_options(req.spec)}).warnings) {
      result.applied.warnings.push_back("seccomp: " + w);
    }
    result.argv = pipes.final_argv();
    auto encoded = encode_spawn_result(result);
    if (!encoded || encoded->size() > kMaxResultBytes) {
      (void)::kill(pid, SIGKILL);
      return encoded ? invalid("the spawn result is larger than {} bytes", kMaxResultBytes)
                     : std::unexpected(std::move(encoded.error()));
    }
    out.result = std::move(*encoded);
    return out;
  }

  // Reads the request in `memfd` and spawns it.
  Result<Spawned> spawn_body(int memfd, int v2_fd, const std::vector<int>& v1_fds) {
    CORDON_TRY(req, read_request(memfd));
    CORDON_TRY(programs, programs_for(req.seccomp_profile_path, req.spec));
    CORDON_TRY(prepared, PreparedSandbox::prepare(req.spec, programs, req.host_id, req.init_path));
    CORDON_TRY(spawned, clone_sandbox(*prepared, req, v2_fd, v1_fds));
    return spawned_reply(spawned.pid, std::move(spawned.pidfd), std::move(prepared->status_parent),
                         *prepared, prepared->applied(), req);
  }

  // ---- warm pool ----------------------------------------------------------------------------

  // Builds a sandbox of the request's shape and parks it; returns its init's pid. The
  // profile is compiled now, so its job finds it in the cache.
  Result<pid_t> park(const SpawnerRequestHeader& h, std::vector<UniqueFd>& fds) {
    CORDON_TRY(cg, cgroup_fds(h, fds));
    if (slots_.contains(h.request_id)) {
      return invalid("pool slot {} exists", h.request_id);
    }
    CORDON_TRY(req, read_request(fds[0].get()));
    CORDON_TRY(programs, programs_for(req.seccomp_profile_path, req.spec));
    // Armed before prepare() looks at the /etc secrets it masks: whatever happens to them
    // from here on makes the job's check scan them again.
    CORDON_TRY(secrets, etc_secret_paths(req.spec, true));
    const EtcWatch::Mark etc_mark = etc_watch_.arm("/etc", secrets);
    CORDON_TRY(prepared, PreparedSandbox::prepare(req.spec, programs, req.host_id, req.init_path,
                                                  PreparedSandbox::Mode::kPark));
    // A mount placed on the way while prepare() copied /etc raised no event: no mark then.
    const uint64_t etc_generation = etc_watch_.confirm(etc_mark);
    CORDON_TRY(spawned, clone_sandbox(*prepared, req, cg.v2, cg.v1));
    Slot slot;
    slot.pid = spawned.pid;
    slot.pidfd = std::move(spawned.pidfd);
    slot.status = std::move(prepared->status_parent);
    slot.shape = prepared->parked_shape();
    slot.applied = prepared->applied();
    slot.etc_generation = etc_generation;
    slot.request = std::move(req);
    slots_.emplace(h.request_id, std::move(slot));
    return spawned.pid;
  }

  // Kills a parked sandbox and reaps it: its cgroups then hold nothing.
  void end_parked(pid_t pid) {
    (void)::kill(pid, SIGKILL);
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED) != 0 && errno == EINTR) {
    }
    live_.erase(pid);
  }

  // Waits (bounded) for the parked init's kParked record; an error says what it said instead.
  static Result<void> wait_parked(int status) {
    struct pollfd p {
      status, POLLIN, 0
    };
    int n;
    do {
      n = ::poll(&p, 1, kParkedWaitMs);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      return n == 0 ? errno_error(ETIMEDOUT, "the parked sandbox did not get ready")
                    : sys_error("poll the parked sandbox");
    }
    StatusRecord rec{};
    ssize_t got;
    do {
      got = ::recv(status, &rec, sizeof rec, MSG_DONTWAIT);
    } while ((got < 0 && errno == EINTR) || (got < 0 && errno == ECONNRESET));
    if (got == static_cast<ssize_t>(sizeof rec) && rec.kind == RecordKind::kParked) {
      return {};
    }
    if (got == static_cast<ssize_t>(sizeof rec) && rec.kind == RecordKind::kSetupError) {
      return errno_error(rec.err, "the parked sandbox failed: {}", step_name(rec.step));
    }
    return invalid("the parked sandbox ended before it was ready");
  }

  // A spawn into a slot's parked sandbox; false when the reply could not be sent.
  bool spawn_parked(const SpawnerRequestHeader& h, std::vector<UniqueFd>& fds,
                    SpawnerReplyHeader& reply) {
    if (h.flags != kRequestPooled || h.n_cgroup_v1 != 0 || fds.size() != 1) {
      return send_error(reply, Error::invalid("a pooled spawn carries only its memfd"));
    }
    auto it = slots_.find(h.pool_slot);
    if (it == slots_.end()) {
      reply.flags = kReplySlotGone;
      return send_error(reply, Error(ErrorCode::kNotFound, 0,
                                     fmt::format("warm-pool slot {} is gone", h.pool_slot)));
    }
    Slot slot = std::move(it->second);
    slots_.erase(it);  // used exactly once, whatever happens next
    // Nothing ran: the client spawns the job unpooled instead.
    auto gone = [&](std::string why) {
      end_parked(slot.pid);
      reply.flags = kReplySlotGone;
      return send_error(reply, Error(ErrorCode::kNotFound, 0, std::move(why)));
    };
    // The job's own failure (its cwd, its executable): the answer an unpooled spawn gives.
    auto failed = [&](const Error& e) {
      end_parked(slot.pid);
      return send_error(reply, e);
    };
    auto req = read_request(fds[0].get());
    fds.clear();
    if (!req) {
      return failed(req.error());
    }
    const SpawnRequestBody& parked = slot.request;
    if (!same_sandbox_shape(req->spec, parked.spec) || req->host_id != parked.host_id ||
        req->init_path != parked.init_path || req->cgroupns_at_clone != parked.cgroupns_at_clone) {
      return gone("the job does not fit the parked sandbox");
    }
    // The /etc secrets are scanned again only when the watch saw something happen to them
    // since the slot's masks were made (~20 calls fewer on a start that finds nothing).
    if (!PreparedSandbox::shape_still_holds(req->spec, slot.shape,
                                            etc_watch_.unchanged_since(slot.etc_generation))) {
      return gone(
          "the working root, a read-only path or a masked /etc secret changed since the sandbox "
          "was parked");
    }
    if (auto ready = wait_parked(slot.status.get()); !ready) {
      return gone(ready.error().message());
    }
    auto programs = programs_for(req->seccomp_profile_path, req->spec);
    if (!programs) {
      return failed(programs.error());
    }
    // Its init runs under the filters it loaded while parked: the job must bring those (its
    // init refuses other ones; this spawns it unpooled instead).
    auto same_program = [](std::span<const struct sock_filter> a,
                           const std::vector<struct sock_filter>& b) {
      return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                        [](const struct sock_filter& x, const struct sock_filter& y) {
                          return x.code == y.code && x.jt == y.jt && x.jf == y.jf && x.k == y.k;
                        });
    };
    if (slot.shape.filters_preloaded() &&
        (!same_program(programs->profile, slot.shape.preloaded_profile) ||
         !same_program(programs->fixed, slot.shape.preloaded_fixed))) {
      return gone("the job's seccomp filters are not those its parked sandbox loaded");
    }
    // The slot's host id: checked equal to the job's above.
    auto job = PreparedSandbox::prepare_job(req->spec, *programs, req->host_id, slot.shape);
    if (!job) {
      return failed(job.error());
    }
    const ChildPlan& plan = (*job)->plan();
    ParkedJob msg{};
    msg.magic = kParkedJobMagic;
    msg.cwd_dev = plan.cwd_dev;
    msg.cwd_ino = plan.cwd_ino;
    size_t cwd_len = std::strlen(plan.cwd);
    if (cwd_len >= sizeof msg.cwd) {
      return failed(Error::invalid(fmt::format("the cwd `{}` is too long", plan.cwd)));
    }
    std::memcpy(msg.cwd, plan.cwd, cwd_len + 1);
    std::vector<int> job_fds = {(*job)->job_plan_fd(), (*job)->stdin_read.get(),
                                (*job)->stdout_write.get(), (*job)->stderr_write.get()};
    if ((*job)->job_exec_fd() >= 0) {
      msg.flags |= kParkedJobHasExec;
      msg.exec_access =
          (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE) & slot.shape.landlock_handled;
      job_fds.push_back((*job)->job_exec_fd());
    }
    if (!send_datagram(slot.status.get(), &msg, sizeof msg, job_fds)) {
      return gone("the parked sandbox is gone");
    }
    (*job)->close_child_ends();
    AppliedFeatures applied = slot.applied;
    applied.pinned_executable = (*job)->applied().pinned_executable;
    applied.interpreter = (*job)->applied().interpreter;
    auto spawned = spawned_reply(slot.pid, std::move(slot.pidfd), std::move(slot.status), **job,
                                 std::move(applied), *req);
    if (!spawned) {
      return send_error(reply, spawned.error());
    }
    return send_spawned(reply, *spawned);
  }

  int sock_;
  const ProfileLoader& load_profile_;
  UniqueFd sigfd_;
  std::set<pid_t> live_;  // started and not yet reaped
  std::map<std::pair<std::string, SeccompOptions>, CompiledFilters> filters_;
  std::unique_ptr<BpfProgram> init_filter_;
  std::map<uint64_t, Slot> slots_;  // parked sandboxes by slot id
  EtcWatch etc_watch_;              // what happened to the /etc secrets since each slot parked
};

}  // namespace

int spawner_main(int sock_fd, const ProfileLoader& load_profile) {
  int type = 0, domain = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(sock_fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    fmt::print(stderr,
               "cordon-spawner: fd {} is not a SOCK_SEQPACKET socket; it is started "
               "by the cordon engine, not by hand\n",
               sock_fd);
    return 2;
  }
  len = sizeof domain;
  if (::getsockopt(sock_fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX) {
    fmt::print(stderr, "cordon-spawner: fd {} is not an AF_UNIX socket\n", sock_fd);
    return 2;
  }
  // Whatever else we inherited is closed (the client already asks posix_spawn to; this holds
  // for any launcher): only stdio and the socket stay.
  if (sock_fd > 3) {
    (void)sys::close_range(3, static_cast<unsigned>(sock_fd) - 1, 0);
  }
  (void)sys::close_range(static_cast<unsigned>(sock_fd) + 1, ~0U, 0);
  return Server(sock_fd, load_profile).run();
}

// ---------------------------------------------------------------------------------------------
// Client

Result<SpawnerClient> SpawnerClient::start(const std::string& spawner_path) {
  int sp[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) {
    return sys_error("socketpair");
  }
  UniqueFd mine(sp[0]);
  UniqueFd theirs_low(sp[1]);
  // Above every fd the file actions touch, so dup2 to kSpawnerSocketFd is never a no-op that
  // would leave FD_CLOEXEC set, and opening /dev/null on 0/1 cannot clobber it.
  UniqueFd theirs(::fcntl(theirs_low.get(), F_DUPFD_CLOEXEC, 10));
  if (!theirs) {
    return sys_error("fcntl F_DUPFD_CLOEXEC");
  }
  theirs_low.reset();

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  auto cleanup = [&] {
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
  };
  int rc = posix_spawn_file_actions_adddup2(&fa, theirs.get(), kSpawnerSocketFd);
  // stdout may be the MCP JSON-RPC channel and stdin a client's pipe: the spawner gets
  // neither; stderr stays for its start-up diagnostics.
  if (rc == 0) rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (rc == 0) rc = posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  // The engine is multi-threaded: another thread's fd without O_CLOEXEC must not leak in.
  if (rc == 0) rc = posix_spawn_file_actions_addclosefrom_np(&fa, kSpawnerSocketFd + 1);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  if (rc == 0) rc = posix_spawnattr_setsigmask(&attr, &none);
  if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &all);
  // Its own process group: a terminal's ^C reaches the engine, which decides; the spawner
  // ends when the engine closes the socket.
  if (rc == 0) rc = posix_spawnattr_setpgroup(&attr, 0);
  if (rc == 0) {
    rc = posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  }
  if (rc != 0) {
    cleanup();
    return errno_error(rc, "posix_spawn attributes");
  }
  std::string arg0 = "cordon-spawner";
  char* argv[] = {arg0.data(), nullptr};
  char* envp[] = {nullptr};
  pid_t pid = -1;
  rc = ::posix_spawn(&pid, spawner_path.c_str(), &fa, &attr, argv, envp);
  cleanup();
  if (rc != 0) {
    return errno_error(rc, "posix_spawn `{}`", spawner_path);
  }
  theirs.reset();

  SpawnerClient c;
  c.path_ = spawner_path;
  c.pid_ = pid;
  c.sock_ = std::move(mine);
  // Our unreaped child: its pid cannot have been reused yet.
  c.pidfd_.reset(sys::pidfd_open(pid, 0));
  if (!c.pidfd_) {
    int err = errno;
    (void)::kill(pid, SIGKILL);
    (void)::waitpid(pid, nullptr, 0);
    c.pid_ = -1;
    return errno_error(err, "pidfd_open the spawner");
  }
  SpawnerRequestHeader hello{};
  hello.kind = SpawnerMessage::kHello;
  auto fail = [&c](Error e) -> Result<SpawnerClient> {
    (void)c.stop(std::chrono::milliseconds(0));
    return std::unexpected(std::move(e).wrap("start the spawner"));
  };
  auto sent = send_datagram(c.sock_.get(), &hello, sizeof hello, {});
  if (!sent) {
    return fail(std::move(sent.error()).wrap("send hello"));
  }
  auto d = receive_datagram(c.sock_.get(), sizeof(SpawnerReplyHeader), kMaxReplyFds);
  if (!d) {
    return fail(std::move(d.error()).wrap("receive hello"));
  }
  SpawnerReplyHeader r{};
  if (d->eof) {
    return fail(protocol_error(fmt::format("`{}` exited before answering", spawner_path)));
  }
  if (d->truncated || !d->fds.empty() || d->bytes.size() != sizeof r) {
    return fail(protocol_error("malformed hello reply"));
  }
  std::memcpy(&r, d->bytes.data(), sizeof r);
  if (r.magic != kSpawnerMagic || r.version != kSpawnerProtocolVersion ||
      r.kind != SpawnerMessage::kHello || r.ok != 1 || r.pid != pid) {
    return fail(protocol_error(
        fmt::format("unexpected hello reply (version {}, pid {})", r.version, r.pid)));
  }
  return c;
}

namespace {
Result<std::string> encode_request(const SpawnerClient::Request& request) {
  SpawnRequestBody body;
  body.spec = request.spec;
  body.seccomp_profile_path = request.seccomp_profile_path;
  body.init_path = request.init_path;
  body.host_id = request.host_id;
  body.cgroupns_at_clone = request.cgroupns_at_clone;
  CORDON_TRY_CTX(bytes, encode_spawn_request(body), "encode the spawn request");
  return bytes;
}
}  // namespace

// How long a request whose send failed waits for the spawner's exit to show on its pidfd: its
// socket closes as it exits, a moment before the pidfd turns readable.
constexpr int kDeathWaitMs = 1000;

Result<SpawnerClient::Reply> SpawnerClient::spawn(const Request& request) {
  CORDON_TRY(bytes, encode_request(request));
  std::lock_guard lock(*mu_);
  CORDON_CHECK_CTX(ready_locked(), "spawn through the spawner");
  bool slot_gone = false, sent = false;
  auto reply = exchange(next_id_++, bytes, request.cgroup_v2_fd, request.cgroup_v1_fds,
                        request.pool_slot, &slot_gone, &sent);
  if (!reply && !sent && broken_) {  // the send itself failed (not the memfd before it)
    CORDON_TRY_CTX(died, exited_locked(kDeathWaitMs), "spawn through the spawner");
    if (died) {
      // It died after ready_locked() looked and before the request reached it: nothing was
      // started, so the request goes once to its replacement. Unpooled: the slot died with
      // its spawner (its init is SIGKILLed by PDEATHSIG, and a dying one left in the cgroups
      // runs nothing of the job's).
      CORDON_CHECK_CTX(replace_locked(), "spawn through the spawner");
      reply = exchange(next_id_++, bytes, request.cgroup_v2_fd, request.cgroup_v1_fds, 0, nullptr);
    }
  }
  if (!reply && slot_gone) {
    // Nothing was started: the same request into the same cgroups, placed the slow way.
    reply = exchange(next_id_++, bytes, request.cgroup_v2_fd, request.cgroup_v1_fds, 0, nullptr);
  }
  if (!reply) {
    return std::unexpected(std::move(reply.error()).wrap("spawn through the spawner"));
  }
  return reply;
}

Result<SpawnerClient::Reply> SpawnerClient::spawn_encoded(std::string_view body, int cgroup_v2_fd,
                                                          std::span<const int> cgroup_v1_fds,
                                                          uint64_t pool_slot) {
  std::lock_guard lock(*mu_);
  CORDON_CHECK_CTX(ready_locked(), "spawn through the spawner");
  auto reply = exchange(next_id_++, body, cgroup_v2_fd, cgroup_v1_fds, pool_slot, nullptr);
  if (!reply) {
    return std::unexpected(std::move(reply.error()).wrap("spawn through the spawner"));
  }
  return reply;
}

Result<void> SpawnerClient::send_request(SpawnerMessage kind, uint64_t id, std::string_view body,
                                         int cgroup_v2_fd, std::span<const int> cgroup_v1_fds,
                                         uint64_t pool_slot) {
  if (cgroup_v1_fds.size() > kMaxCgroupV1Fds) {
    return invalid("{} v1 cgroup descriptors, at most {}", cgroup_v1_fds.size(), kMaxCgroupV1Fds);
  }
  if (body.size() > kMaxRequestBytes) {
    return invalid("the request is {} bytes, at most {}", body.size(), kMaxRequestBytes);
  }
  CORDON_TRY(mem, sealed_memfd("cordon-spawn-request", body));
  SpawnerRequestHeader h{};
  h.kind = kind;
  h.request_id = id;
  std::vector<int> fds{mem.get()};
  if (pool_slot != 0) {
    // The parked sandbox already sits in the cgroups; the request names it instead.
    h.flags = kRequestPooled;
    h.pool_slot = pool_slot;
  } else {
    if (cgroup_v2_fd >= 0) {
      h.flags |= kRequestHasCgroupV2;
      fds.push_back(cgroup_v2_fd);
    }
    h.n_cgroup_v1 = static_cast<uint32_t>(cgroup_v1_fds.size());
    fds.insert(fds.end(), cgroup_v1_fds.begin(), cgroup_v1_fds.end());
  }
  auto sent = send_datagram(sock_.get(), &h, sizeof h, fds);
  if (!sent) {
    broken_ = true;
    return std::unexpected(std::move(sent.error()).wrap("send the request"));
  }
  return {};
}

Result<SpawnerClient::Reply> SpawnerClient::exchange(uint64_t id, std::string_view body,
                                                     int cgroup_v2_fd,
                                                     std::span<const int> cgroup_v1_fds,
                                                     uint64_t pool_slot, bool* slot_gone,
                                                     bool* sent) {
  CORDON_CHECK(
      send_request(SpawnerMessage::kSpawn, id, body, cgroup_v2_fd, cgroup_v1_fds, pool_slot));
  if (sent != nullptr) {
    *sent = true;
  }

  // Any violation from here on leaves the stream in an unknown state: no later call trusts it.
  broken_ = true;
  CORDON_TRY_CTX(
      d, receive_datagram(sock_.get(), sizeof(SpawnerReplyHeader) + kMaxInlineResult, kMaxReplyFds),
      "receive the reply");
  if (d.eof) {
    return std::unexpected(protocol_error("the spawner exited"));
  }
  SpawnerReplyHeader r{};
  if (d.truncated || d.bytes.size() < sizeof r) {
    return std::unexpected(protocol_error("truncated reply"));
  }
  std::memcpy(&r, d.bytes.data(), sizeof r);
  if (r.magic != kSpawnerMagic || r.version != kSpawnerProtocolVersion ||
      r.kind != SpawnerMessage::kSpawn || r.request_id != id || r.ok > 1 ||
      r.message_len > kMaxErrorMessage || (r.fds & ~static_cast<uint32_t>(kReplyFdMask)) != 0 ||
      r.result_len != d.bytes.size() - sizeof r ||
      d.fds.size() != static_cast<size_t>(__builtin_popcount(r.fds))) {
    return std::unexpected(protocol_error(fmt::format(
        "malformed reply to request {} (id {}, {} descriptors)", id, r.request_id, d.fds.size())));
  }
  broken_ = false;
  if (r.ok == 0) {
    if (!d.fds.empty() || r.result_len != 0) {
      broken_ = true;
      return std::unexpected(protocol_error("an error reply carries data"));
    }
    if (slot_gone != nullptr && pool_slot != 0 && (r.flags & kReplySlotGone) != 0) {
      *slot_gone = true;
    }
    return std::unexpected(Error(error_code_from_wire(r.error_code), r.sys_errno,
                                 std::string(r.message, r.message_len)));
  }
  Reply out;
  out.pid = r.pid;
  size_t next = 0;
  UniqueFd result_mem;
  for (uint32_t bit = 1; bit <= kReplyResultMemfd; bit <<= 1) {
    if ((r.fds & bit) == 0) {
      continue;
    }
    UniqueFd& slot = bit == kReplyPidfd        ? out.pidfd
                     : bit == kReplyStatus     ? out.status
                     : bit == kReplyStdoutRead ? out.stdout_read
                     : bit == kReplyStderrRead ? out.stderr_read
                     : bit == kReplyStdinWrite ? out.stdin_write
                                               : result_mem;
    slot = std::move(d.fds[next++]);
  }
  if (!out.pidfd || !out.status || r.pid <= 0) {
    broken_ = true;
    return std::unexpected(protocol_error("a success reply without pid, pidfd or status"));
  }
  std::string result_bytes;
  if (result_mem) {
    CORDON_TRY_CTX(bytes, read_sealed_memfd(result_mem.get(), kMaxResultBytes),
                   "read the spawn result");
    result_bytes = std::move(bytes);
  } else {
    result_bytes = d.bytes.substr(sizeof r);
  }
  CORDON_TRY(result, decode_spawn_result(result_bytes));
  out.applied = std::move(result.applied);
  out.argv = std::move(result.argv);
  return out;
}

Result<SpawnerClient::PoolSlot> SpawnerClient::park(const Request& request) {
  CORDON_TRY(bytes, encode_request(request));
  std::lock_guard lock(*mu_);
  CORDON_CHECK_CTX(ready_locked(), "park a sandbox");
  uint64_t id = next_id_++;
  CORDON_CHECK_CTX(send_request(SpawnerMessage::kPark, id, bytes, request.cgroup_v2_fd,
                                request.cgroup_v1_fds, 0),
                   "park a sandbox");
  broken_ = true;
  CORDON_TRY_CTX(d, receive_datagram(sock_.get(), sizeof(SpawnerReplyHeader), 0),
                 "receive the park reply");
  SpawnerReplyHeader r{};
  if (d.eof) {
    return std::unexpected(protocol_error("the spawner exited"));
  }
  if (d.truncated || !d.fds.empty() || d.bytes.size() != sizeof r) {
    return std::unexpected(protocol_error("malformed park reply"));
  }
  std::memcpy(&r, d.bytes.data(), sizeof r);
  if (r.magic != kSpawnerMagic || r.version != kSpawnerProtocolVersion ||
      r.kind != SpawnerMessage::kPark || r.request_id != id || r.ok > 1 ||
      r.message_len > kMaxErrorMessage || (r.ok == 1 && r.pid <= 0)) {
    return std::unexpected(protocol_error(fmt::format("malformed reply to park {}", id)));
  }
  broken_ = false;
  if (r.ok == 0) {
    return std::unexpected(Error(error_code_from_wire(r.error_code), r.sys_errno,
                                 std::string(r.message, r.message_len)));
  }
  return PoolSlot{id, r.pid, generation_->load(std::memory_order_relaxed)};
}

pid_t SpawnerClient::pid() const {
  std::lock_guard lock(*mu_);
  return pid_;
}

Result<bool> SpawnerClient::exited_locked(int wait_ms) {
  if (!pidfd_) {
    return true;  // a replacement failed to start: none runs
  }
  struct pollfd pfd {
    pidfd_.get(), POLLIN, 0
  };
  int n;
  do {
    n = ::poll(&pfd, 1, wait_ms);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return sys_error("poll the spawner's pidfd");
  }
  return n == 1;
}

Result<void> SpawnerClient::ready_locked() {
  if (stopped_) {
    return std::unexpected(protocol_error("the spawner was stopped"));
  }
  // Asked before every request (one poll, against a spawn's milliseconds), not left to a
  // failed send: a sandbox the dead spawner had just cloned may still hold its socket for a
  // moment, so the send succeeds, and a request sent to a spawner that might have read it is
  // never sent again.
  CORDON_TRY(dead, exited_locked(0));
  if (dead) {
    return replace_locked();
  }
  if (broken_ || !sock_) {
    return std::unexpected(protocol_error("the connection to the spawner is closed"));
  }
  return {};
}

Result<void> SpawnerClient::replace_locked() {
  sock_.reset();
  broken_ = true;
  if (pidfd_) {
    // Our child, and it has exited: waitid returns at once and leaves no zombie.
    siginfo_t info{};
    int rc;
    do {
      rc =
          ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info, WEXITED);
    } while (rc != 0 && errno == EINTR);
    int err = errno;
    // Closed whatever waitid said: a pidfd left readable in the engine's epoll set would wake
    // its loop for ever.
    pidfd_.reset();
    pid_ = -1;
    // ECHILD: reaped already (an embedding program that ignores SIGCHLD).
    if (rc != 0 && err != ECHILD) {
      return errno_error(err, "waitid the spawner that died");
    }
  }
  CORDON_TRY_CTX(fresh, start(path_), "replace the spawner that died");
  pid_ = std::exchange(fresh.pid_, -1);
  pidfd_ = std::move(fresh.pidfd_);
  sock_ = std::move(fresh.sock_);
  broken_ = false;
  generation_->fetch_add(1, std::memory_order_release);
  if (watch_) {
    CORDON_CHECK_CTX(watch_(pidfd_.get()), "watch the spawner that replaced a dead one");
  }
  return {};
}

Result<bool> SpawnerClient::replace_if_dead() {
  std::lock_guard lock(*mu_);
  if (stopped_) {
    return false;
  }
  CORDON_TRY(dead, exited_locked(0));
  if (!dead) {
    return false;
  }
  CORDON_CHECK(replace_locked());
  return true;
}

Result<void> SpawnerClient::set_watch(std::function<Result<void>(int pidfd)> watch) {
  std::lock_guard lock(*mu_);
  watch_ = std::move(watch);
  if (watch_ && pidfd_) {
    CORDON_CHECK(watch_(pidfd_.get()));
  }
  return {};
}

Result<int> SpawnerClient::stop(std::chrono::milliseconds grace) {
  std::lock_guard lock(*mu_);
  sock_.reset();
  broken_ = true;
  stopped_ = true;
  if (!pidfd_) {
    return std::unexpected(protocol_error("the spawner was already stopped"));
  }
  struct pollfd pfd {
    pidfd_.get(), POLLIN, 0
  };
  int n;
  do {
    n = ::poll(&pfd, 1, static_cast<int>(grace.count()));
  } while (n < 0 && errno == EINTR);
  if (n == 0) {
    (void)sys::pidfd_send_signal(pidfd_.get(), SIGKILL, nullptr, 0);
  }
  siginfo_t info{};
  int rc;
  do {
    rc = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info, WEXITED);
  } while (rc != 0 && errno == EINTR);
  pidfd_.reset();
  if (rc != 0) {
    return sys_error("waitid the spawner");
  }
  return info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8 : info.si_status & 0x7f;
}

SpawnerClient::~SpawnerClient() {
  if (mu_ && pidfd_) {
    (void)stop();
  }
}

}  // namespace cordon::sandbox
