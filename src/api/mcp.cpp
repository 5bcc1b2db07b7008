#include "api/mcp.hpp"

#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/json_fields.hpp"
#include "base/log.hpp"
#include "base/strings.hpp"
#include "api/jsonrpc.hpp"
#include "api/schema.hpp"
#include "api/tools.hpp"

namespace cordon::api {
namespace {

using json = nlohmann::json;
namespace rpc = jsonrpc;

constexpr const char* kJobUriPrefix = "cordon://jobs/";
constexpr size_t kSettleTailChars = 400;
// MCP tasks (2025-11-25, experimental).
constexpr const char* kTasksVersion = "2025-11-25";
constexpr const char* kRelatedTaskKey = "io.modelcontextprotocol/related-task";
constexpr const char* kImmediateResponseKey = "io.modelcontextprotocol/model-immediate-response";
constexpr uint64_t kTaskPollMs = 500;
constexpr size_t kTaskPage = 100;       // tasks/list page size
constexpr size_t kRecentSettled = 256;  // settles remembered for a watch that comes late
constexpr size_t kMaxRefusedTasks = 256;
// Bounds on what a client makes the server keep. Failure fixed: resources/subscribe stored any
// URI of any size, unchecked, without limit (40 URIs of 8 MiB took a daemon from 6 to 383 MB),
// and each refused task kept its whole refusal, which echoes the argv (4 MiB × 256 records).
constexpr size_t kMaxSubscriptions = 1024;  // per connection
constexpr size_t kMaxProgressToken = 256;   // bytes of a string progressToken
constexpr size_t kMaxUriBytes = 512;        // a job's URI is the prefix and a short id
constexpr size_t kMaxKeptTextBytes = 4096;  // per string of a refused task's stored record

// Cuts every string in `j` longer than `max` bytes (at a UTF-8 boundary) and marks the cut.
void clip_strings(json& j, size_t max) {
  if (j.is_string()) {
    auto& s = j.get_ref<std::string&>();
    if (s.size() > max) {
      size_t cut = max;
      while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) {
        --cut;
      }
      s.resize(cut);
      s += "\u2026";
    }
  } else if (j.is_structured()) {
    for (auto& v : j) {
      clip_strings(v, max);
    }
  }
}

// RFC 5424 severities as MCP names them, least severe first.
const std::vector<std::string> kLogLevels = {"debug", "info",     "notice", "warning",
                                             "error", "critical", "alert",  "emergency"};

bool has_structured_content(const std::string& version) {
  return version >= "2025-06-18";  // ISO dates compare as strings
}

bool has_tasks(const std::string& version) { return version >= kTasksVersion; }

// The tools whose call can be a task: the ones that start a command.
bool task_tool(const std::string& name) {
  return name == "run_command" || name == "run_command_bg";
}

std::string dump(const json& j) { return json_fields::dump(j); }

// The threads that run tool calls, kept for the next call (session 24). A thread made for
// every call cost its clone3 and, since glibc gives a finished thread's stack pages back, the
// page faults of its stack again on the next call: dear where a fault costs ~20 µs (this
// project's CI guest). No more threads than the server's bound on calls in flight; one idle
// for kIdleExit ends (and is joined at the server's next read or its once-a-second check).
class CallWorkers {
 public:
  static constexpr std::chrono::seconds kIdleExit{10};

  // `max`: the server's bound on calls in flight; no more workers are made.
  explicit CallWorkers(size_t max) : max_(max == 0 ? 1 : max) {}
  CallWorkers(const CallWorkers&) = delete;
  CallWorkers& operator=(const CallWorkers&) = delete;
  ~CallWorkers() { stop(); }

  // Runs `body` on an idle worker, or on a new one when none is free. Throws std::system_error
  // when a needed thread cannot be made (EAGAIN: RLIMIT_NPROC, the cgroup's pids limit); then
  // `body` is not run.
  void run(std::function<void()> body) {
    std::unique_lock<std::mutex> lock(mu_);
    join_retired(lock);
    queue_.push_back(std::move(body));
    // Each idle worker takes one queued body. At `max` workers, one is idle or about to be: the
    // server lets a call in only when fewer than `max` are in flight, and a call counts as
    // done a moment before its worker is free again (a new worker then would pile threads up).
    if (queue_.size() <= idle_ || threads_.size() >= max_) {
      cv_.notify_one();
      return;
    }
    try {
      threads_.emplace_back([this] { work(); });
    } catch (...) {
      queue_.pop_back();
      throw;
    }
  }

  // Waits for every body queued and running, then for every worker to end.
  void stop() {
    std::list<std::thread> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      all.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : all) {
      if (t.joinable()) {
        t.join();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    retired_.clear();  // ids of the threads just joined
  }

  // Joins the workers that ended idle (their stacks go with them).
  void reap() {
    std::unique_lock<std::mutex> lock(mu_);
    join_retired(lock);
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (queue_.empty()) {
        if (stopping_) {
          break;
        }
        ++idle_;
        bool got = cv_.wait_for(lock, kIdleExit, [this] { return stopping_ || !queue_.empty(); });
        --idle_;
        if (!got) {
          break;  // idle for kIdleExit
        }
        continue;
      }
      std::function<void()> body = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      body();
      body = nullptr;  // its captures go before the lock is taken again
      lock.lock();
    }
    retired_.push_back(std::this_thread::get_id());
  }

