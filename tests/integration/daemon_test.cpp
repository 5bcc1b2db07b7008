#define BOOST_TEST_MODULE daemon
#include <boost/test/unit_test.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "helpers/cordon_fixture.hpp"

using namespace cordon::test;

namespace {

struct Daemon {
  Sandbox box;
  std::string sock, policy;
  pid_t pid = -1;
  Daemon() {
    sock = box.base + "/d.sock";
    policy = box.base + "/policy.json";
    std::ofstream(policy) << "{\"allowedExecutables\": [\"/bin/echo\"], \"cwdRoot\": \"" << box.root
                          << "\"}";
    pid = ::fork();
    if (pid == 0) {
      int devnull = ::open("/dev/null", O_RDWR);
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      std::string bin = cordon_bin();
      ::execl(bin.c_str(), bin.c_str(), "daemon", "--policy", policy.c_str(), "--state-dir",
              box.state.c_str(), "--socket", sock.c_str(), nullptr);
      ::_exit(99);
    }
    for (int i = 0; i < 400 && !std::filesystem::exists(sock); ++i) ::usleep(10000);
  }
  ~Daemon() {
    ::kill(pid, SIGTERM);
    int st;
    ::waitpid(pid, &st, 0);
  }
  int connect_fd() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, sock.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
};

std::string read_reply(int fd) {
  std::string out;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') out.push_back(c);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(refuses_a_peer_uid_it_does_not_serve) {
  Daemon d;
  int pipefd[2];
  BOOST_REQUIRE(::pipe(pipefd) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipefd[0]);
    // An unprivileged peer: SO_PEERCRED says 65534, which is not allowed.
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) ::_exit(2);
    int fd = d.connect_fd();
    if (fd < 0) ::_exit(3);
    std::string hello = "{\"cordon\":\"connect\",\"session\":\"x\"}\n";
    (void)::write(fd, hello.data(), hello.size());
    std::string r = read_reply(fd);
    (void)::write(pipefd[1], r.data(), r.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  int st = 0;
  ::waitpid(child, &st, 0);
  BOOST_TEST(WEXITSTATUS(st) == 0);
  BOOST_TEST(got.find("\"ok\":false") != std::string::npos, got);
  BOOST_TEST(got.find("uid 65534 may not use this daemon") != std::string::npos, got);
}

BOOST_AUTO_TEST_CASE(a_stalled_half_handshake_does_not_block_other_clients) {
  Daemon d;
  int stalled = d.connect_fd();
  BOOST_REQUIRE(stalled >= 0);
  (void)::write(stalled, "{\"cordon\":", 10);  // half a line, then nothing
  int fd = d.connect_fd();
  BOOST_REQUIRE(fd >= 0);
  std::string hello = "{\"cordon\":\"connect\",\"session\":\"ok\"}\n";
  (void)::write(fd, hello.data(), hello.size());
  std::string r = read_reply(fd);
  BOOST_TEST(r.find("\"ok\":true") != std::string::npos, r);
  BOOST_TEST(r.find("\"session\":\"u0-ok\"") != std::string::npos, r);
  ::close(fd);
  ::close(stalled);
}

BOOST_AUTO_TEST_CASE(a_bad_session_name_is_refused_with_the_handshake_format) {
  Daemon d;
  int fd = d.connect_fd();
  BOOST_REQUIRE(fd >= 0);
  std::string hello = "{\"cordon\":\"connect\",\"session\":\"../x\"}\n";
  (void)::write(fd, hello.data(), hello.size());
  std::string r = read_reply(fd);
  BOOST_TEST(r.find("\"ok\":false") != std::string::npos, r);
  BOOST_TEST(r.find("first line must be") != std::string::npos, r);
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(cli_commands_drive_the_daemon) {
  Daemon d;
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> a = {cordon_bin(), args[0], "--socket", d.sock, "--session", "cli"};
    a.insert(a.end(), args.begin() + 1, args.end());
    return run_process(a);
  };
  auto started = cli({"start", "--json", "--", "/bin/echo", "from the cli"});
  BOOST_REQUIRE_MESSAGE(started.exit_code() == 0, started.err);
  auto j = nlohmann::json::parse(started.out, nullptr, false);
  BOOST_REQUIRE(j.is_object());
  std::string id = j.value("taskId", "");
  BOOST_REQUIRE(!id.empty());
  auto followed = cli({"output", "-f", id});
  BOOST_TEST(followed.exit_code() == 0, followed.err);
  BOOST_TEST(followed.out == "from the cli\n");
  auto status = cli({"status", id});
  BOOST_TEST(status.exit_code() == 0);
  BOOST_TEST(status.out.find(id + "  exited (exit 0)") == 0u, status.out);
  auto unknown = cli({"status", "tnope"});
  BOOST_TEST(unknown.exit_code() == 1);
  BOOST_TEST(unknown.err.find(id) != std::string::npos, unknown.err);  // lists known ids
  BOOST_TEST(cli({"rm", id}).exit_code() == 0);
  auto listed = cli({"list", "--json"});
  BOOST_TEST(listed.out.find(id) == std::string::npos);
  auto refused = cli({"start", "--", "/usr/bin/wget"});
  BOOST_TEST(refused.exit_code() == 1);
  BOOST_TEST(refused.err.find("not allowed") != std::string::npos, refused.err);
}

BOOST_AUTO_TEST_CASE(cli_says_when_no_daemon_listens) {
  Sandbox s;
  auto r = run_process({cordon_bin(), "list", "--socket", s.base + "/none.sock"});
  BOOST_TEST(r.exit_code() == 3);
  BOOST_TEST(r.err.find("is `cordon serve` running?") != std::string::npos, r.err);
}
