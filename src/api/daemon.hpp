#pragma once

// The unix-socket daemon: one engine, many connections, each served by the same MCP
// JSON-RPC as `cordon mcp`. Peer credentials are checked (SO_PEERCRED) against the policy's
// daemon.allowedUids; sessions are scoped by the peer's uid, so one user never sees another's
// jobs. A connection either names its session in a one-line handshake (its jobs outlive the
// connection; a reconnecting client of the same uid finds them) or starts speaking JSON-RPC at
// once, and then its session ends with it (running jobs killed, records kept).
//
// Handshake (one line each way):
//   client → {"cordon": "connect", "session": "NAME"}   (without "session": unnamed)
//   daemon → {"ok": true, "session": "u<uid>-NAME"}   or   {"ok": false, "error": "..."}
// Limits: a request line of at most 16 MiB (longer: a JSON-RPC error, the line skipped); a
// line begun and not finished within daemon.stallTimeoutMs, or a client that does not read its
// answers that long, closes the connection; so does daemon.idleTimeoutMs without a request
// while no call is in flight. Every connection has its own thread: one never stalls another.

#include <string>
#include <sys/types.h>
#include <vector>

#include "base/unique_fd.hpp"

#include <nlohmann/json.hpp>

#include "cordon/engine.hpp"

namespace cordon::api {

struct DaemonOptions {
  EngineOptions engine;
  std::string socket_path;          // default: <state_dir>/daemon.sock
  std::vector<uid_t> allowed_uids;  // added to the policy's daemon.allowedUids (--allow-uid)
  size_t max_connections = 256;
};

/// Serves until SIGTERM/SIGINT; returns a process exit code (the reason logged on stderr).
int run_daemon(const DaemonOptions& options);

/// `cordon mcp --connect SOCKET`: a thin MCP front on stdio for a running daemon. Relays bytes
/// both ways after the handshake; ends when either side closes. Returns an exit code.
int run_mcp_connect(const std::string& socket_path, const std::string& session);

/// A connection to a running daemon for several tool calls: the handshake and the MCP
/// initialize once, then any number of tools/call. An empty `session` asks for an unnamed one,
/// which ends with the connection (the daemon kills its running jobs): `cordon run --socket`.
class DaemonClient {
 public:
  [[nodiscard]] static Result<DaemonClient> connect(const std::string& socket_path,
                                                    const std::string& session);
  /// One tools/call; returns its result (an isError result is a result, not an error).
  [[nodiscard]] Result<nlohmann::json> call(const std::string& tool,
                                            const nlohmann::json& arguments);

 private:
  explicit DaemonClient(UniqueFd sock) : sock_(std::move(sock)) {}
  [[nodiscard]] Result<nlohmann::json> request(const std::string& method,
                                               const nlohmann::json& params);
  /// Reads up to the reply to request `id` (of `method`), skipping notifications.
  [[nodiscard]] Result<nlohmann::json> reply(int64_t id, const std::string& method);
  UniqueFd sock_;
  int64_t next_id_ = 1;
};

/// A daemon session name: 1-100 letters, digits, `-`, `_` or `.`, not starting with `.`.
bool valid_session(const std::string& name);
inline constexpr const char* kSessionNameRule =
    "1-100 letters, digits, `-`, `_` or `.`, not starting with `.`";
/// Whether `session` is an unnamed session as the daemon names one for a connection without a
/// handshake: exactly `u<uid>.conn-<16 hex digits>`. A daemon starting on a state dir ends every
/// such session (its connection died with the daemon before it), jobs and all.
bool is_connection_session(const std::string& session);

/// Refuses arguments holding a string that is not UTF-8 (JSON would carry U+FFFD instead, and
/// the daemon would run another argv than the one asked for), naming the field and byte.
/// DaemonClient::call checks it before sending.
[[nodiscard]] Result<void> check_text_arguments(const nlohmann::json& arguments);

/// One tool call through a running daemon (the `cordon start|status|…` commands): connects,
/// performs the handshake and MCP initialize, calls `tool`, returns the tools/call result.
[[nodiscard]] Result<nlohmann::json> call_daemon_tool(const std::string& socket_path,
                                                      const std::string& session,
                                                      const std::string& tool,
                                                      const nlohmann::json& arguments);

}  // namespace cordon::api
