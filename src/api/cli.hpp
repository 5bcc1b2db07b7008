#pragma once

namespace cordon::api {

/// The cordon command line (`cordon run`, `cordon doctor`, …). Returns the process exit code.
int cli_main(int argc, char** argv);

// Exit codes of `cordon run` besides the command's own (docs/cli.md).
inline constexpr int kExitOutputLimit = 123;
inline constexpr int kExitOom = 122;
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitRefused = 125;  // refused, or cordon could not set the run up
inline constexpr int kExitCannotExec = 126;
inline constexpr int kExitNotFound = 127;
// `cordon wait`: the wait ended before its condition was met (timeout(1)'s code).
inline constexpr int kExitWaitTimedOut = 124;

}  // namespace cordon::api