  // Joins the workers that ended (each has left work(), or is about to return from it).
  void join_retired(std::unique_lock<std::mutex>& lock) {
    if (retired_.empty()) {
      return;
    }
    std::list<std::thread> ended;
    for (auto id : retired_) {
      for (auto it = threads_.begin(); it != threads_.end(); ++it) {
        if (it->get_id() == id) {
          ended.splice(ended.end(), threads_, it);
          break;
        }
      }
    }
    retired_.clear();
    lock.unlock();
    for (auto& t : ended) {
      t.join();
    }
    lock.lock();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::list<std::thread> threads_;
  std::vector<std::thread::id> retired_;
  const size_t max_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

// The last `n` characters of UTF-8 text (the tail preview is sanitized), "..." before them when
// some were cut. Failure fixed (a review, session 31): it kept the last n bytes, a third of
// the characters for text like "€€€".
std::string tail_chars(const std::string& s, size_t n) {
  size_t from = s.size(), count = 0;
  while (from > 0 && count < n) {
    --from;
    if ((static_cast<unsigned char>(s[from]) & 0xC0) != 0x80) {
      ++count;
    }
  }
  return from == 0 ? s : "..." + s.substr(from);
}

class Server {
 public:
  Server(std::shared_ptr<Engine> engine, const McpOptions& o, std::shared_ptr<log::Logger> log)
      : engine_(std::move(engine)),
        session_(o.session),
        out_fd_(o.out_fd),
        max_calls_(o.max_calls),
        uid_calls_(o.uid_calls),
        log_(std::move(log)),
        rpc_([this](const json& m) { send(m); }) {
    register_methods();
    // Called by the engine with its lock held: only queue the status for the watcher.
    settle_sub_ = engine_->subscribe_settled([this](const JobStatus& s) {
      if (s.session != session_) {
        return;
      }
      {
        std::lock_guard<std::mutex> lock(settle_mu_);
        settle_queue_.push_back(s);
      }
      watch_cv_.notify_all();
    });
  }

  ~Server() { unsubscribe(); }

  int serve(int in_fd, const ConnectionLimits& limits = {}, const std::string& first_line = {}) {
    try {
      watcher_ = std::thread([this] { watch_loop(); });
    } catch (const std::system_error& e) {  // EAGAIN: no thread to be had (run_on_worker)
      log_->error("closing: no thread for the connection's watcher ({})", e.code().message());
      return 1;
    }
    rpc::LineSplitter lines;
    if (!first_line.empty()) {
      rpc_.handle_line(first_line);
    }
    char buf[65536];
    using Clock = std::chrono::steady_clock;
    // Both limits are per line, not per byte. Failure fixed: every read reset one clock, so a
    // client trickling a byte every few seconds never stalled, and one sending a bare "\n"
    // now and then was never idle. `line_began`: when the unfinished line's first byte came;
    // `last_request`: when the last line with content ended (or a call was in flight).
    auto line_began = Clock::now(), last_request = Clock::now();
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
        reap_calls(false);
        const auto now = Clock::now();
        if (live_calls() > 0) {
          last_request = now;  // a call in flight is not idleness
        }
        if (lines.pending() && limits.stall_timeout.count() > 0 &&
            now - line_began >= limits.stall_timeout) {
          log_->warn("closing: a request line stalled for {} ms unfinished",
                     limits.stall_timeout.count());
          code = 1;
          break;
        }
        if (!lines.pending() && limits.idle_timeout.count() > 0 &&
            now - last_request >= limits.idle_timeout) {
          log_->info("closing: idle for {} ms", limits.idle_timeout.count());
          code = 1;
          break;
        }
        if (r <= 0) {
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
      if (n == 0) {
        for (auto& l : lines.finish()) {
          rpc_.handle_line(l.text);
        }
        break;
      }
      const bool was_pending = lines.pending();
      const auto now = Clock::now();
      bool ended = false;
      for (auto& l : lines.feed(std::string_view(buf, static_cast<size_t>(n)))) {
        ended = true;
        if (l.overlong) {
          last_request = now;
          log_->warn("discarded a line longer than {} bytes", rpc::kMaxLineBytes);
          rpc_.handle_overlong(rpc::kMaxLineBytes);
        } else {
          if (l.text.find_first_not_of(" \t\r") != std::string::npos) {
            last_request = now;
          }
          rpc_.handle_line(l.text);
        }
      }
      if (lines.pending() && (!was_pending || ended)) {
        line_began = now;  // a new line began in these bytes
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
    std::string tool;  // the tool's name, or the method (tasks/result)
    std::atomic<bool> cancelled{false};
    std::atomic<bool> done{false};
    // Its response is going out: the id is the client's to reuse (run_on_worker), though the
    // call still counts as in flight until the response is written.
    std::atomic<bool> id_released{false};
    std::shared_ptr<CallBudget> budget;     // the uid's slot this call holds, given back at done
    std::shared_ptr<rpc::BatchHold> batch;  // a batch member's: its response waits for the rest
    // Marks the call done and gives its uid's slot back (once).
    void finish() {
      if (!done.exchange(true) && budget) {
        budget->in_flight.fetch_sub(1);
      }
    }
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
      json capabilities = {{"tools", {{"listChanged", false}}},
                           {"logging", json::object()},
                           {"resources", {{"subscribe", true}, {"listChanged", true}}}};
      if (has_tasks(chosen)) {
        capabilities["tasks"] = {{"list", json::object()},
                                 {"cancel", json::object()},
                                 {"requests", {{"tools", {{"call", json::object()}}}}}};
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
           {"capabilities", capabilities},
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
      std::string v = version();
      bool structured = has_structured_content(v);
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
        if (has_tasks(v)) {
          j["execution"] = {{"taskSupport", task_tool(t.name) ? "optional" : "forbidden"}};
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
      if (r.params.is_object() && r.params.contains("uri") && r.params["uri"].is_string() &&
          r.params["uri"].get_ref<const std::string&>().size() > kMaxUriBytes) {
        return invalid_params(
            r, reply,
            fmt::format("`/uri` is {} bytes; a job's URI ({}<taskId>) is at most {}",
                        r.params["uri"].get_ref<const std::string&>().size(), kJobUriPrefix,
                        kMaxUriBytes));
      }
      auto id = job_of_uri(r, reply);
      if (!id) {
        return;
      }
      if (!in_session(*id)) {
        return reply(
            rpc::make_error(r.id, rpc::kResourceNotFound,
                            fmt::format("Resource not found: no job `{}` in this session", *id),
                            {{"uri", r.params["uri"]}}));
      }
      std::lock_guard<std::mutex> lock(mu_);
      const std::string uri = r.params["uri"].get<std::string>();
      if (!subscribed_.contains(uri) && subscribed_.size() >= kMaxSubscriptions) {
        return invalid_params(r, reply,
                              fmt::format("this connection holds {} subscriptions, the most it "
                                          "may; unsubscribe from settled jobs first",
                                          subscribed_.size()));
      }
      subscribed_.insert(uri);
      reply(rpc::make_result(r.id, json::object()));
    });
    rpc_.on("resources/unsubscribe", [this](const rpc::Request& r, rpc::Reply reply) {
      if (job_of_uri(r, reply)) {
        std::lock_guard<std::mutex> lock(mu_);
        subscribed_.erase(r.params["uri"].get<std::string>());
        reply(rpc::make_result(r.id, json::object()));
      }
    });
    register_task_methods();
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
        if (c->id == target && !c->done && !c->id_released) {
          c->cancelled = true;
          // A cancelled call sends no response, so its id is free from now on (a review,
          // session 35: a reuse right after the cancel was refused as "in flight" ~0.1 s).
          c->id_released = true;
          // The client's text, on the operator's terminal: escaped (a review, session 35).
          log_->info("request {} ({}) cancelled by the client: {}", dump(target), c->tool,
                     escape_controls(reason));
        }
      }
    });
  }

  // Whether this session has the job. Its index of ids, not a listing: looking is not reading
  // it (`finished` stays), and no status or log tail is built for every job of the session.
  bool in_session(const std::string& id) {
    auto ids = engine_->known_ids(session_);
    return ids && std::find(ids->begin(), ids->end(), id) != ids->end();
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
  // Registers a request that answers on its own thread. Null (and the error sent) when the
  // id is in use or too many calls are in flight.
  std::shared_ptr<Call> begin_call(const rpc::Request& r, const rpc::Reply& reply,
                                   const std::string& what) {
    auto call = std::make_shared<Call>();
    call->id = r.id;
    call->tool = what;
    call->batch = r.batch;
    std::lock_guard<std::mutex> lock(mu_);
    size_t live = 0;
    for (const auto& c : calls_) {
      if (!c->done) {
        ++live;
        if (c->id == r.id && !c->id_released) {
          reply(rpc::make_error(r.id, rpc::kInvalidRequest,
                                "Invalid Request: this id is already in use by a request in "
                                "flight"));
          return nullptr;
        }
      }
    }
    if (live >= max_calls_) {
      reply(rpc::make_error(
          r.id, rpc::kServerBusy,
          fmt::format("{} requests are already in flight (the limit); wait for one to finish "
                      "or cancel one",
                      live)));
      return nullptr;
    }
    if (uid_calls_) {
      if (uid_calls_->in_flight.fetch_add(1) >= uid_calls_->max) {
        uid_calls_->in_flight.fetch_sub(1);
        reply(rpc::make_error(
            r.id, rpc::kServerBusy,
            fmt::format("your uid has {} requests in flight over its connections to this daemon "
                        "(daemon.maxCallsPerUid); wait for one to finish or cancel one",
                        uid_calls_->max)));
        return nullptr;
      }
      call->budget = uid_calls_;
    }
    calls_.push_back(call);
    return call;
  }

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
    // A task request is honoured only where the tasks capability was declared; an older
    // session's call is processed normally, as the spec asks.
    bool as_task = false;
    if (auto t = r.params.find("task"); t != r.params.end() && has_tasks(version())) {
      if (!t->is_object() ||
          (t->contains("ttl") && !(*t)["ttl"].is_number() && !(*t)["ttl"].is_null())) {
        return invalid_params(r, reply, "`/task` must be an object {ttl?: number}");
      }
      if (!task_tool(name)) {
        return reply(rpc::make_error(
            r.id, rpc::kMethodNotFound,
            fmt::format("Method not found: {} cannot run as a task (its execution.taskSupport "
                        "is forbidden); call it without `task`. run_command and run_command_bg "
                        "can.",
                        name)));
      }
      as_task = true;
    }
    json token;
    if (auto m = r.params.find("_meta"); m != r.params.end() && m->is_object()) {
      if (auto t = m->find("progressToken");
          t != m->end() && (t->is_string() || t->is_number_integer())) {
        // Sent back in every progress notification, once a second for as long as the call
        // waits: a 15 MB token made 32 waits send 3.3 GB in 12 s and keep both CPUs busy (a
        // red-team review, session 38).
        if (t->is_string() && t->get_ref<const std::string&>().size() > kMaxProgressToken) {
          return invalid_params(
              r, reply,
              fmt::format("`/_meta/progressToken` is longer than {} bytes; use a shorter token",
                          kMaxProgressToken));
        }
        token = *t;
      }
    }
    auto call = begin_call(r, reply, name);
    if (!call) {
      return;
    }
    run_on_worker(call, reply, [this, call, tool, args, token, as_task](const rpc::Reply& answer) {
      if (as_task) {
        run_task_call(*call, *tool, args, answer);
      } else {
        run_call(*call, *tool, args, token, answer);
      }
    });
  }

  // Runs a registered call's body on a worker thread (CallWorkers). The body answers through
  // `answer`, which releases the id before the response goes out: a client may reuse it as
  // soon as it has the response (JSON-RPC), and a reuse that came before the worker marked the
  // call done was refused as "in use" (16 of 300 in a review, session 34). The call stays in
  // flight, holding its uid's slot, until the response is written: a slow reader's replies
  // count against daemon.maxCallsPerUid (docs/reliability.md). A
  // thread the system refuses (EAGAIN: RLIMIT_NPROC, the pids limit of the daemon's cgroup)
  // ends the call with a busy error and frees its slot; std::thread's exception would end the
  // process. An exception out of the body (nothing cordon calls throws; bad_alloc could) ends
  // the call with an internal error rather than the daemon.
  void run_on_worker(const std::shared_ptr<Call>& call, const rpc::Reply& reply,
                     std::function<void(const rpc::Reply& answer)> body) {
    rpc::Reply answer = [call, reply](json response) {
      call->id_released = true;
      if (call->batch) {
        // Parked with the batch's other responses until the array is written: in flight
        // until then, as a single call's response is until it is written.
        call->batch->after_sent([call] { call->finish(); });
      }
      reply(std::move(response));
      if (!call->batch) {
        call->finish();
      }
    };
    try {
      workers_.run([call, answer, body = std::move(body)] {
        try {
          body(answer);
        } catch (const std::exception& e) {
          answer(rpc::make_error(call->id, rpc::kInternalError,
                                 fmt::format("internal error: {}", e.what())));
        }
        if (!call->id_released) {
          call->finish();  // a body that did not answer
        }
      });
    } catch (const std::system_error& e) {
      call->finish();
      reply(rpc::make_error(
          call->id, rpc::kServerBusy,
          fmt::format("no thread for this request ({}); retry once other requests finished",
                      e.code().message())));
    }
  }

  // A CallToolResult for this session's protocol version.
  json call_result(const ToolResult& res) {
    json content = json::array();
    if (res.is_error) {
      content.push_back({{"type", "text"}, {"text", res.text}});
    }
    content.push_back({{"type", "text"}, {"text", dump(res.structured)}});
    json result = {{"content", content}, {"isError", res.is_error}};
    if (has_structured_content(version())) {
      result["structuredContent"] = res.structured;
    }
    return result;
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
    const json& s = res.structured;
    const bool left_running = s.contains("taskId") && s["taskId"].is_string() &&
                              s.contains("state") && s["state"].is_string() &&
                              (s["state"] == "running" || s["state"] == "queued");
    if (call.cancelled) {
      // The client asked us not to answer (MCP: no response to a cancelled request).
      log_->info("request {} cancelled: its wait ended after {} ms; no response sent",
                 dump(call.id),
                 std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count());
      if (left_running) {
        // A run_command cancelled while its command runs: the answer that would have given
        // the task id is not sent, so it goes out on the logging channel, and the settle is
        // announced as for any job left running. Before (a review, session 40) the client
        // never learned the id of a command it had started.
        const std::string id = s["taskId"].get<std::string>();
        watch(id);
        log_to_client("warning",
                      {{"event", "call-cancelled"},
                       {"requestId", call.id},
                       {"taskId", id},
                       {"state", s["state"]},
                       {"hint", fmt::format("the cancel ended the wait, not the command: "
                                            "command_kill {{\"taskId\": \"{}\"}} stops it; "
                                            "command_wait waits for it",
                                            id)}});
      }
      return reply(nullptr);  // no response, but answered: a batch's others go out
    }
    if (left_running && shutting_down_.load()) {
      // The input closed: the server ends, and so does every job of its session.
      res.structured["hint"] =
          "the server is shutting down (its input closed): this command is being killed and "
          "will read `abandoned`";
    }
    // A job left running is watched, so its settling can be announced.
    if (left_running) {
      watch(s["taskId"].get<std::string>());
    }
    if (tool.name == "run_command" || tool.name == "run_command_bg" ||
        (tool.name == "command_remove" && !res.is_error)) {
      notify("notifications/resources/list_changed", nullptr);
    }
    reply(rpc::make_result(call.id, call_result(res)));
  }

  // ---- MCP tasks (2025-11-25) -----------------------------------------------------------------
  // A task is a cordon job: the task id is its taskId. A tools/call with `task` starts the
  // command as run_command_bg would and answers with the task at once; tasks/result answers
  // what the tool would have answered once the job settled. Every job of the session is a
  // task (tasks/list shows them all). A start that is refused gets a task of its own, already
  // failed, kept in memory, whose result is the refusal.
  struct TaskInfo {
    std::string tool;
    std::string created;
  };
  struct RefusedTask {
    json task;
    json result;  // the CallToolResult
  };

  void run_task_call(Call& call, const Tool& tool, const json& args, const rpc::Reply& reply) {
    std::string created = now_rfc3339();
    ToolResult res;
    if (!validate_schema(tool.input_schema, args).empty()) {
      res = call_tool(*engine_, tool, session_, args);  // the in-band invalid-arguments answer
    } else {
      json bg = args;
      bg.erase("yieldMs");  // a task waits as long as its command runs
      res = call_tool(*engine_, *find_tool("run_command_bg"), session_, bg);
    }
    const json& s = res.structured;
    json task;
    std::string id;
    if (s.contains("taskId") && s["taskId"].is_string()) {
      id = s["taskId"].get<std::string>();
      {
        std::lock_guard<std::mutex> lock(mu_);
        tasks_[id] = {tool.name, created};
      }
      task = task_of(s);
      if (s.value("state", "") == "running" || s.value("state", "") == "queued") {
        watch(id);
      }
      notify("notifications/resources/list_changed", nullptr);
    } else {
      json refusal = call_result(res);  // before taking mu_: it reads the version under mu_
      std::lock_guard<std::mutex> lock(mu_);
      id = fmt::format("refused-{}", ++refused_seq_);
      task = {{"taskId", id},
              {"status", "failed"},
              {"statusMessage", "refused, nothing was started: " + res.text},
              {"createdAt", created},
              {"lastUpdatedAt", created},
              {"ttl", nullptr}};
      // Kept for tasks/get and tasks/result: bounded, since the refusal echoes the argv.
      json kept_task = task;
      clip_strings(kept_task, kMaxKeptTextBytes);
      clip_strings(refusal, kMaxKeptTextBytes);
      refused_[id] = {std::move(kept_task), std::move(refusal)};
      refused_order_.push_back(id);
      if (refused_order_.size() > kMaxRefusedTasks) {
        refused_.erase(refused_order_.front());
        refused_order_.pop_front();
      }
    }
    if (call.cancelled) {
      log_->info("request {} cancelled; task {} was created anyway", dump(call.id), id);
      return reply(nullptr);
    }
    json result = {{"task", task}};
    result["_meta"] = {
        {kImmediateResponseKey,
         fmt::format("{} is running as task {}: its result comes with tasks/result; meanwhile "
                     "command_status, command_output and command_wait take the same id.",
                     tool.name, id)}};
    if (task["status"] == "failed") {
      result["_meta"][kImmediateResponseKey] = task["statusMessage"];
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

  static std::string now_rfc3339() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm {};
    ::gmtime_r(&ts.tv_sec, &tm);
    char buf[40];
    size_t n = ::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    return fmt::format("{}.{:03}Z", std::string_view(buf, n), ts.tv_nsec / 1000000);
  }

  // The task view of a job (its status_json): working while queued or running; completed
  // once it ran and settled, whatever its exit code (the result says it); failed when it
  // could not start or its output could not be kept (the tool result is isError then);
  // cancelled once tasks/cancel was accepted, whatever happens after.
  json task_of(const json& st) {
    std::string id = st.value("taskId", "");
    std::string state = st.value("state", "");
    std::string message = st.value("message", "");
    std::optional<std::string> cancelled_at;  // when tasks/cancel was accepted
    std::string created;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto c = cancelled_.find(id); c != cancelled_.end()) {
        cancelled_at = c->second;
      }
      if (auto it = tasks_.find(id); it != tasks_.end()) {
        created = it->second.created;
      }
    }
    std::string started = st.value("startedAt", "");
    if (started.empty()) {
      started = created.empty() ? now_rfc3339() : created;  // queued: not started yet
    }
    // The last change of the task's status: its end, its start, or (for a cancelled task,
    // whose status changes no more) the cancel.
    std::string updated = cancelled_at ? *cancelled_at : json_fields::str(st, "endedAt", started);
    std::string status, text;
    if (cancelled_at) {
      status = "cancelled";
      text =
          "cancelled by tasks/cancel: the sandbox got SIGTERM (SIGKILL after the policy's "
          "grace); what it printed is kept (command_output)";
    } else if (state == "queued") {
      status = "working";
      text = "queued: waiting for a free slot (the policy's concurrency limit)";
    } else if (state == "running") {
      status = "working";
      text =
          "running; tasks/result waits for the end, command_output pages what it printed "
          "so far";
    } else if (state == "failed") {
      status = "failed";
      text = message.empty() ? "failed" : message;
    } else {
      status = "completed";
      if (state == "exited" && st["exitCode"].is_number_integer()) {
        text = fmt::format("exited with code {}", st["exitCode"].get<int>());
      } else if (state == "killed" && st["signal"].is_string()) {
        text = "killed by " + st["signal"].get<std::string>();
      } else {
        text = message.empty() ? state : state + ": " + message;
      }
      text += "; tasks/result has the full result";
    }
    return {{"taskId", id},
            {"status", status},
            {"statusMessage", text},
            {"createdAt", started},
            {"lastUpdatedAt", updated},
            {"ttl", nullptr},
            {"pollInterval", kTaskPollMs}};
  }

