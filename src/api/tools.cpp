#include "api/tools.hpp"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <numeric>
#include <limits>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "api/git_tools.hpp"
#include "api/schema.hpp"
#include "base/json_fields.hpp"

namespace cordon::api {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- schema fragments ----------------------------------------------------------------------

json str(const std::string& description) {
  return {{"type", "string"}, {"description", description}};
}
json boolean(const std::string& description) {
  return {{"type", "boolean"}, {"description", description}};
}
json integer(const std::string& description, uint64_t min = 0,
             std::optional<uint64_t> max = std::nullopt) {
  json j = {{"type", "integer"}, {"description", description}, {"minimum", min}};
  if (max) {
    j["maximum"] = *max;
  }
  return j;
}
json nullable(json schema) {
  schema["type"] = json::array({schema["type"], "null"});
  return schema;
}
json strings(const std::string& description) {
  return {{"type", "array"}, {"description", description}, {"items", {{"type", "string"}}}};
}
json enumeration(const std::string& description, std::vector<std::string> values) {
  return {{"type", "string"}, {"description", description}, {"enum", values}};
}
json object(json properties, std::vector<std::string> required) {
  return {{"type", "object"},
          {"properties", std::move(properties)},
          {"required", required},
          {"additionalProperties", false}};
}

const std::vector<std::string> kStates = {"queued",    "running",      "exited", "killed",
                                          "timeout",   "output-limit", "oom",    "failed",
                                          "abandoned", "removed"};

json task_id_arg() {
  return {{"type", "string"},
          {"minLength", 1},
          {"maxLength", 200},
          {"description", "The taskId that run_command_bg or run_command returned."}};
}

json artifact_schema() {
  return nullable(object({{"artifactId", str("Pass to retrieve_context to page this stream.")},
                          {"taskId", str("The job it came from.")},
                          {"stream", str("stdout, stderr or pty.")},
                          {"sizeBytes", integer("Size of the banked stream in bytes.")},
                          {"sha256", str("Hex SHA-256 of the stream's bytes.")},
                          {"preview", str("The stream's last characters.")},
                          {"readBackHint", str("How to read the rest back.")}},
                         {"artifactId", "taskId", "stream", "sizeBytes", "sha256"}));
}

json status_properties() {
  return {
      {"taskId", str("The job's id; pass it to the other command_* tools.")},
      {"label", str("The label given at start, or empty.")},
      {"argv", strings("The command as it was run (argv[0] resolved by the policy); a long one "
                       "only as far as 4096 bytes, see argvOmitted.")},
      {"argvOmitted", integer("How many of argv's last elements are not shown (only when some "
                              "are: the elements shown stay within 4096 bytes).")},
      {"cwd", str("Its working directory.")},
      {"state", enumeration("queued and running are live; every other state is final "
                            "(settled).",
                            kStates)},
      {"settled", boolean("True once the command ended; its output is then complete.")},
      {"exitCode", nullable(integer("The exit code when state is exited, else null."))},
      {"signal", nullable(str("The signal that ended it (SIGTERM, SIGKILL, ...), else null."))},
      {"startedAt", str("RFC 3339 UTC.")},
      {"endedAt", nullable(str("RFC 3339 UTC once settled, else null."))},
      {"durationMs", integer("Run time so far, or in total once settled.")},
      {"stdoutBytes", integer("Bytes printed to stdout (for a pty job: the terminal stream).")},
      {"stderrBytes", integer("Bytes printed to stderr.")},
      {"pty", boolean("True if the command runs on a terminal (one `pty` stream).")},
      {"cols", integer("A pty job's terminal width (command_resize changes it).")},
      {"rows", integer("A pty job's terminal height.")},
      {"stdoutArtifact", artifact_schema()},
      {"stderrArtifact", artifact_schema()},
      {"tail", str("The last lines it printed so far (both streams, labelled).")},
      {"message", str("Why it ended when that is not a plain exit (timeout, limits, setup "
                      "failure), else empty.")},
      {"usage", object({{"peakMemoryBytes", integer("Peak memory of the sandbox.")},
                        {"cpuTimeUs", integer("CPU time used.")},
                        {"oomKills", integer("Processes killed for memory.")},
                        {"pidsLimitHits", integer("Forks refused by the process limit.")}},
                       {"peakMemoryBytes", "cpuTimeUs", "oomKills", "pidsLimitHits"})},
  };
}
const std::vector<std::string> kStatusRequired = {
    "taskId",    "argv",    "state",      "settled",     "exitCode",    "signal",
    "startedAt", "endedAt", "durationMs", "stdoutBytes", "stderrBytes", "tail"};

json status_schema() { return object(status_properties(), kStatusRequired); }

json page_properties() {
  return {
      {"unit",
       enumeration("The unit of offset, nextOffset and totalSize.", {"chars", "bytes", "lines"})},
      {"encoding",
       enumeration("utf-8 text, or base64 of raw bytes (unit bytes).", {"utf-8", "base64"})},
      {"content", str("The page.")},
      {"offset", integer("Where the page starts.")},
      {"nextOffset", integer("Pass as offset to read on.")},
      {"totalSize", integer("The stream's size in the unit, as far as known now.")},
      {"hasMore", boolean("True if there is more after this page now.")},
      {"complete", boolean("True once the stream is final (the command settled).")},
  };
}
const std::vector<std::string> kPageRequired = {"unit",       "encoding",  "content", "offset",
                                                "nextOffset", "totalSize", "hasMore", "complete"};

json error_schema() {
  return object({{"code", enumeration("The kind of failure.",
                                      {"invalid-arguments", "refused", "invalid", "not-found",
                                       "unsupported", "system", "internal"})},
                 {"message", str("What went wrong and what to do instead.")},
                 {"knownTaskIds", strings("For an unknown taskId: this session's task ids "
                                          "(the most recent 20).")}},
                {"code", "message"});
}

// Every output: the tool's own fields (required on success), the counters (always), and an
// `error` object instead of the tool's fields on a refusal or failure, so an error result
// validates too.
json output_schema(json properties, std::vector<std::string> required) {
  properties["running"] = integer("This session's queued or running commands.");
  properties["finished"] = integer(
      "This session's commands that settled and were not read yet (command_status, "
      "command_wait and command_output read them).");
  properties["error"] = error_schema();
  return {{"type", "object"},
          {"properties", std::move(properties)},
          {"required", {"running", "finished"}},
          {"additionalProperties", false},
          {"anyOf", json::array({{{"required", required}}, {{"required", {"error"}}}})}};
}

json input_schema(json properties, std::vector<std::string> required) {
  return object(std::move(properties), std::move(required));
}

json output_args() {
  return {{"offset", integer("Where to start, in `unit`s (default 0).")},
          {"limit", integer("How many units at most (default 50000).", 1, kMaxPageLimit)},
          {"unit", enumeration("chars (default): UTF-8 text, invalid bytes shown as U+FFFD; "
                               "lines: whole lines; bytes: exact bytes, base64-encoded.",
                               {"chars", "bytes", "lines"})}};
}

json start_properties() {
  return {
      {"argv",
       {{"type", "array"},
        {"minItems", 1},
        {"maxItems", 65536},
        {"items", {{"type", "string"}, {"maxLength", 131071}}},
        {"description",
         "The program and its arguments as separate strings, e.g. [\"/usr/bin/make\", "
         "\"-j4\", \"test\"]. argv[0] is an absolute path the policy allows. There is NO "
         "shell: no pipes, redirections, globs, `&&` or variables."}}},
      {"cwd",
       {{"type", "string"},
        {"maxLength", 4095},
        {"description",
         "Working directory, inside the policy's working root (default: the root)."}}},
      {"timeoutMs", integer("Wall-clock limit; SIGTERM then SIGKILL (default and maximum: the "
                            "policy's).",
                            1)},
      {"env",
       {{"type", "object"},
        {"additionalProperties", {{"type", "string"}}},
        {"description", "Environment variables to set, as the policy permits."}}},
      {"label", {{"type", "string"}, {"maxLength", 200}, {"description", "A name for you."}}},
      {"stdin", enumeration("null (default): no input; pipe: send input with command_write.",
                            {"null", "pipe"})},
      {"pty", boolean("Run on a terminal (interactive programs, TUIs); drive it with "
                      "command_write keys. Output is one `pty` stream.")},
      {"cols", integer("The terminal's width in characters (pty only; default 120). "
                       "command_resize changes it.",
                       1, kMaxTerminalSide)},
      {"rows",
       integer("The terminal's height in lines (pty only; default 30).", 1, kMaxTerminalSide)},
  };
}

// ---- helpers --------------------------------------------------------------------------------

const char* code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalid:
      return "invalid";
    case ErrorCode::kRefused:
      return "refused";
    case ErrorCode::kNotFound:
      return "not-found";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kSystem:
      return "system";
    default:
      return "internal";
  }
}

