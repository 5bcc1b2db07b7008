#pragma once

// Shared by the integration and security tests: a fresh working root and state dir per test,
// and `cordon run` invoked as a user would (a real process, the real kernel).

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "helpers/process.hpp"

namespace cordon::test {

// A unix stream socket listening at `path` (mode 0777, so a sandbox's uid may connect); throws
// when the kernel refuses a step.
inline int listen_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof addr.sun_path) {
    throw std::runtime_error("socket for " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::chmod(path.c_str(), 0777) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    throw std::runtime_error("bind/chmod/listen " + path + ": " + std::strerror(errno));
  }
  return fd;
}

// The one descriptor a peer sent on `conn` with one byte (SCM_RIGHTS), or -1.
inline int receive_fd(int conn) {
  char byte = 0;
  struct iovec iov {
    &byte, 1
  };
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

// A python3 script that connects to argv[1], hands over its stdout (SCM_RIGHTS), waits for
// one byte back and prints "handed over".
inline const char* kHandOverStdout =
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "socket.send_fds(s, [b'x'], [1])\n"
    "s.recv(1)\n"
    "print('handed over', flush=True)\n";

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

inline std::string cordon_bin() { return env_or("CORDON_BIN", "build/cordon"); }
inline std::string testwalls_bin() {
  return env_or("CORDON_TESTWALLS_BIN", "build/cordon-testwalls");
}
inline std::string probe_bin() { return env_or("CORDON_PROBE", "build/tests/helpers/probe"); }

struct Sandbox {
  std::string base;   // /var/tmp/cordon-it.XXXXXX
  std::string root;   // base/root: the working root
  std::string state;  // base/state: cordon's state dir

  Sandbox() {
    char tmpl[] = "/var/tmp/cordon-it.XXXXXX";
    base = ::mkdtemp(tmpl);
    ::chmod(base.c_str(), 0755);
    root = base + "/root";
    state = base + "/state";
    ::mkdir(root.c_str(), 0755);
    ::mkdir(state.c_str(), 0700);
  }
  ~Sandbox() {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
  }

  void write(const std::string& rel, const std::string& content, mode_t mode = 0644) const {
    std::filesystem::path p = root + "/" + rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << content;
    ::chmod(p.c_str(), mode);
  }

  std::vector<std::string> args(const std::vector<std::string>& opts,
                                const std::vector<std::string>& argv,
                                bool testwalls = false) const {
    std::vector<std::string> a = {
        testwalls ? testwalls_bin() : cordon_bin(), "run", "--root", root, "--state-dir", state};
    a.insert(a.end(), opts.begin(), opts.end());
    a.push_back("--");
    a.insert(a.end(), argv.begin(), argv.end());
    return a;
  }

  ProcessResult run(const std::vector<std::string>& opts, const std::vector<std::string>& argv,
                    const ProcessOptions& popt = {}) const {
    return run_process(args(opts, argv), popt);
  }

  // Runs with --json-status and returns the parsed status next to the process result.
  std::pair<ProcessResult, nlohmann::json> run_status(const std::vector<std::string>& opts,
                                                      const std::vector<std::string>& argv,
                                                      const ProcessOptions& popt = {},
                                                      bool testwalls = false) const {
    std::string status = base + "/status.json";
    ::unlink(status.c_str());
    std::vector<std::string> o = {"--json-status", status};
    o.insert(o.end(), opts.begin(), opts.end());
    auto r = run_process(args(o, argv, testwalls), popt);
    std::ifstream in(status);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return {r, nlohmann::json::parse(text, nullptr, false)};
  }
};

}  // namespace cordon::test