  // A job's status without marking it read (tasks/get is polling, not reading the result).
  // Failure fixed (a review, session 13): this listed the whole session (each job's status
  // under the engine's lock, its log tails read) to find one job: tasks/get took 1.3 s in a
  // session of 6000 jobs and stalled every other uid's calls meanwhile.
  std::optional<json> find_status(const std::string& id) {
    auto st = engine_->peek(session_, id);
    if (!st) {
      return std::nullopt;
    }
    return status_json(*st);
  }

  // tasks/* belong to the sessions that negotiated them (2025-11-25 and later). Elsewhere a
  // tasks/result blocked a batch until its job ended, up to maxTimeoutMs (a review, session
  // 34); the other methods answered a capability the session never saw.
  bool tasks_negotiated(const rpc::Request& r, const rpc::Reply& reply) {
    std::string v = version();
    if (has_tasks(v)) {
      return true;
    }
    reply(rpc::make_error(
        r.id, rpc::kMethodNotFound,
        fmt::format("Method not found: {} is part of MCP tasks ({} and later), and this session "
                    "negotiated {}; use command_wait, command_status and command_kill instead",
                    r.method, kTasksVersion, v)));
    return false;
  }

  std::optional<std::string> task_id_param(const rpc::Request& r, const rpc::Reply& reply) {
    if (!r.params.is_object() || !r.params.contains("taskId") || !r.params["taskId"].is_string()) {
      invalid_params(r, reply, "`/taskId` must be a string");
      return std::nullopt;
    }
    return r.params["taskId"].get<std::string>();
  }