json error_with_ids(Engine& engine, const std::string& session, const Error& e) {
  json j = {{"error", error_json(e)}};
  if (e.code() == ErrorCode::kNotFound) {
    // An index that cannot be read lists nothing (the message says why), never `[]`.
    if (auto ids = engine.known_ids(session)) {
      if (ids->size() > 20) {
        ids->erase(ids->begin(), ids->end() - 20);
      }
      j["error"]["knownTaskIds"] = *ids;
    }
  }
  return j;
}

// Waits in slices so that a cancel ends the wait within one slice and a long wait can report
// progress. `step(slice)` waits at most `slice` and says whether the wait is over.
template <class Step>
Result<bool> wait_in_slices(const CallContext& ctx, milliseconds total, Step&& step) {
  auto start = Clock::now();
  auto last_progress = start;
  for (;;) {
    auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    milliseconds slice = std::max(milliseconds(0), std::min(total - waited, kWaitSlice));
    CORDON_TRY(done, step(slice));
    if (done) {
      return true;
    }
    waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    if (waited >= total || ctx.is_cancelled()) {
      return false;
    }
    if (ctx.progress && Clock::now() - last_progress >= std::chrono::seconds(1)) {
      last_progress = Clock::now();
      ctx.progress(static_cast<uint64_t>(waited.count()), static_cast<uint64_t>(total.count()),
                   "waiting for the command to settle");
    }
  }
}

uint64_t get_u64(const json& args, const char* key, uint64_t fallback) {
  auto it = args.find(key);
  if (it == args.end() || !it->is_number()) {
    return fallback;
  }
  if (!it->is_number_float()) {
    return it->get<uint64_t>();
  }
  // JSON Schema counts 3.0 as an integer, and 1e300 too. A cast from a double past what a
  // uint64 holds is undefined: such a number reads as the largest (2^64 is exactly a double).
  double d = it->get<double>();
  if (!(d >= 0)) {
    return fallback;  // negative or NaN: the schema's minimum refused it before this
  }
  return d >= 18446744073709551616.0 ? std::numeric_limits<uint64_t>::max()
                                     : static_cast<uint64_t>(d);
}

