#pragma once

// Shared by the integration and security tests: a fresh working root and state dir per test,
// and `cordon run` invoked as a user would (a real process, the real kernel).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "helpers/process.hpp"

namespace cordon::test {

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
