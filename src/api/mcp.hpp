#pragma once

// The MCP server over stdio: newline-delimited JSON-RPC 2.0 on a pair of descriptors,
// dispatching tools/call through the tool table. Tool calls run on their own threads (at most
// McpOptions::max_calls at once) so a long wait never holds up the reading of the next
// message, a cancel included; every write to the output is one serialized line.

#include <chrono>
#include <cstddef>
#include <atomic>
#include <memory>
#include <string>

#include "cordon/engine.hpp"

namespace cordon::api {

/// The protocol versions spoken, newest first. The first two have structuredContent and
/// outputSchema; the older two get the same tools without them.
inline constexpr const char* kMcpVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                               "2024-11-05"};

/// Calls in flight over every connection of one daemon peer uid (ConnectionLimits).
struct CallBudget {
  explicit CallBudget(size_t m) : max(m) {}
  const size_t max;
  std::atomic<size_t> in_flight{0};
};

struct McpOptions {
  EngineOptions engine;
  std::string session = "default";
  int in_fd = 0;   // read until EOF; then the server ends and its running commands with it
  int out_fd = 1;  // protocol messages only
  size_t max_calls = 32;
  std::shared_ptr<CallBudget> uid_calls;  // none: only max_calls bounds the calls
};

/// How long a daemon connection may sit still before it is closed (0: never).
struct ConnectionLimits {
  size_t max_calls = 32;
  // Shared by the connections of one uid (not root's, nor the daemon's own uid's): each call
  // in flight holds one of its slots. A call's reply is built whole before it is sent (a
  // command_output page of control bytes is ~10 MB of JSON), and every waiting call costs a
  // thread: 64 connections of 32 calls were 2.5 GB a connection, or two cores of wakeups
  // (a review, session 32).
  std::shared_ptr<CallBudget> uid_calls;
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
