#pragma once

// An Engine on a fresh state dir with a policy whose cwdRoot is a fresh working root.

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cordon/engine.hpp"
#include "helpers/cordon_fixture.hpp"

namespace cordon::test {

inline std::string build_dir() {
  std::string bin = cordon_bin();
  return bin.substr(0, bin.rfind('/'));
}

struct EngineEnv {
  Sandbox box;  // base/root and base/state
  std::string policy_path;
  nlohmann::json policy;

  explicit EngineEnv(nlohmann::json extra = nlohmann::json::object()) {
    policy = {{"allowedExecutables",
               {"/bin/sh", "/usr/bin/sh", "/bin/echo", "/usr/bin/echo", "/bin/cat", "/usr/bin/cat",
                "/bin/sleep", "/usr/bin/sleep", "/usr/bin/head", "/usr/bin/yes", "/usr/bin/env",
                "/usr/bin/python3", "/usr/bin/true", "/bin/true", "/usr/bin/git"}},
              {"cwdRoot", box.root}};
    for (auto& [k, v] : extra.items()) policy[k] = v;
    policy_path = box.base + "/policy.json";
    std::ofstream(policy_path) << policy.dump(2);
  }

  Result<std::unique_ptr<Engine>> open() const {
    EngineOptions o;
    o.state_dir = box.state;
    o.policy_path = policy_path;
    o.spawner_path = build_dir() + "/cordon-spawner";
    o.init_path = build_dir() + "/cordon-init";
    o.default_seccomp_profile = build_dir() + "/seccomp/default.json";
    return Engine::open(o);
  }
};

inline std::string why(const Error& e) { return e.message(); }

}  // namespace cordon::test
