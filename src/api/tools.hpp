#pragma once

// The tool table: every tool an agent can call, written once. Each entry has its name, a
// description written for a model, JSON Schemas for its input and output, and a handler on
// the engine. The MCP server, the daemon and the CLI all dispatch through call_tool().
//
// Every result is a JSON object that validates against the tool's outputSchema, carries the
// session's `running` and `finished` counters, and on a refusal or failure has an `error`
// object {code, message, knownTaskIds?} whose message says what to do instead.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cordon/engine.hpp"

namespace cordon::api {

using json = nlohmann::json;

/// What a running call can be told or tell: a cancel ends its wait (never the command), and
/// progress goes to a caller that asked for it. Both are optional.
struct CallContext {
  std::function<bool()> cancelled;
  std::function<void(uint64_t waited_ms, uint64_t total_ms, const std::string& message)> progress;
  bool is_cancelled() const { return cancelled && cancelled(); }
};

using ToolHandler = json (*)(Engine& engine, const std::string& session, const json& args,
                             const CallContext& ctx);

struct Tool {
  std::string name;
  std::string title;
  std::string description;
  json input_schema;
  json output_schema;
  json annotations;  // MCP tool annotations (readOnlyHint, destructiveHint, …)
  ToolHandler handle;
};

struct ToolResult {
  json structured;  // validates against the tool's outputSchema
  bool is_error = false;
  std::string text;  // on error: what went wrong and what to do instead
};

/// The table, built once (thread-safe).
const std::vector<Tool>& tool_table();
/// The tool called `name`, or nullptr.
const Tool* find_tool(std::string_view name);
/// Validates `args` against the input schema, runs the handler, adds the counters. Never
/// fails: a bad argument, a refusal or an engine error is an in-band error result.
ToolResult call_tool(Engine& engine, const Tool& tool, const std::string& session, const json& args,
                     const CallContext& ctx = {});

/// For tool files beyond tools.cpp (git_tools.cpp): a result schema (the tool's fields, or
/// `error`, plus the counters) and the schema of an artifact reference (nullable).
json result_schema(json properties, std::vector<std::string> required);
json artifact_ref_schema();
/// What `tool` (run_command or run_command_bg) answers for a job it started, once the job has
/// settled: waits without bound in cancellable slices (on a cancel: the status so far), marks
/// the job read, adds the counters. An unknown task_id is the usual in-band not-found. This is
/// the tasks/result of an MCP task.
ToolResult settled_result(Engine& engine, const Tool& tool, const std::string& session,
                          const std::string& task_id, const CallContext& ctx = {});

/// A job's status as the tools show it (also the body of a `cordon://jobs/<id>` resource).
json status_json(const JobStatus& s);
/// The `error` object for an engine Error.
json error_json(const Error& e);

// Bounds the schemas and the handlers share.
inline constexpr uint64_t kDefaultYieldMs = 10000;
inline constexpr uint64_t kMaxYieldMs = 30000;
inline constexpr uint64_t kMaxStatusWaitMs = 30000;
inline constexpr uint64_t kDefaultWaitMs = 30000;
inline constexpr uint64_t kMaxWaitMs = 300000;
inline constexpr uint64_t kInlineOutputChars = 10000;  // run_command's inline stdout/pty
inline constexpr uint64_t kInlineStderrChars = 4000;
inline constexpr uint64_t kMaxPageLimit = 200000;
// A status shows argv's elements as far as this many bytes (argvOmitted counts the rest).
inline constexpr size_t kStatusArgvBytes = 4096;
// A wait is done in slices of this length, so a cancel ends it within one slice.
inline constexpr std::chrono::milliseconds kWaitSlice{200};

}  // namespace cordon::api
