#include "api/mcp.hpp"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "api/jsonrpc.hpp"
#include "api/tools.hpp"

namespace cordon::api {
namespace {

using json = nlohmann::json;
namespace rpc = jsonrpc;

constexpr const char* kJobUriPrefix = "cordon://jobs/";
constexpr size_t kSettleTailChars = 400;

// RFC 5424 severities as MCP names them, least severe first.
const std::vector<std::string> kLogLevels = {"debug", "info",     "notice", "warning",
                                             "error", "critical", "alert",  "emergency"};

bool has_structured_content(const std::string& version) {
  return version >= "2025-06-18";  // ISO dates compare as strings
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string tail_chars(const std::string& s, size_t n) {
  if (s.size() <= n) {
    return s;
  }
  size_t from = s.size() - n;
  // Do not start inside a UTF-8 sequence.
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) {
    ++from;
  }
  return "..." + s.substr(from);
}

class Server {
 public:
  Server(std::shared_ptr<Engine> engine, const McpOptions& o, std::shared_ptr<spdlog::logger> log)
      : engine_(std::move(engine)),
        session_(o.session),
        out_fd_(o.out_fd),
        max_calls_(o.max_calls),
        log_(std::move(log)),
        rpc_([this](const json& m) { send(m); }) {
    register_methods();
  }

  int serve(int in_fd, const ConnectionLimits& limits = {}, const std::string& first_line = {}) {
    watcher_ = std::thread([this] { watch_loop(); });
    rpc::LineSplitter lines;
    if (!first_line.empty()) {
      rpc_.handle_line(first_line);
    }
    char buf[65536];
    using Clock = std::chrono::steady_clock;
    auto last_input = Clock::now();
    int code = 0;
    for (;;) {
      if (output_broken()) {
        log_->warn("closing: the client stopped reading its answers");
        code = 1;
        break;
      }
      if (limits.idle_timeout.count() > 0 || limits.stall_timeout.count() > 0) {
        // Wake at least once a second: a call that ends does not wake poll().
        struct pollfd p {
          in_fd, POLLIN, 0
        };
        int r = ::poll(&p, 1, 1000);
        if (r < 0 && errno != EINTR) {
          log_->error("poll: {}", errno_name(errno));
          break;
        }
        if (r <= 0) {
          reap_calls(false);
          auto still = Clock::now() - last_input;
          if (lines.pending() && limits.stall_timeout.count() > 0 &&
              still >= limits.stall_timeout) {
            log_->warn("closing: a request line stalled for {} ms unfinished",
                       limits.stall_timeout.count());
            code = 1;
            break;
          }
          if (!lines.pending() && limits.idle_timeout.count() > 0 && still >= limits.idle_timeout &&
              live_calls() == 0) {
            log_->info("closing: idle for {} ms", limits.idle_timeout.count());
            code = 1;
            break;
          }
          continue;
        }
      }
      ssize_t n = ::read(in_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0) {
        log_->error("read: {}", errno_name(errno));
        break;
      }
      last_input = Clock::now();
      if (n == 0) {
        for (auto& l : lines.finish()) {
          rpc_.handle_line(l.text);
        }
        break;
      }
      for (auto& l : lines.feed(std::string_view(buf, static_cast<size_t>(n)))) {
        if (l.overlong) {
          log_->warn("discarded a line longer than {} bytes", rpc::kMaxLineBytes);
          rpc_.handle_overlong(rpc::kMaxLineBytes);
        } else {
          rpc_.handle_line(l.text);
        }
      }
      reap_calls(false);
    }
    log_->info("input closed: ending this server (and, standalone, its running commands)");
    shutdown();
    return code;
  }

 private:
  struct Call {
    json id;
    std::string tool;
    std::atomic<bool> cancelled{false};
    std::atomic<bool> done{false};
    std::thread thread;
  };

  // ---- output ---------------------------------------------------------------------------------
  void send(const json& message) {
    std::string line = dump(message) + "\n";
    std::lock_guard<std::mutex> lock(out_mu_);
    if (out_broken_) {
      return;
    }
    size_t off = 0;
    while (off < line.size()) {
      ssize_t n = ::write(out_fd_, line.data() + off, line.size() - off);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        log_->error("write stdout: {}; no more messages can be sent", errno_name(errno));
        out_broken_ = true;
        return;
      }
      off += static_cast<size_t>(n);
    }
  }

