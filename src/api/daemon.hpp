#pragma once

// The unix-socket daemon: one engine, many connections. Each connection starts with a
// one-line handshake naming its session, then speaks the same MCP JSON-RPC as `cordon mcp`.
// Peer credentials are checked (SO_PEERCRED); sessions are scoped by the peer's uid, so one
// user never sees another's jobs. Jobs outlive their connection: an agent that reconnects
// with the same session name finds them.
//
// Handshake (one line each way):
//   client → {"cordon": "connect", "session": "NAME"}
//   daemon → {"ok": true, "session": "u<uid>-NAME"}   or   {"ok": false, "error": "..."}

#include <string>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "cordon/engine.hpp"

namespace cordon::api {

struct DaemonOptions {
  EngineOptions engine;
  std::string socket_path;          // default: <state_dir>/daemon.sock
  std::vector<uid_t> allowed_uids;  // besides root and the daemon's own uid
  size_t max_connections = 256;
};

/// Serves until SIGTERM/SIGINT; returns a process exit code (the reason logged on stderr).
int run_daemon(const DaemonOptions& options);

/// `cordon mcp --connect SOCKET`: a thin MCP front on stdio for a running daemon. Relays bytes
/// both ways after the handshake; ends when either side closes. Returns an exit code.
int run_mcp_connect(const std::string& socket_path, const std::string& session);

/// One tool call through a running daemon (the `cordon start|status|…` commands): connects,
/// performs the handshake and MCP initialize, calls `tool`, returns the tools/call result.
[[nodiscard]] Result<nlohmann::json> call_daemon_tool(const std::string& socket_path,
                                                      const std::string& session,
                                                      const std::string& tool,
                                                      const nlohmann::json& arguments);

}  // namespace cordon::api