OutputUnit unit_of(const std::string& u) {
  return u == "bytes" ? OutputUnit::kBytes : u == "lines" ? OutputUnit::kLines : OutputUnit::kChars;
}

json page_json(const OutputPage& p, const std::string& unit) {
  return {{"unit", unit},
          {"encoding", p.base64 ? "base64" : "utf-8"},
          {"content", p.content},
          {"offset", p.offset},
          {"nextOffset", p.next_offset},
          {"totalSize", p.total_size},
          {"hasMore", p.has_more},
          {"complete", p.complete}};
}

OutputRequest page_request(const json& args) {
  OutputRequest r;
  r.offset = get_u64(args, "offset", 0);
  r.limit = get_u64(args, "limit", 50000);
  r.unit = unit_of(json_fields::str(args, "unit", "chars"));
  return r;
}

// The last `limit` chars of a stream (its whole content if shorter).
Result<json> inline_stream(Engine& engine, const std::string& session, const std::string& id,
                           const std::string& stream, uint64_t limit) {
  CORDON_TRY(first, engine.output(session, id, {.stream = stream, .offset = 0, .limit = limit}));
  OutputPage page = std::move(first);
  bool truncated = page.has_more;
  if (truncated) {
    uint64_t from = page.total_size > limit ? page.total_size - limit : 0;
    CORDON_TRY(last,
               engine.output(session, id, {.stream = stream, .offset = from, .limit = limit}));
    page = std::move(last);
  }
  return json{{"content", page.content},
              {"offset", page.offset},
              {"totalChars", page.total_size},
              {"truncated", truncated}};
}

std::optional<int> signal_number(const std::string& name) {
  static const std::pair<const char*, int> kSignals[] = {
      {"SIGTERM", SIGTERM}, {"SIGKILL", SIGKILL}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
      {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},
  };
  for (const auto& [n, v] : kSignals) {
    if (name == n) {
      return v;
    }
  }
  return std::nullopt;
}

// ---- handlers -------------------------------------------------------------------------------

// A terminal's side from `args`. The schema holds it to 1..kMaxTerminalSide; a larger value
// is clamped, never wrapped, so that the engine's check (1..kMaxTerminalSide) refuses it.
uint16_t terminal_side(const json& args, const char* key, uint16_t fallback) {
  return static_cast<uint16_t>(std::min<uint64_t>(get_u64(args, key, fallback), UINT16_MAX));
}

Result<StartOptions> start_options(const json& args) {
  StartOptions o;
  o.argv = args["argv"].get<std::vector<std::string>>();
  if (args.contains("cwd")) {
    o.cwd = args["cwd"].get<std::string>();
  }
  if (args.contains("timeoutMs")) {
    o.timeout_ms = get_u64(args, "timeoutMs", 0);
  }
  if (args.contains("env")) {
    o.env = args["env"].get<std::map<std::string, std::string>>();
  }
  o.label = json_fields::str(args, "label");
  o.stdin_mode =
      json_fields::str(args, "stdin", "null") == "pipe" ? StdinMode::kPipe : StdinMode::kNull;
  o.pty = args.value("pty", false);
  if (args.contains("cols") || args.contains("rows")) {
    if (!o.pty) {
      return invalid(
          "cols and rows size a terminal: start the command with pty: true (cordon start "
          "--pty) as well");
    }
    o.cols = terminal_side(args, "cols", o.cols);
    o.rows = terminal_side(args, "rows", o.rows);
  }
  return o;
}

json run_command_bg(Engine& engine, const std::string& session, const json& args,
                    const CallContext&) {
  auto opts = start_options(args);
  if (!opts) {
    return error_with_ids(engine, session, opts.error());
  }
  auto s = engine.start(session, *opts);
  if (!s) {
    return error_with_ids(engine, session, s.error());
  }
  return status_json(*s);
}

// Waits (in cancellable slices) up to `wait` for one job to settle; `st` holds its latest
// status. An Error is returned as the tool's in-band error result.
std::optional<json> await_status(Engine& engine, const std::string& session, const std::string& id,
                                 milliseconds wait, const CallContext& ctx, JobStatus& st) {
  auto waited = wait_in_slices(ctx, wait, [&](milliseconds slice) -> Result<bool> {
    CORDON_TRY(s, engine.status(session, id, slice));
    st = std::move(s);
    return st.settled();
  });
  if (!waited) {
    return error_with_ids(engine, session, waited.error());
  }
  return std::nullopt;
}

// run_command's answer for a settled job: its status and its output inline (the tails).
json settled_with_output(Engine& engine, const std::string& session, const JobStatus& st) {
  const std::string& id = st.task_id;
  json out = status_json(st);
  // A log that cannot be read now (removed under the engine, an I/O error) costs the inline
  // tails, not the outcome. Failure fixed (a review, session 23): the answer was an error
  // without the taskId, so a job that had run read as one that never started.
  auto without_output = [&](const Error& e) {
    out["hint"] = fmt::format(
        "its output could not be shown inline ({}); page it with command_output "
        "{{\"taskId\": \"{}\", \"offset\": 0}}",
        e.message(), id);
    return out;
  };
  json output = json::object();
  std::string first = st.pty ? "pty" : "stdout";
  auto a = inline_stream(engine, session, id, first, kInlineOutputChars);
  if (!a) {
    return without_output(a.error());
  }
  output[first] = *a;
  if (!st.pty) {
    auto b = inline_stream(engine, session, id, "stderr", kInlineStderrChars);
    if (!b) {
      return without_output(b.error());
    }
    output["stderr"] = *b;
  }
  // The hint names each stream cut, with the call that pages it. Failure fixed (a review,
  // session 31): it named no stream, so with only stderr cut it paged stdout (the default).
  std::vector<std::string> calls;
  for (const auto& [k, v] : output.items()) {
    if (v["truncated"].get<bool>()) {
      calls.push_back(fmt::format(
          "command_output {{\"taskId\": \"{}\", \"stream\": \"{}\", \"offset\": 0}}", id, k));
    }
  }
  out["output"] = output;
  if (!calls.empty()) {
    out["hint"] = fmt::format(
        "the output shown is the tail of a longer stream; page it from the start with {}",
        fmt::join(calls, " and "));
  }
  return out;
}