  void notify(const std::string& method, json params) {
    if (!initialized_.load()) {
      return;  // nothing is sent before the client said initialize
    }
    send(rpc::make_notification(method, std::move(params)));
  }

  void log_to_client(const std::string& level, json data) {
    size_t want = 0, min = min_level_.load();
    for (size_t i = 0; i < kLogLevels.size(); ++i) {
      if (kLogLevels[i] == level) {
        want = i;
      }
    }
    if (want < min) {
      return;
    }
    notify("notifications/message",
           {{"level", level}, {"logger", "cordon"}, {"data", std::move(data)}});
  }

  // ---- methods --------------------------------------------------------------------------------
  static void invalid_params(const rpc::Request& r, const rpc::Reply& reply,
                             const std::string& message) {
    reply(rpc::make_error(r.id, rpc::kInvalidParams, "Invalid params: " + message));
  }

  void register_methods() {
    rpc_.on("initialize", [this](const rpc::Request& r, rpc::Reply reply) {
      if (!r.params.is_object() || !r.params.contains("protocolVersion") ||
          !r.params["protocolVersion"].is_string()) {
        return invalid_params(r, reply, "`/protocolVersion` must be a string");
      }
      std::string asked = r.params["protocolVersion"].get<std::string>();
      std::string chosen = kMcpVersions[0];
      for (const char* v : kMcpVersions) {
        if (asked == v) {
          chosen = v;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        version_ = chosen;
      }
      // Batches exist in JSON-RPC 2.0 and MCP up to 2025-03-26; 2025-06-18 removed them.
      rpc_.set_allow_batch(!has_structured_content(chosen));
      initialized_ = true;
      std::string client = r.params.contains("clientInfo") && r.params["clientInfo"].is_object()
                               ? dump(r.params["clientInfo"])
                               : "(unnamed)";
      log_->info("initialize: client {} asked for {}, speaking {}", client, asked, chosen);
      reply(rpc::make_result(
          r.id,
          {{"protocolVersion", chosen},
           {"capabilities",
            {{"tools", {{"listChanged", false}}},
             {"logging", json::object()},
             {"resources", {{"subscribe", true}, {"listChanged", true}}}}},
           {"serverInfo", {{"name", "cordon"}, {"title", "cordon sandbox"}, {"version", "0.1.0"}}},
           {"instructions",
            "cordon runs commands in a kernel-enforced sandbox, with NO shell: argv arrays of an "
            "allowed absolute program path and its arguments. run_command waits up to yieldMs "
            "and otherwise hands back a taskId; run_command_bg returns one at once. Follow "
            "jobs with command_wait / command_status / command_output; every byte printed is "
            "kept and pageable. Every result carries `running` and `finished` counters."}}));
    });
    rpc_.on("ping", [](const rpc::Request& r, rpc::Reply reply) {
      reply(rpc::make_result(r.id, json::object()));
    });
    rpc_.on("logging/setLevel", [this](const rpc::Request& r, rpc::Reply reply) {
      // json::value() throws on a type mismatch; a numeric level is a bad param, not a crash.
      std::string level;
      if (r.params.is_object() && r.params.contains("level") && r.params["level"].is_string()) {
        level = r.params["level"].get<std::string>();
      }
      for (size_t i = 0; i < kLogLevels.size(); ++i) {
        if (kLogLevels[i] == level) {
          min_level_ = i;
          return reply(rpc::make_result(r.id, json::object()));
        }
      }
      invalid_params(r, reply,
                     fmt::format("`/level` must be one of {}", fmt::join(kLogLevels, ", ")));
    });
    rpc_.on("tools/list", [this](const rpc::Request& r, rpc::Reply reply) {
      bool structured = has_structured_content(version());
      json tools = json::array();
      for (const auto& t : tool_table()) {
        json j = {{"name", t.name},
                  {"title", t.title},
                  {"description", t.description},
                  {"inputSchema", t.input_schema},
                  {"annotations", t.annotations}};
        if (structured) {
          j["outputSchema"] = t.output_schema;
        }
        tools.push_back(std::move(j));
      }
      reply(rpc::make_result(r.id, {{"tools", tools}}));
    });
    rpc_.on("tools/call",
            [this](const rpc::Request& r, rpc::Reply reply) { start_call(r, reply); });
    rpc_.on("resources/list", [this](const rpc::Request& r, rpc::Reply reply) {
      auto jobs = engine_->list(session_, std::nullopt);
      if (!jobs) {
        return reply(rpc::make_error(r.id, rpc::kInternalError, jobs.error().message()));
      }
      json list = json::array();
      for (const auto& s : *jobs) {
        list.push_back(
            {{"uri", kJobUriPrefix + s.task_id},
             {"name", s.task_id},
             {"title", s.label.empty() ? fmt::format("{}", fmt::join(s.argv, " ")) : s.label},
             {"description", fmt::format("{} ({})", fmt::join(s.argv, " "), s.state)},
             {"mimeType", "application/json"}});
      }
      reply(rpc::make_result(r.id, {{"resources", list}}));
    });
    rpc_.on("resources/templates/list", [](const rpc::Request& r, rpc::Reply reply) {
      reply(rpc::make_result(
          r.id, {{"resourceTemplates",
                  {{{"uriTemplate", std::string(kJobUriPrefix) + "{taskId}"},
                    {"name", "job"},
                    {"description", "A command's status as JSON (the same as command_status)."},
                    {"mimeType", "application/json"}}}}}));
    });
    rpc_.on("resources/read", [this](const rpc::Request& r, rpc::Reply reply) {
      auto id = job_of_uri(r, reply);
      if (!id) {
        return;
      }
      // Looked up by listing: reading a resource is not reading the job, so the `finished`
      // counter stays for the agent's own command_status.
      auto jobs = engine_->list(session_, std::nullopt);
      if (jobs) {
        for (const auto& s : *jobs) {
          if (s.task_id == *id) {
            return reply(rpc::make_result(r.id, {{"contents",
                                                  {{{"uri", kJobUriPrefix + *id},
                                                    {"mimeType", "application/json"},
                                                    {"text", dump(status_json(s))}}}}}));
          }
        }
      }
      reply(rpc::make_error(r.id, rpc::kResourceNotFound,
                            fmt::format("Resource not found: no job `{}` in this session", *id),
                            {{"uri", r.params["uri"]}}));
    });
    rpc_.on("resources/subscribe", [this](const rpc::Request& r, rpc::Reply reply) {
      if (job_of_uri(r, reply)) {
        std::lock_guard<std::mutex> lock(mu_);
        subscribed_.insert(r.params["uri"].get<std::string>());
        reply(rpc::make_result(r.id, json::object()));
      }
    });
    rpc_.on("resources/unsubscribe", [this](const rpc::Request& r, rpc::Reply reply) {
      if (job_of_uri(r, reply)) {
        std::lock_guard<std::mutex> lock(mu_);
        subscribed_.erase(r.params["uri"].get<std::string>());
        reply(rpc::make_result(r.id, json::object()));
      }
    });
    rpc_.on_notification("notifications/initialized",
                         [this](const rpc::Request&) { log_->info("client initialized"); });
    rpc_.on_notification("notifications/cancelled", [this](const rpc::Request& r) {
      if (!r.params.is_object() || !r.params.contains("requestId")) {
        return;
      }
      json target = r.params["requestId"];
      // Any JSON may come as the reason; json::value() would throw on a non-string one.
      std::string reason = r.params.contains("reason") && r.params["reason"].is_string()
                               ? r.params["reason"].get<std::string>()
                               : std::string("no reason given");
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : calls_) {
        if (c->id == target && !c->done) {
          c->cancelled = true;
          log_->info("request {} ({}) cancelled by the client: {}", dump(target), c->tool, reason);
        }
      }
    });
  }

