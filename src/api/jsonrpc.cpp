#include "api/jsonrpc.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "base/json_unique.hpp"
#include "base/strings.hpp"

namespace cordon::api::jsonrpc {

json make_error(const json& id, int code, const std::string& message, const json& data) {
  json err = {{"code", code}, {"message", message}};
  if (!data.is_null()) {
    err["data"] = data;
  }
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", std::move(err)}};
}

json make_result(const json& id, json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json make_notification(const std::string& method, json params) {
  json n = {{"jsonrpc", "2.0"}, {"method", method}};
  if (!params.is_null()) {
    n["params"] = std::move(params);
  }
  return n;
}

namespace {

// Walks `text` outside its strings, calling `on(c)` for each structural character; stops when
// `on` returns false.
template <class On>
void scan_structure(std::string_view text, On on) {
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (!on(c)) {
      return;
    }
  }
}

}  // namespace

size_t nesting_depth(std::string_view text, size_t limit) {
  size_t depth = 0, deepest = 0;
  scan_structure(text, [&](char c) {
    if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    return deepest <= limit;
  });
  return deepest;
}

size_t value_count(std::string_view text, size_t limit) {
  size_t values = 1;
  scan_structure(text, [&](char c) {
    if (c == '[' || c == '{' || c == ',') {
      ++values;
    }
    return values <= limit;
  });
  return values;
}

std::vector<LineSplitter::Line> LineSplitter::feed(std::string_view bytes) {
  std::vector<Line> out;
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view part = bytes.substr(0, nl);
    if (skipping_) {
      // Inside an overlong line: drop bytes until its newline.
    } else if (buf_.size() + part.size() > max_) {
      skipping_ = true;
      buf_.clear();
      buf_.shrink_to_fit();
      out.push_back({"", true});
    } else {
      buf_.append(part);
    }
    if (nl == std::string_view::npos) {
      break;
    }
    if (!skipping_) {
      if (!buf_.empty() && buf_.back() == '\r') {
        buf_.pop_back();
      }
      out.push_back({std::move(buf_), false});
      buf_.clear();
    }
    skipping_ = false;
    bytes.remove_prefix(nl + 1);
  }
  return out;
}

std::vector<LineSplitter::Line> LineSplitter::finish() {
  std::vector<Line> out;
  if (!skipping_ && !buf_.empty()) {
    out.push_back({std::move(buf_), false});
  }
  buf_.clear();
  skipping_ = false;
  return out;
}

Checked check_message(const json& msg) {
  if (!msg.is_object()) {
    return {std::nullopt, make_error(nullptr, kInvalidRequest,
                                     "Invalid Request: a message must be a JSON object")};
  }
  json id = msg.contains("id") ? msg["id"] : json();
  bool has_id = msg.contains("id");
  // An id we cannot echo back is answered with a null id, as JSON-RPC 2.0 says.
  bool id_ok = !has_id || id.is_string() || id.is_number_integer();
  json reply_id = id_ok ? id : json();
  if (!msg.contains("method") && (msg.contains("result") || msg.contains("error"))) {
    return {std::nullopt, nullptr};  // a response to a request of ours: we send none
  }
  auto jv = msg.find("jsonrpc");
  if (jv == msg.end() || *jv != "2.0") {
    return {std::nullopt,
            make_error(reply_id, kInvalidRequest, "Invalid Request: `jsonrpc` must be \"2.0\"")};
  }
  auto m = msg.find("method");
  if (m == msg.end() || !m->is_string()) {
    return {std::nullopt,
            make_error(reply_id, kInvalidRequest, "Invalid Request: `method` must be a string")};
  }
  if (!id_ok) {
    // MCP forbids null ids, and JSON-RPC ids are strings or integers.
    return {std::nullopt, make_error(nullptr, kInvalidRequest,
                                     "Invalid Request: `id` must be a string or an integer")};
  }
  auto p = msg.find("params");
  if (p != msg.end() && !p->is_object() && !p->is_array()) {
    if (!has_id) {
      return {std::nullopt, nullptr};  // a notification is never answered, even when bad
    }
    return {std::nullopt, make_error(reply_id, kInvalidRequest,
                                     "Invalid Request: `params` must be an object or an array")};
  }
  Request r;
  r.id = id;
  r.notification = !has_id;
  r.method = m->get<std::string>();
  r.params = p != msg.end() ? *p : json();
  return {std::move(r), nullptr};
}

void BatchHold::after_sent(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sent_) {
      waiting_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void BatchHold::sent() {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sent_ = true;
    run.swap(waiting_);
  }
  for (auto& fn : run) {
    fn();
  }
}

