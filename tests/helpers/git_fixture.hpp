#pragma once

// A git repository built by the test with the host's git (outside any sandbox): two commits
// on main and a feature branch, with a fixed author. Shared by the git tools' integration
// and security tests.

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "helpers/process.hpp"

namespace cordon::test {

inline constexpr const char* kGitBin = "/usr/bin/git";

// A clean environment for the host git: no user or system config, fixed identity and dates.
inline std::vector<std::string> plain_git_env(const std::string& home) {
  return {"PATH=/usr/bin:/bin",
          "HOME=" + home,
          "GIT_CONFIG_NOSYSTEM=1",
          "GIT_AUTHOR_NAME=Ada Lovelace",
          "GIT_AUTHOR_EMAIL=ada@example.com",
          "GIT_COMMITTER_NAME=Ada Lovelace",
          "GIT_COMMITTER_EMAIL=ada@example.com",
          "GIT_AUTHOR_DATE=2024-03-01T10:00:00Z",
          "GIT_COMMITTER_DATE=2024-03-01T10:00:00Z",
          "LANG=C"};
}

struct GitRepo {
  std::string dir;                     // the checkout
  std::string home;                    // an empty HOME for the host git
  std::string first, second, feature;  // commit ids

  GitRepo(const std::string& path, const std::string& home_dir) : dir(path), home(home_dir) {
    std::filesystem::create_directories(dir);
    std::filesystem::create_directories(home);
    git({"init", "-q", "-b", "main"});
    write("README.md", "# fixture\n");
    write("src/lib.c", "int one(void) { return 1; }\n");
    git({"add", "."});
    git({"commit", "-q", "-m", "first: add the library"});
    first = head();
    write("src/lib.c", "int one(void) { return 1; }\nint two(void) { return 2; }\n");
    git({"commit", "-q", "-a", "-m", "second: add two()"});
    second = head();
    git({"checkout", "-q", "-b", "feature", first});
    write("docs/feature.md", "feature notes\n");
    git({"add", "."});
    git({"commit", "-q", "-m", "feature: document it"});
    feature = head();
    git({"checkout", "-q", "main"});
  }

  void write(const std::string& rel, const std::string& content) const {
    std::filesystem::path p = dir + "/" + rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << content;
  }

  // Runs the host git in the checkout; throws when it fails.
  std::string git(const std::vector<std::string>& args) const {
    auto r = run(args);
    if (r.exit_code() != 0) {
      std::string cmd;
      for (const auto& a : args) cmd += " " + a;
      throw std::runtime_error("git" + cmd + " failed: " + r.err);
    }
    return r.out;
  }
  ProcessResult run(const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env = {}) const {
    std::vector<std::string> argv = {kGitBin, "-C", dir};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessOptions o;
    o.env = plain_git_env(home);
    o.env->insert(o.env->end(), extra_env.begin(), extra_env.end());
    return run_process(argv, o);
  }
  std::string head() const {
    std::string s = git({"rev-parse", "HEAD"});
    return s.substr(0, s.find('\n'));
  }
};

}  // namespace cordon::test