  std::optional<std::string> job_of_uri(const rpc::Request& r, const rpc::Reply& reply) {
    if (!r.params.is_object() || !r.params.contains("uri") || !r.params["uri"].is_string()) {
      invalid_params(r, reply, "`/uri` must be a string");
      return std::nullopt;
    }
    std::string uri = r.params["uri"].get<std::string>();
    if (uri.rfind(kJobUriPrefix, 0) != 0 || uri.size() == std::string(kJobUriPrefix).size()) {
      reply(rpc::make_error(
          r.id, rpc::kResourceNotFound,
          fmt::format("Resource not found: `{}`; job resources are {}<taskId>", uri, kJobUriPrefix),
          {{"uri", uri}}));
      return std::nullopt;
    }
    return uri.substr(std::string(kJobUriPrefix).size());
  }

  std::string version() {
    std::lock_guard<std::mutex> lock(mu_);
    return version_;
  }

  // ---- tool calls -----------------------------------------------------------------------------
  void start_call(const rpc::Request& r, const rpc::Reply& reply) {
    if (!r.params.is_object() || !r.params.contains("name") || !r.params["name"].is_string()) {
      return invalid_params(r, reply, "`/name` must be a string");
    }
    std::string name = r.params["name"].get<std::string>();
    const Tool* tool = find_tool(name);
    if (tool == nullptr) {
      std::vector<std::string> names;
      for (const auto& t : tool_table()) {
        names.push_back(t.name);
      }
      return invalid_params(
          r, reply,
          fmt::format("Unknown tool `{}`; the tools are {}", name, fmt::join(names, ", ")));
    }
    json args = r.params.contains("arguments") ? r.params["arguments"] : json::object();
    if (!args.is_object()) {
      return invalid_params(r, reply, "`/arguments` must be an object");
    }
    json token;
    if (auto m = r.params.find("_meta"); m != r.params.end() && m->is_object()) {
      if (auto t = m->find("progressToken");
          t != m->end() && (t->is_string() || t->is_number_integer())) {
        token = *t;
      }
    }
    auto call = std::make_shared<Call>();
    call->id = r.id;
    call->tool = name;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t live = 0;
      for (const auto& c : calls_) {
        if (!c->done) {
          ++live;
          if (c->id == r.id) {
            return reply(rpc::make_error(r.id, rpc::kInvalidRequest,
                                         "Invalid Request: this id is already in use by a "
                                         "request in flight"));
          }
        }
      }
      if (live >= max_calls_) {
        return reply(rpc::make_error(
            r.id, rpc::kServerBusy,
            fmt::format("{} tool calls are already in flight (the limit); wait for one to finish "
                        "or cancel one",
                        live)));
      }
      calls_.push_back(call);
    }
    call->thread = std::thread([this, call, tool, args, token, reply] {
      run_call(*call, *tool, args, token, reply);
      call->done = true;
    });
  }