void Dispatcher::run(const json& msg, const Reply& reply, const std::function<void()>& no_reply,
                     const std::shared_ptr<BatchHold>& batch) {
  Checked c = check_message(msg);
  if (!c.request) {
    if (c.error.is_null()) {
      no_reply();
    } else {
      reply(std::move(c.error));
    }
    return;
  }
  c.request->batch = batch;
  const Request& r = *c.request;
  if (r.notification) {
    if (auto n = notifications_.find(r.method); n != notifications_.end()) {
      // Last resort: cordon has no exceptions, but its handlers read JSON with nlohmann,
      // which throws on a type it did not expect. A handler bug must cost one message, not
      // the server and every other session on it.
      try {
        n->second(r);
      } catch (const std::exception&) {  // a notification has no one to tell
      }
    }
    no_reply();  // unknown notifications are ignored, as JSON-RPC says
    return;
  }
  auto m = methods_.find(r.method);
  if (m == methods_.end()) {
    reply(make_error(r.id, kMethodNotFound, fmt::format("Method not found: `{}`", r.method)));
    return;
  }
  // A method that throws is a bug (see above). It usually throws before answering, so the
  // internal error is its answer; if it had answered already, the client sees a second
  // response for that id, which it drops — still better than the server ending.
  try {
    m->second(r, reply);
  } catch (const std::exception& e) {
    reply(make_error(r.id, kInternalError,
                     fmt::format("Internal error: cordon failed handling `{}`: {}. The server "
                                 "keeps serving; please report this message.",
                                 r.method, e.what())));
  }
}

std::optional<std::string> over_parse_bounds(std::string_view line) {
  if (nesting_depth(line) > kMaxDepth) {
    return fmt::format("the message nests arrays and objects deeper than {} levels", kMaxDepth);
  }
  if (value_count(line) > kMaxValues) {
    return fmt::format(
        "the message holds more than {} values (arrays, objects and their elements); send "
        "smaller messages",
        kMaxValues);
  }
  return std::nullopt;
}

void Dispatcher::handle_line(std::string_view line) {
  size_t b = line.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) {
    return;  // blank lines between messages are tolerated
  }
  if (auto over = over_parse_bounds(line)) {
    send_(make_error(nullptr, kInvalidRequest, "Invalid Request: " + *over));
    return;
  }
  // A key twice in one object is refused (base/json_unique.hpp), as the policy file's parser
  // refuses it; the message's own id written twice leaves which one is meant unknown.
  UniqueKeysParse parsed = parse_unique_keys(line);
  json msg = std::move(parsed.value);
  const std::string& duplicate = parsed.duplicate;
  const bool id_twice = parsed.top_level_duplicates.count("id") != 0;
  if (msg.is_discarded()) {
    send_(make_error(nullptr, kParseError,
                     "Parse error: the line is not valid JSON (one JSON-RPC message per line)"));
    return;
  }
  if (!duplicate.empty()) {
    json id = !id_twice && msg.is_object() && msg.contains("id") &&
                      (msg["id"].is_string() || msg["id"].is_number_integer())
                  ? msg["id"]
                  : json(nullptr);
    send_(make_error(id, kInvalidRequest,
                     fmt::format("Invalid Request: the key `{}` appears twice in one object; "
                                 "write each key once (nothing of this message was run)",
                                 escape_controls(duplicate.substr(0, 64), ""))));
    return;
  }
  if (!msg.is_array()) {
    run(
        msg,
        [send = send_](json r) {
          if (!r.is_null()) {
            send(r);
          }
        },
        [] {});
    return;
  }
  if (!allow_batch_) {
    send_(make_error(nullptr, kInvalidRequest,
                     "Invalid Request: JSON-RPC batches are not supported by the negotiated MCP "
                     "version (removed in 2025-06-18); send one message per line"));
    return;
  }
  if (msg.empty()) {
    send_(make_error(nullptr, kInvalidRequest, "Invalid Request: an empty batch"));
    return;
  }
  if (msg.size() > kMaxBatch) {
    send_(make_error(nullptr, kInvalidRequest,
                     fmt::format("Invalid Request: a batch of {} messages; at most {} are taken "
                                 "in one batch, nothing of this one was run: send it in parts",
                                 msg.size(), kMaxBatch)));
    return;
  }
  // The batch's responses go out together once every member answered (or needs no answer).
  struct Batch {
    std::mutex mu;
    size_t pending;
    json responses = json::array();
    Send send;
    std::shared_ptr<BatchHold> hold = std::make_shared<BatchHold>();
  };
  auto batch = std::make_shared<Batch>();
  batch->pending = msg.size() + 1;  // +1: the loop below holds one until it is done
  batch->send = send_;
  auto done_one = [batch](std::optional<json> response) {
    json out;
    {
      std::lock_guard<std::mutex> lock(batch->mu);
      if (response) {
        batch->responses.push_back(std::move(*response));
      }
      if (--batch->pending != 0) {
        return;
      }
      out = std::move(batch->responses);
    }
    if (!out.empty()) {
      batch->send(out);
    }
    batch->hold->sent();
  };
  for (const auto& m : msg) {
    run(
        m,
        [done_one](json r) {
          done_one(r.is_null() ? std::nullopt : std::optional<json>(std::move(r)));
        },
        [done_one] { done_one(std::nullopt); }, batch->hold);
  }
  done_one(std::nullopt);
}

void Dispatcher::handle_overlong(size_t max_bytes) {
  send_(make_error(nullptr, kInvalidRequest,
                   fmt::format("Invalid Request: the line is longer than {} bytes and was "
                               "discarded; send smaller messages (page large data)",
                               max_bytes)));
}

}  // namespace cordon::api::jsonrpc