json run_command(Engine& engine, const std::string& session, const json& args,
                 const CallContext& ctx) {
  auto opts = start_options(args);
  if (!opts) {
    return error_with_ids(engine, session, opts.error());
  }
  auto started = engine.start(session, *opts);
  if (!started) {
    return error_with_ids(engine, session, started.error());
  }
  std::string id = started->task_id;
  JobStatus st = *started;
  milliseconds yield(get_u64(args, "yieldMs", kDefaultYieldMs));
  const auto t0 = std::chrono::steady_clock::now();
  if (auto err = await_status(engine, session, id, yield, ctx, st)) {
    return *err;
  }
  json out = status_json(st);
  if (!st.settled()) {
    // The time waited, not the time asked for: a wait a cancel or a shutdown ended is shorter.
    const auto waited =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    out["hint"] = fmt::format(
        "still running after {} ms and left running: use command_wait {{\"taskIds\": "
        "[\"{}\"]}} or command_status {{\"taskId\": \"{}\", \"waitMs\": 30000}}; "
        "command_output pages what it printed so far",
        waited.count(), id, id);
    return out;
  }
  return settled_with_output(engine, session, st);
}

json command_status(Engine& engine, const std::string& session, const json& args,
                    const CallContext& ctx) {
  std::string id = args["taskId"].get<std::string>();
  milliseconds wait(get_u64(args, "waitMs", 0));
  JobStatus st;
  if (auto err = await_status(engine, session, id, wait, ctx, st)) {
    return *err;
  }
  return status_json(st);
}

json command_wait(Engine& engine, const std::string& session, const json& args,
                  const CallContext& ctx) {
  auto ids = args["taskIds"].get<std::vector<std::string>>();
  // Each job's status is in the answer once per id: 64 copies of one job with a 2 MiB argv
  // were an 832 MB reply (a review, session 34).
  for (size_t i = 0; i < ids.size(); ++i) {
    if (std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(i), ids[i]) !=
        ids.begin() + static_cast<std::ptrdiff_t>(i)) {
      return error_with_ids(
          engine, session,
          Error(ErrorCode::kInvalid, 0,
                fmt::format("taskIds lists `{}` more than once: list each command once",
                            ids[i].substr(0, 64))));
    }
  }
  bool all = json_fields::str(args, "mode", "any") == "all";
  milliseconds timeout(get_u64(args, "timeoutMs", kDefaultWaitMs));
  // The wait goes in slices, each a new Engine::wait that checks its ids are the session's: a
  // job settled (or answered `removed`) in one is kept as answered, and the later slices wait
  // for the others only. A job removed in an earlier slice, or between two, failed the whole
  // wait "unknown taskId" (a review, session 40).
  std::vector<JobStatus> jobs(ids.size());
  std::vector<size_t> waiting(ids.size());
  std::iota(waiting.begin(), waiting.end(), size_t{0});
  auto done = wait_in_slices(ctx, timeout, [&](milliseconds slice) -> Result<bool> {
    std::vector<std::string> asked;
    for (size_t i : waiting) {
      asked.push_back(ids[i]);
    }
    CORDON_TRY(w, engine.wait(session, asked, slice, all));
    std::vector<size_t> still;
    for (size_t k = 0; k < waiting.size(); ++k) {
      if (!w[k].settled()) {  // a settled job's answer is kept: it may be removed meanwhile
        still.push_back(waiting[k]);
      }
      jobs[waiting[k]] = std::move(w[k]);
    }
    waiting = std::move(still);
    size_t settled = static_cast<size_t>(
        std::count_if(jobs.begin(), jobs.end(), [](const JobStatus& s) { return s.settled(); }));
    return waiting.empty() || (all ? settled == jobs.size() : settled > 0);
  });
  if (!done) {
    return error_with_ids(engine, session, done.error());
  }
  json out = {{"mode", all ? "all" : "any"},
              {"done", *done},
              {"settledIds", json::array()},
              {"pendingIds", json::array()},
              {"jobs", json::array()}};
  for (const auto& s : jobs) {
    out[s.settled() ? "settledIds" : "pendingIds"].push_back(s.task_id);
    out["jobs"].push_back(status_json(s));
  }
  return out;
}

json command_output(Engine& engine, const std::string& session, const json& args,
                    const CallContext&) {
  std::string id = args["taskId"].get<std::string>();
  OutputRequest req = page_request(args);
  std::string stream = json_fields::str(args, "stream");
  if (stream.empty()) {
    // The default follows the job: a pty job has one `pty` stream. (It listed the whole
    // session to find the job, ~5x the cost of the page itself at 400 jobs.) The page read
    // below marks the job read anyway, as this status does.
    auto st = engine.status(session, id);
    stream = st && st->pty ? "pty" : "stdout";
  }
  req.stream = stream;
  auto page = engine.output(session, id, req);
  if (!page) {
    return error_with_ids(engine, session, page.error());
  }
  json out = page_json(*page, json_fields::str(args, "unit", "chars"));
  out["taskId"] = id;
  out["stream"] = stream;
  return out;
}