  void run_call(Call& call, const Tool& tool, const json& args, const json& token,
                const rpc::Reply& reply) {
    auto t0 = std::chrono::steady_clock::now();
    CallContext ctx;
    ctx.cancelled = [this, &call] { return call.cancelled.load() || shutting_down_.load(); };
    if (!token.is_null()) {
      ctx.progress = [this, token](uint64_t waited, uint64_t total, const std::string& message) {
        notify("notifications/progress", {{"progressToken", token},
                                          {"progress", waited},
                                          {"total", total},
                                          {"message", message}});
      };
    }
    ToolResult res = call_tool(*engine_, tool, session_, args, ctx);
    if (call.cancelled) {
      // The client asked us not to answer (MCP: no response to a cancelled request).
      log_->info("request {} cancelled: its wait ended after {} ms; no response sent",
                 dump(call.id),
                 std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
      return;
    }
    // A job left running is watched, so its settling can be announced.
    const json& s = res.structured;
    if (s.contains("taskId") && s.contains("state") && s["state"].is_string() &&
        (s["state"] == "running" || s["state"] == "queued")) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        watched_.insert(s["taskId"].get<std::string>());
      }
      watch_cv_.notify_all();
    }
    if (tool.name == "run_command" || tool.name == "run_command_bg" ||
        (tool.name == "command_remove" && !res.is_error)) {
      notify("notifications/resources/list_changed", nullptr);
    }
    json content = json::array();
    if (res.is_error) {
      content.push_back({{"type", "text"}, {"text", res.text}});
    }
    content.push_back({{"type", "text"}, {"text", dump(res.structured)}});
    json result = {{"content", content}, {"isError", res.is_error}};
    if (has_structured_content(version())) {
      result["structuredContent"] = res.structured;
    }
    reply(rpc::make_result(call.id, std::move(result)));
  }

  size_t live_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t live = 0;
    for (const auto& c : calls_) {
      live += c->done ? 0 : 1;
    }
    return live;
  }

  bool output_broken() {
    std::lock_guard<std::mutex> lock(out_mu_);
    return out_broken_;
  }

  void reap_calls(bool all) {
    std::list<std::shared_ptr<Call>> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = calls_.begin(); it != calls_.end();) {
        if (all || (*it)->done) {
          finished.push_back(*it);
          it = calls_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& c : finished) {
      if (c->thread.joinable()) {
        c->thread.join();
      }
    }
  }

  // ---- settle announcements -------------------------------------------------------------------
  // The engine has no settle callback; a job this server left running is looked up by
  // listing (which, unlike status, does not mark it read) twice a second while any is watched.
  void watch_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (watched_.empty()) {
        watch_cv_.wait(lock, [this] { return stopping_ || !watched_.empty(); });
        continue;
      }
      watch_cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; });
      if (stopping_) {
        break;
      }
      std::set<std::string> ids = watched_;
      lock.unlock();
      auto jobs = engine_->list(session_, std::nullopt);
      std::vector<JobStatus> settled;
      std::set<std::string> gone = ids;
      if (jobs) {
        for (const auto& s : *jobs) {
          if (ids.contains(s.task_id)) {
            gone.erase(s.task_id);
            if (s.settled()) {
              settled.push_back(s);
            }
          }
        }
      }
      for (const auto& s : settled) {
        announce(s);
      }
      lock.lock();
      for (const auto& s : settled) {
        watched_.erase(s.task_id);
      }
      for (const auto& id : gone) {
        watched_.erase(id);  // removed meanwhile
      }
    }
  }

  void announce(const JobStatus& s) {
    bool clean = s.state == "exited" && s.exit_code.value_or(1) == 0;
    log_to_client(clean ? "info" : "warning",
                  {{"event", "command-settled"},
                   {"taskId", s.task_id},
                   {"state", s.state},
                   {"exitCode", s.exit_code ? json(*s.exit_code) : json(nullptr)},
                   {"signal", s.signal ? json(*s.signal) : json(nullptr)},
                   {"tail", tail_chars(s.tail_preview, kSettleTailChars)},
                   {"hint", fmt::format("command_status {{\"taskId\": \"{}\"}} or command_output "
                                        "for the full result",
                                        s.task_id)}});
    std::string uri = kJobUriPrefix + s.task_id;
    bool subscribed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      subscribed = subscribed_.contains(uri);
    }
    if (subscribed) {
      notify("notifications/resources/updated", {{"uri", uri}});
    }
  }

  void shutdown() {
    // Waits end now; calls still answer (best effort) if the client reads on after closing
    // its side.
    shutting_down_ = true;
    reap_calls(true);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watcher_.joinable()) {
      watcher_.join();
    }
    engine_.reset();  // kills every running sandbox
  }

  // Shared with the daemon, which serves every connection on one engine; standalone, this
  // is the only owner and its reset() at EOF kills every running sandbox.
  std::shared_ptr<Engine> engine_;
  std::string session_;
  int out_fd_;
  size_t max_calls_;
  std::shared_ptr<spdlog::logger> log_;
  rpc::Dispatcher rpc_;

  std::mutex out_mu_;
  bool out_broken_ = false;

  std::mutex mu_;  // guards what follows
  std::string version_ = kMcpVersions[0];
  std::list<std::shared_ptr<Call>> calls_;
  std::set<std::string> watched_, subscribed_;
  bool stopping_ = false;
  std::condition_variable watch_cv_;

  std::atomic<bool> initialized_{false}, shutting_down_{false};
  std::atomic<size_t> min_level_{1};  // info
  std::thread watcher_;
};

}  // namespace

