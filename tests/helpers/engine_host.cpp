// A process that owns an Engine, so a test can SIGKILL the engine process itself.
// Usage: engine_host STATE_DIR POLICY SPAWNER INIT SECCOMP HOST_ID_BASE HOST_ID_COUNT
// Reads commands from stdin, one a line, and answers one line each on stdout:
//   start SCRIPT   starts ["/bin/sh", "-c", SCRIPT] in session "s"; prints the task id
//   wait ID        waits (≤ 30 s) for the job to settle; prints its state
// Prints "ready" once the engine is open, "error: ..." on failure.

#include <cstdio>
#include <iostream>
#include <string>

#include "cordon/engine.hpp"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: engine_host STATE POLICY SPAWNER INIT SECCOMP BASE COUNT\n");
    return 2;
  }
  cordon::EngineOptions o;
  o.state_dir = argv[1];
  o.policy_path = argv[2];
  o.spawner_path = argv[3];
  o.init_path = argv[4];
  o.default_seccomp_profile = argv[5];
  o.host_id_base = static_cast<uint32_t>(std::stoul(argv[6]));
  o.host_id_count = static_cast<uint32_t>(std::stoul(argv[7]));
  auto e = cordon::Engine::open(o);
  if (!e) {
    std::cout << "error: " << e.error().message() << std::endl;
    return 1;
  }
  std::cout << "ready" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("start ", 0) == 0) {
      auto s = (*e)->start("s", {.argv = {"/bin/sh", "-c", line.substr(6)}});
      std::cout << (s ? s->task_id : "error: " + s.error().message()) << std::endl;
    } else if (line.rfind("wait ", 0) == 0) {
      auto s = (*e)->status("s", line.substr(5), std::chrono::seconds(30));
      std::cout << (s ? s->state : "error: " + s.error().message()) << std::endl;
    } else {
      std::cout << "error: unknown command" << std::endl;
    }
  }
  return 0;
}
