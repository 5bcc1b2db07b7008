#pragma once

// The MCP server over stdio: newline-delimited JSON-RPC 2.0 on a pair of descriptors,
// dispatching tools/call through the tool table. Tool calls run on their own threads (at most
// McpOptions::max_calls at once) so a long wait never holds up the reading of the next
// message, a cancel included; every write to the output is one serialized line.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "cordon/engine.hpp"

namespace cordon::api {

/// The protocol versions spoken, newest first. The first two have structuredContent and
/// outputSchema; the older two get the same tools without them.
inline constexpr const char* kMcpVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                               "2024-11-05"};

struct McpOptions {
  EngineOptions engine;
  std::string session = "default";
  int in_fd = 0;   // read until EOF; then the server ends and its running commands with it
  int out_fd = 1;  // protocol messages only
  size_t max_calls = 32;
};

/// How long a daemon connection may sit still before it is closed (0: never).
struct ConnectionLimits {
  size_t max_calls = 32;
  std::chrono::milliseconds idle_timeout{0};   // no bytes, no partial line, no call in flight
  std::chrono::milliseconds stall_timeout{0};  // a line begun and not finished
};

/// One MCP session on a connection of the daemon: like run_mcp_server, on a shared engine that
/// outlives the connection (its jobs keep running when the client goes away). `first_line` is a
/// message the daemon already read (a client that skipped the handshake). Returns 0 when the
/// client closed, 1 when a limit closed the connection.
int serve_mcp_connection(std::shared_ptr<Engine> engine, const std::string& session, int in_fd,
                         int out_fd, const ConnectionLimits& limits,
                         const std::string& first_line = {});

/// Serves until EOF on in_fd. Returns a process exit code: 0 after a clean EOF, 1 when the
/// engine could not be opened (the reason is logged on stderr).
int run_mcp_server(const McpOptions& options);

}  // namespace cordon::api