int run_mcp_server(const McpOptions& options) {
  auto log = spdlog::get("mcp");
  if (!log) {
    log = spdlog::stderr_logger_mt("mcp");
  }
  // Anything else that logs through spdlog goes to stderr too: stdout is the protocol's.
  spdlog::set_default_logger(log);
  auto engine = Engine::open(options.engine);
  if (!engine) {
    log->error("cannot start: {}", engine.error().message());
    return 1;
  }
  log->info("serving MCP on stdio; session `{}`, state dir `{}`", options.session,
            options.engine.state_dir);
  Server server(std::shared_ptr<Engine>(std::move(*engine)), options, log);
  return server.serve(options.in_fd);
}

int serve_mcp_connection(std::shared_ptr<Engine> engine, const std::string& session, int in_fd,
                         int out_fd, const ConnectionLimits& limits,
                         const std::string& first_line) {
  auto log = spdlog::get("mcp");
  if (!log) {
    log = spdlog::stderr_logger_mt("mcp");
  }
  McpOptions o;
  o.session = session;
  o.in_fd = in_fd;
  o.out_fd = out_fd;
  o.max_calls = limits.max_calls;
  Server server(std::move(engine), o, log);
  return server.serve(in_fd, limits, first_line);
}

}  // namespace cordon::api