json command_kill(Engine& engine, const std::string& session, const json& args,
                  const CallContext& ctx) {
  std::string id = args["taskId"].get<std::string>();
  int sig = signal_number(json_fields::str(args, "signal", "SIGTERM")).value_or(SIGTERM);
  auto k = engine.kill(session, id, sig);
  if (!k) {
    return error_with_ids(engine, session, k.error());
  }
  JobStatus st = *k;
  // A short wait, so the usual answer is the final state rather than "running".
  if (auto err = await_status(engine, session, id, milliseconds(2000), ctx, st)) {
    return *err;
  }
  return status_json(st);
}

json command_write(Engine& engine, const std::string& session, const json& args,
                   const CallContext&) {
  std::string id = args["taskId"].get<std::string>();
  WriteInput in;
  if (args.contains("data")) {
    in.data = args["data"].get<std::string>();
  }
  if (args.contains("paste")) {
    in.paste = args["paste"].get<std::string>();
  }
  if (args.contains("keys")) {
    in.keys = args["keys"].get<std::vector<std::string>>();
  }
  in.submit = args.value("submit", false);
  in.eof = args.value("eof", false);
  if (!in.data && !in.paste && in.keys.empty() && !in.submit && !in.eof) {
    return {{"error",
             {{"code", "invalid-arguments"},
              {"message", "nothing to write: give data, paste, keys, submit or eof"}}}};
  }
  auto w = engine.write(session, id, in);
  if (!w) {
    return error_with_ids(engine, session, w.error());
  }
  return {{"taskId", id}, {"accepted", true}};
}

json command_resize(Engine& engine, const std::string& session, const json& args,
                    const CallContext&) {
  std::string id = args["taskId"].get<std::string>();
  const uint16_t cols = terminal_side(args, "cols", 0), rows = terminal_side(args, "rows", 0);
  auto r = engine.resize(session, id, cols, rows);
  if (!r) {
    return error_with_ids(engine, session, r.error());
  }
  return {{"taskId", id}, {"cols", cols}, {"rows", rows}};
}

// Failure fixed (session 14): command_list answered every job of the session at once, each
// with its output tails, built under the engine's lock: a session of 5000 jobs was a reply of
// megabytes to an agent. Now a page (50 by default), with the total and where to go on.
constexpr uint64_t kListDefaultLimit = 50;
constexpr uint64_t kListMaxLimit = 500;

json command_list(Engine& engine, const std::string& session, const json& args,
                  const CallContext&) {
  ListRequest request{.offset = get_u64(args, "offset", 0),
                      .limit = std::min(get_u64(args, "limit", kListDefaultLimit), kListMaxLimit)};
  if (args.contains("state")) {
    request.state = args["state"].get<std::string>();
  }
  auto l = engine.list_page(session, request);
  if (!l) {
    return error_with_ids(engine, session, l.error());
  }
  json jobs = json::array();
  for (const auto& s : l->jobs) {
    jobs.push_back(status_json(s));
  }
  json out = {
      {"count", jobs.size()}, {"total", l->total}, {"offset", request.offset}, {"jobs", jobs}};
  if (request.offset + l->jobs.size() < l->total) {
    out["nextOffset"] = request.offset + l->jobs.size();
  }
  return out;
}

json command_remove(Engine& engine, const std::string& session, const json& args,
                    const CallContext&) {
  std::string id = args["taskId"].get<std::string>();
  auto r = engine.remove(session, id);
  if (!r) {
    return error_with_ids(engine, session, r.error());
  }
  return {{"taskId", id}, {"removed", true}};
}

json retrieve_context(Engine& engine, const std::string& session, const json& args,
                      const CallContext&) {
  std::string id = args["artifactId"].get<std::string>();
  auto p = engine.retrieve(session, id, page_request(args));
  if (!p) {
    json e = error_with_ids(engine, session, p.error());
    e["error"].erase("knownTaskIds");
    e["error"]["message"] = p.error().message() +
                            "; artifact ids are in a settled job's stdoutArtifact / "
                            "stderrArtifact (command_status)";
    return e;
  }
  json out = page_json(*p, json_fields::str(args, "unit", "chars"));
  out["artifactId"] = id;
  return out;
}

// ---- the table ------------------------------------------------------------------------------

constexpr const char* kNoShell =
    " argv is an array: the program's absolute path, then each argument as its own string. "
    "There is no shell, ever: `|`, `>`, `&&`, `*`, `$VAR` and `cd` are not interpreted; run the "
    "program directly (e.g. [\"/usr/bin/grep\", \"-rn\", \"TODO\", \"src\"]) and only the "
    "executables the policy allows.";

