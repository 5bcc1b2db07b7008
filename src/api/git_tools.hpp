#pragma once

// The read-only git tools in the tool table (git_log, git_show, git_diff, git_blame,
// git_merge_base, git_ls_files): schemas and handlers over src/git. See docs/git.md.

#include <vector>

#include "api/tools.hpp"

namespace cordon::api {

/// Appends the git tools to `table` (called once by tool_table()).
void add_git_tools(std::vector<Tool>& table);

}  // namespace cordon::api