  void task_not_found(const rpc::Request& r, const rpc::Reply& reply, const std::string& id) {
    auto known = engine_->known_ids(session_);
    std::string which =
        !known ? fmt::format("this session's cannot be listed now: {}", known.error().message())
        : known->empty() ? "this session has none; a tools/call of run_command or "
                           "run_command_bg with `task` creates one"
                         : fmt::format("this session's are {}", fmt::join(*known, ", "));
    invalid_params(r, reply, fmt::format("Failed to retrieve task: no task `{}`; {}", id, which));
  }

  void register_task_methods() {
    rpc_.on("tasks/get", [this](const rpc::Request& r, rpc::Reply reply) {
      if (!tasks_negotiated(r, reply)) {
        return;
      }
      auto id = task_id_param(r, reply);
      if (!id) {
        return;
      }
      if (auto refused = refused_task(*id)) {
        return reply(rpc::make_result(r.id, refused->task));
      }
      auto st = find_status(*id);
      if (!st) {
        return task_not_found(r, reply, *id);
      }
      reply(rpc::make_result(r.id, task_of(*st)));
    });
    rpc_.on("tasks/list", [this](const rpc::Request& r, rpc::Reply reply) {
      if (!tasks_negotiated(r, reply)) {
        return;
      }
      size_t from = 0;
      if (r.params.is_object() && r.params.contains("cursor")) {
        const json& c = r.params["cursor"];
        std::string text = c.is_string() ? c.get<std::string>() : "";
        if (text.empty() || text.size() > 9 ||
            text.find_first_not_of("0123456789") != std::string::npos) {
          return invalid_params(r, reply, "`/cursor` is not a cursor tasks/list gave");
        }
        from = std::stoul(text);
      }
      // The session's ids, then a status for the page's only (the same review: every job's
      // status was built to return 100 of them, 985 ms in a session of 6000 jobs).
      auto ids = engine_->known_ids(session_);
      if (!ids) {
        return reply(rpc::make_error(r.id, rpc::kInternalError, ids.error().message()));
      }
      std::vector<json> refused;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& id : refused_order_) {
          refused.push_back(refused_.at(id).task);
        }
      }
      size_t total = ids->size() + refused.size();
      if (from > total) {
        return invalid_params(r, reply, "`/cursor` is past the end of the list");
      }
      json page = json::array();
      for (size_t i = from; i < total && i < from + kTaskPage; ++i) {
        if (i >= ids->size()) {
          page.push_back(refused[i - ids->size()]);
        } else if (auto st = engine_->peek(session_, (*ids)[i])) {
          page.push_back(task_of(status_json(*st)));
        }  // removed since the ids were read: left out of this page
      }
      json result = {{"tasks", page}};
      if (from + kTaskPage < total) {
        result["nextCursor"] = std::to_string(from + kTaskPage);
      }
      reply(rpc::make_result(r.id, std::move(result)));
    });
    rpc_.on("tasks/cancel", [this](const rpc::Request& r, rpc::Reply reply) {
      if (!tasks_negotiated(r, reply)) {
        return;
      }
      auto id = task_id_param(r, reply);
      if (!id) {
        return;
      }
      if (refused_task(*id)) {
        return invalid_params(r, reply,
                              fmt::format("task `{}` already failed (nothing was started)", *id));
      }
      auto st = find_status(*id);
      if (!st) {
        return task_not_found(r, reply, *id);
      }
      json now = task_of(*st);
      if (now["status"] != "working") {
        return invalid_params(
            r, reply,
            fmt::format("task `{}` is already {} ({}); a finished task cannot be cancelled", *id,
                        now["status"].get<std::string>(), now["statusMessage"].get<std::string>()));
      }
      // The same as command_kill: SIGTERM to the whole sandbox, SIGKILL after the grace.
      auto k = engine_->kill(session_, *id, SIGTERM);
      if (!k) {
        return reply(rpc::make_error(r.id, rpc::kInternalError,
                                     "Internal error: cancel: " + k.error().message()));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancelled_.emplace(*id, now_rfc3339());
      }
      json task = task_of(status_json(*k));
      notify("notifications/tasks/status", task);
      reply(rpc::make_result(r.id, task));
    });
    rpc_.on("tasks/result", [this](const rpc::Request& r, rpc::Reply reply) {
      if (!tasks_negotiated(r, reply)) {
        return;
      }
      auto id = task_id_param(r, reply);
      if (!id) {
        return;
      }
      if (auto refused = refused_task(*id)) {
        json result = refused->result;
        result["_meta"] = {{kRelatedTaskKey, {{"taskId", *id}}}};
        return reply(rpc::make_result(r.id, std::move(result)));
      }
      if (!find_status(*id)) {
        return task_not_found(r, reply, *id);
      }
      auto call = begin_call(r, reply, "tasks/result");
      if (!call) {
        return;
      }
      run_on_worker(call, reply, [this, call, id = *id](const rpc::Reply& answer) {
        std::string tool = "run_command";  // a job not started as a task: the fuller answer
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (auto it = tasks_.find(id); it != tasks_.end()) {
            tool = it->second.tool;
          }
        }
        CallContext ctx;
        ctx.cancelled = [this, &c = *call] { return c.cancelled.load() || shutting_down_.load(); };
        ToolResult res = settled_result(*engine_, *find_tool(tool), session_, id, ctx);
        if (call->cancelled) {
          return answer(nullptr);
        }
        json result = call_result(res);
        result["_meta"] = {{kRelatedTaskKey, {{"taskId", id}}}};
        answer(rpc::make_result(call->id, std::move(result)));
      });
    });
  }

  std::optional<RefusedTask> refused_task(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = refused_.find(id); it != refused_.end()) {
      return it->second;
    }
    return std::nullopt;
  }

  // Forgets the calls that are done; `all`: waits for every call in flight first (shutdown).
  void reap_calls(bool all) {
    if (all) {
      workers_.stop();
    } else {
      workers_.reap();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (all || (*it)->done) {
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // ---- settle announcements -------------------------------------------------------------------
  // The engine tells us (subscribe_settled) when a job settles; the watcher thread announces
  // the ones this server left running. A settle can come before the call that started the job
  // has asked to watch it, so recent settles are remembered for a watch that comes late.
  void watch(const std::string& id) {
    std::optional<JobStatus> early;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = recent_.begin(); it != recent_.end(); ++it) {
        if (it->task_id == id) {
          early = *it;
          recent_.erase(it);
          break;
        }
      }
      if (!early) {
        watched_.insert(id);
      }
    }
    if (early) {
      announce(*early);
    }
  }

  void watch_loop() {
    for (;;) {
      std::deque<JobStatus> batch;
      {
        std::unique_lock<std::mutex> lock(settle_mu_);
        watch_cv_.wait(lock, [this] { return stopping_ || !settle_queue_.empty(); });
        if (stopping_) {
          return;
        }
        batch.swap(settle_queue_);
      }
      for (const auto& s : batch) {
        bool watched;
        {
          std::lock_guard<std::mutex> lock(mu_);
          watched = watched_.erase(s.task_id) > 0;
          if (!watched) {
            recent_.push_back(s);
            if (recent_.size() > kRecentSettled) {
              recent_.pop_front();
            }
          }
        }
        if (watched) {
          announce(s);
        }
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
    bool subscribed, task, cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      subscribed = subscribed_.contains(uri);
      task = tasks_.contains(s.task_id);
      cancelled = cancelled_.contains(s.task_id);
    }
    if (subscribed) {
      notify("notifications/resources/updated", {{"uri", uri}});
    }
    if (task && !cancelled) {  // a cancelled task's last change was announced by tasks/cancel
      notify("notifications/tasks/status", task_of(status_json(s)));
    }
  }

  void unsubscribe() {
    if (engine_ && settle_sub_ != 0) {
      engine_->unsubscribe_settled(settle_sub_);
      settle_sub_ = 0;
    }
  }

  void shutdown() {
    // Waits end now; calls still answer (best effort) if the client reads on after closing
    // its side.
    shutting_down_ = true;
    reap_calls(true);
    {
      std::lock_guard<std::mutex> lock(settle_mu_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watcher_.joinable()) {
      watcher_.join();
    }
    unsubscribe();    // before the engine goes: its settles must not reach a server that ended
    engine_.reset();  // standalone, the last owner: kills every running sandbox
  }

  // Shared with the daemon, which serves every connection on one engine; standalone, this
  // is the only owner and its reset() at EOF kills every running sandbox.
  std::shared_ptr<Engine> engine_;
  std::string session_;
  int out_fd_;
  size_t max_calls_;
  std::shared_ptr<CallBudget> uid_calls_;
  std::shared_ptr<log::Logger> log_;
  rpc::Dispatcher rpc_;
  uint64_t settle_sub_ = 0;

  std::mutex out_mu_;
  bool out_broken_ = false;

  std::mutex mu_;  // guards what follows; never held while calling the engine
  std::string version_ = kMcpVersions[0];
  std::list<std::shared_ptr<Call>> calls_;
  std::set<std::string> watched_, subscribed_;
  std::deque<JobStatus> recent_;                  // settled while not (yet) watched, newest last
  std::map<std::string, TaskInfo> tasks_;         // jobs started as tasks by this server
  std::map<std::string, std::string> cancelled_;  // tasks/cancel accepted: id -> when
  std::map<std::string, RefusedTask> refused_;
  std::deque<std::string> refused_order_;
  uint64_t refused_seq_ = 0;

  // The engine's settle callback only queues here (it runs with the engine's lock held).
  std::mutex settle_mu_;  // guards what follows
  std::deque<JobStatus> settle_queue_;
  bool stopping_ = false;
  std::condition_variable watch_cv_;

  std::atomic<bool> initialized_{false}, shutting_down_{false};
  std::atomic<size_t> min_level_{1};  // info
  std::thread watcher_;
  // Last: its destructor waits for the calls still running, which use the members above.
  CallWorkers workers_{max_calls_};
};

// The process's one "mcp" logger (made once, whichever thread comes first).
std::shared_ptr<log::Logger> mcp_logger() { return log::stderr_logger("mcp"); }

}  // namespace

int run_mcp_server(const McpOptions& options) {
  auto log = mcp_logger();  // also the default logger: stdout is the protocol's
  auto engine = Engine::open(options.engine);
  if (!engine) {
    log->error("cannot start: {}", engine.error().message());
    return 1;
  }
  for (const auto& w : (*engine)->warnings()) {
    log->warn("{}", w);
  }
  log->info("serving MCP on stdio; session `{}`, state dir `{}`", options.session,
            options.engine.state_dir);
  Server server(std::shared_ptr<Engine>(std::move(*engine)), options, log);
  return server.serve(options.in_fd);
}

int serve_mcp_connection(std::shared_ptr<Engine> engine, const std::string& session, int in_fd,
                         int out_fd, const ConnectionLimits& limits,
                         const std::string& first_line) {
  auto log = mcp_logger();
  McpOptions o;
  o.session = session;
  o.in_fd = in_fd;
  o.out_fd = out_fd;
  o.max_calls = limits.max_calls;
  o.uid_calls = limits.uid_calls;
  Server server(std::move(engine), o, log);
  return server.serve(in_fd, limits, first_line);
}

}  // namespace cordon::api