std::vector<Tool> build_table() {
  std::vector<Tool> t;
  json start = start_properties();
  json status_out = output_schema(status_properties(), kStatusRequired);

  json run_props = start;
  run_props["yieldMs"] =
      integer(fmt::format("How long to wait for it to finish (default {}, at most {}).",
                          kDefaultYieldMs, kMaxYieldMs),
              0, kMaxYieldMs);
  json inline_stream_schema =
      object({{"content", str("The stream's text (its tail when truncated).")},
              {"offset", integer("The char offset where content starts.")},
              {"totalChars", integer("The stream's length in chars.")},
              {"truncated", boolean("True if content is only the tail.")}},
             {"content", "offset", "totalChars", "truncated"});
  json run_out_props = status_properties();
  run_out_props["output"] = object({{"stdout", inline_stream_schema},
                                    {"stderr", inline_stream_schema},
                                    {"pty", inline_stream_schema}},
                                   {});
  run_out_props["hint"] = str("What to do next (the job still runs, or output was cut).");

  t.push_back(
      {"run_command",
       "Run a command and wait for it",
       std::string("Runs a command in a fresh sandbox and waits up to yieldMs (default 10 s, at "
                   "most 30 s) for it to finish. If it finishes: its full status (state, "
                   "exitCode, signal, durations, artifacts) and its output inline (the last "
                   "10000 chars of stdout, 4000 of stderr; page more with command_output). If "
                   "not: it keeps running and you get its taskId, state \"running\" and the "
                   "tail so far; follow it with command_wait, command_status or "
                   "command_output. Use this for builds, tests and short tools; use "
                   "run_command_bg for servers and anything long.") +
           kNoShell + " A non-zero exit is a normal result: read exitCode and the output.",
       input_schema(run_props, {"argv"}),
       output_schema(run_out_props, kStatusRequired),
       {{"readOnlyHint", false}, {"destructiveHint", true}, {"openWorldHint", false}},
       run_command});
  t.push_back(
      {"run_command_bg",
       "Start a command in the background",
       std::string("Starts a command in a fresh sandbox and returns at once with its taskId "
                   "and state (\"running\" or \"queued\"). Use it for long builds, test suites "
                   "and servers, or to run several commands at once. Then: command_wait (block "
                   "until done), command_status, command_output (page stdout/stderr), "
                   "command_write (stdin / terminal keys, needs stdin \"pipe\" or pty), "
                   "command_kill. Every byte it prints is kept.") +
           kNoShell,
       input_schema(start, {"argv"}),
       status_out,
       {{"readOnlyHint", false}, {"destructiveHint", true}, {"openWorldHint", false}},
       run_command_bg});
  t.push_back(
      {"command_status",
       "A command's status",
       "Returns a command's status: state, exitCode, signal, byte counts, artifacts and the tail "
       "of its output. With waitMs (at most 30000) it first waits that long for the command to "
       "settle. Reading a settled command's status lowers the `finished` counter. An unknown "
       "taskId is refused with the list of this session's task ids.",
       input_schema({{"taskId", task_id_arg()},
                     {"waitMs", integer("Wait up to this long for it to settle first "
                                        "(default 0).",
                                        0, kMaxStatusWaitMs)}},
                    {"taskId"}),
       status_out,
       {{"readOnlyHint", true}, {"openWorldHint", false}},
       command_status});
  t.push_back(
      {"command_wait",
       "Wait for commands to finish",
       fmt::format(
           "Blocks until any (mode \"any\", default) or all (mode \"all\") of the given commands "
           "settled, or timeoutMs passed (default {}, at most {}). Returns done, the settled and "
           "pending ids and every job's status. A timeout is not an error: call it again. "
           "Cancelling the request ends the wait, not the commands.",
           kDefaultWaitMs, kMaxWaitMs),
       input_schema({{"taskIds",
                      {{"type", "array"},
                       {"minItems", 1},
                       {"maxItems", 64},
                       {"items", task_id_arg()},
                       {"description", "The commands to wait for."}}},
                     {"timeoutMs", integer("The longest wait.", 0, kMaxWaitMs)},
                     {"mode", enumeration("any (default) or all.", {"any", "all"})}},
                    {"taskIds"}),
       output_schema({{"mode", enumeration("The mode used.", {"any", "all"})},
                      {"done", boolean("True if the wait condition was met (not timed out).")},
                      {"settledIds", strings("The ids that settled.")},
                      {"pendingIds", strings("The ids still queued or running.")},
                      {"jobs", {{"type", "array"}, {"items", status_schema()}}}},
                     {"mode", "done", "settledIds", "pendingIds", "jobs"}),
       {{"readOnlyHint", true}, {"openWorldHint", false}},
       command_wait});
  json out_args = output_args();
  out_args["taskId"] = task_id_arg();
  out_args["stream"] = enumeration(
      "stdout (default), stderr, or pty for a job started with pty (its only stream besides "
      "stderr).",
      {"stdout", "stderr", "pty"});
  json out_props = page_properties();
  out_props["taskId"] = str("The job.");
  out_props["stream"] = str("The stream read.");
  std::vector<std::string> out_required = kPageRequired;
  out_required.push_back("taskId");
  out_required.push_back("stream");
  t.push_back(
      {"command_output",
       "Page a command's output",
       "Reads a page of a command's stdout, stderr or pty stream, running or settled. Nothing "
       "is ever discarded: start at offset 0 and follow nextOffset while hasMore. unit chars "
       "(default) and lines return text; bytes returns base64 of the exact bytes. On a running "
       "command, polling with the last nextOffset returns only what is new.",
       input_schema(out_args, {"taskId"}),
       output_schema(out_props, out_required),
       {{"readOnlyHint", true}, {"openWorldHint", false}},
       command_output});
  t.push_back(
      {"command_kill",
       "Stop a command",
       "Sends a signal (default SIGTERM) to the whole sandbox of a running command; SIGKILL "
       "follows after the policy's grace period. Waits up to 2 s for it to settle and returns "
       "its status. Killing a settled command changes nothing and returns its status.",
       input_schema({{"taskId", task_id_arg()},
                     {"signal", enumeration("The signal (default SIGTERM).",
                                            {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT",
                                             "SIGUSR1", "SIGUSR2"})}},
                    {"taskId"}),
       status_out,
       {{"readOnlyHint", false}, {"destructiveHint", true}, {"openWorldHint", false}},
       command_kill});
  t.push_back(
      {"command_write",
       "Send input to a command",
       "Writes to a running command's stdin (started with stdin \"pipe\": send `data`, then "
       "`eof` to close it) or terminal (started with pty: `data` typed as is, `paste` as a "
       "bracketed paste, `keys` like [\"C-c\", \"Up\", \"Enter\", \"Escape\"], `submit` "
       "presses Enter after, `eof` sends Ctrl-D). Read the reaction with command_output.",
       input_schema({{"taskId", task_id_arg()},
                     {"data", str("Text to send as it is (its UTF-8 bytes; JSON carries text "
                                  "only, so bytes that are not UTF-8 cannot be sent).")},
                     {"paste", str("Text to paste (bracketed paste when the program asked "
                                   "for it; control bytes the terminal would act on, like "
                                   "Ctrl-C, are dropped). pty only.")},
                     {"keys", strings("Key names in tmux syntax: Enter, Tab, Escape, BSpace, "
                                      "Up, Down, Left, Right, C-c, M-x, F1... pty only.")},
                     {"submit", boolean("Press Enter after the rest. pty only.")},
                     {"eof", boolean("Close stdin (pipe) or send Ctrl-D (pty; twice after "
                                     "a partial line, so input ends).")}},
                    {"taskId"}),
       output_schema({{"taskId", str("The job.")},
                      {"accepted", boolean("The input was queued for the command.")}},
                     {"taskId", "accepted"}),
       {{"readOnlyHint", false}, {"destructiveHint", false}, {"openWorldHint", false}},
       command_write});
  t.push_back(
      {"command_resize",
       "Resize a command's terminal",
       "Sets the window size of a command started with pty (its programs get SIGWINCH and "
       "redraw for the new size). A queued command starts at that size. Read the redrawn "
       "screen with command_output.",
       input_schema({{"taskId", task_id_arg()},
                     {"cols", integer("Width in characters.", 1, kMaxTerminalSide)},
                     {"rows", integer("Height in lines.", 1, kMaxTerminalSide)}},
                    {"taskId", "cols", "rows"}),
       output_schema({{"taskId", str("The job.")},
                      {"cols", integer("The width set (now, or when the terminal is made).")},
                      {"rows", integer("The height set.")}},
                     {"taskId", "cols", "rows"}),
       {{"readOnlyHint", false}, {"destructiveHint", false}, {"openWorldHint", false}},
       command_resize});
  t.push_back(
      {"command_list",
       "List commands",
       "Lists this session's commands (oldest first) with their status, a page at a time "
       "(50 by default; total says how many there are, nextOffset where the next page starts), "
       "optionally only those in one state. Listing does not mark anything read.",
       input_schema(
           {{"state", enumeration("Only jobs in this state.", kStates)},
            {"offset", integer("How many (matching) jobs to skip, oldest first (default 0).")},
            {"limit", integer(fmt::format("How many jobs at most (default {}).", kListDefaultLimit),
                              1, kListMaxLimit)}},
           {}),
       output_schema({{"count", integer("How many jobs are in this page.")},
                      {"total", integer("How many jobs match, in all pages.")},
                      {"offset", integer("Where this page starts.")},
                      {"nextOffset", integer("Pass as offset for the next page; only when there "
                                             "are more jobs after this page.")},
                      {"jobs", {{"type", "array"}, {"items", status_schema()}}}},
                     {"count", "total", "offset", "jobs"}),
       {{"readOnlyHint", true}, {"openWorldHint", false}},
       command_list});
  t.push_back(
      {"command_remove",
       "Delete a settled command",
       "Deletes a settled command's record, logs and artifacts. A running command is refused: "
       "command_kill it first. Otherwise only the policy's retention removes settled commands "
       "(oldest first, when it is set).",
       input_schema({{"taskId", task_id_arg()}}, {"taskId"}),
       output_schema(
           {{"taskId", str("The removed job.")}, {"removed", boolean("Always true on success.")}},
           {"taskId", "removed"}),
       {{"readOnlyHint", false}, {"destructiveHint", true}, {"openWorldHint", false}},
       command_remove});
  json art_args = output_args();
  art_args["artifactId"] = {{"type", "string"},
                            {"minLength", 1},
                            {"maxLength", 200},
                            {"description",
                             "From a settled job's stdoutArtifact or "
                             "stderrArtifact."}};
  json art_props = page_properties();
  art_props["artifactId"] = str("The artifact read.");
  std::vector<std::string> art_required = kPageRequired;
  art_required.push_back("artifactId");
  t.push_back({"retrieve_context",
               "Page a banked artifact",
               "Reads a page of an artifact: the complete, immutable output stream of a settled "
               "command (see stdoutArtifact / stderrArtifact in its status, with size and sha256). "
               "Same paging as command_output: offset, limit, unit chars|lines|bytes.",
               input_schema(art_args, {"artifactId"}),
               output_schema(art_props, art_required),
               {{"readOnlyHint", true}, {"openWorldHint", false}},
               retrieve_context});
  add_git_tools(t);
  return t;
}

}  // namespace

json result_schema(json properties, std::vector<std::string> required) {
  return output_schema(std::move(properties), std::move(required));
}
json artifact_ref_schema() { return artifact_schema(); }

json error_json(const Error& e) {
  std::string msg = e.message();
  if (e.code() == ErrorCode::kSystem || e.code() == ErrorCode::kInternal) {
    msg += " (a failure inside cordon, not in your command; retrying may help)";
  }
  return {{"code", code_name(e.code())}, {"message", msg}};
}

json status_json(const JobStatus& s) {
  auto artifact = [](const std::optional<ArtifactRef>& a) -> json {
    if (!a) {
      return nullptr;
    }
    return {{"artifactId", a->artifact_id},     {"taskId", a->task_id}, {"stream", a->stream},
            {"sizeBytes", a->size_bytes},       {"sha256", a->sha256},  {"preview", a->preview},
            {"readBackHint", a->read_back_hint}};
  };
  // The argv as far as kStatusArgvBytes: a status is in every answer about its job and in
  // lists of 500, and an argv may be 2 MiB (of control bytes, 6 characters each in JSON).
  json argv = json::array();
  size_t argv_bytes = 0, omitted = 0;
  for (const auto& a : s.argv) {
    if (omitted > 0 || argv_bytes + a.size() > kStatusArgvBytes) {
      ++omitted;
      continue;
    }
    argv_bytes += a.size();
    argv.push_back(a);
  }
  json out = {{"taskId", s.task_id},
              {"label", s.label},
              {"argv", std::move(argv)},
              {"cwd", s.cwd},
              {"state", s.state},
              {"settled", s.settled()},
              {"exitCode", s.exit_code ? json(*s.exit_code) : json(nullptr)},
              {"signal", s.signal ? json(*s.signal) : json(nullptr)},
              {"startedAt", s.started_at},
              {"endedAt", s.ended_at.empty() ? json(nullptr) : json(s.ended_at)},
              {"durationMs", s.duration_ms},
              {"stdoutBytes", s.stdout_bytes},
              {"stderrBytes", s.stderr_bytes},
              {"pty", s.pty},
              {"stdoutArtifact", artifact(s.stdout_artifact)},
              {"stderrArtifact", artifact(s.stderr_artifact)},
              {"tail", s.tail_preview},
              {"message", s.error},
              {"usage",
               {{"peakMemoryBytes", s.usage.peak_memory_bytes},
                {"cpuTimeUs", s.usage.cpu_usec},
                {"oomKills", s.usage.oom_kills},
                {"pidsLimitHits", s.usage.pids_max_hits}}}};
  if (omitted > 0) {
    out["argvOmitted"] = omitted;
  }
  if (s.pty) {
    out["cols"] = s.cols;
    out["rows"] = s.rows;
  }
  return out;
}

const std::vector<Tool>& tool_table() {
  static const std::vector<Tool> table = build_table();
  return table;
}

const Tool* find_tool(std::string_view name) {
  for (const auto& t : tool_table()) {
    if (t.name == name) {
      return &t;
    }
  }
  return nullptr;
}

namespace {

// Adds the counters and decides isError, for every answer a tool gives.
ToolResult finish_result(Engine& engine, const std::string& session, json structured) {
  ToolResult r;
  r.structured = std::move(structured);
  Counters c = engine.counters(session);
  r.structured["running"] = c.running;
  r.structured["finished"] = c.finished;
  if (auto e = r.structured.find("error"); e != r.structured.end()) {
    r.is_error = true;
    r.text = (*e)["message"].get<std::string>();
  } else if (r.structured.value("state", "") == "failed") {
    // It could not start, or its output could not be kept: an error the caller must act on.
    // The engine's message says which, whole ("the command could not start: …", "the engine
    // could not keep the output: …"); a prefix here once doubled it.
    r.is_error = true;
    r.text = r.structured.value("message", std::string());
    if (r.text.empty()) r.text = "the command failed (the engine gave no detail)";
  }
  return r;
}

}  // namespace

ToolResult call_tool(Engine& engine, const Tool& tool, const std::string& session,
                     const json& args_in, const CallContext& ctx) {
  ToolResult r;
  json args = args_in.is_null() ? json::object() : args_in;
  auto issues = validate_schema(tool.input_schema, args);
  if (!issues.empty()) {
    r.structured = {{"error",
                     {{"code", "invalid-arguments"},
                      {"message", fmt::format("invalid arguments for {}: {}. See the tool's "
                                              "inputSchema.",
                                              tool.name, describe_issues(issues))}}}};
  } else {
    // The handlers read arguments the schema already checked; nlohmann throws only on a
    // type mismatch, so a throw here is a schema/handler disagreement (a bug) and is reported
    // as an internal error rather than taking the server down.
    try {
      r.structured = tool.handle(engine, session, args, ctx);
    } catch (const std::exception& e) {
      r.structured = {
          {"error",
           {{"code", "internal"},
            {"message", fmt::format("cordon failed handling {}: {}", tool.name, e.what())}}}};
    }
  }
  return finish_result(engine, session, std::move(r.structured));
}

ToolResult settled_result(Engine& engine, const Tool& tool, const std::string& session,
                          const std::string& task_id, const CallContext& ctx) {
  // A task lives as long as its command: no bound but the caller's cancel.
  constexpr milliseconds kForever(std::chrono::hours(24 * 365));
  JobStatus st;
  CallContext quiet{.cancelled = ctx.cancelled, .progress = {}};
  if (auto err = await_status(engine, session, task_id, kForever, quiet, st)) {
    return finish_result(engine, session, std::move(*err));
  }
  if (st.settled() && tool.name == "run_command") {
    return finish_result(engine, session, settled_with_output(engine, session, st));
  }
  return finish_result(engine, session, status_json(st));
}

}  // namespace cordon::api
