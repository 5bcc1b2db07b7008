#pragma once

// JSON-RPC 2.0 over newline-delimited JSON (the MCP stdio transport and the daemon socket):
// a bounded line splitter, message validation with the standard error codes, and a
// dispatcher whose methods answer asynchronously (a long tool call must not hold up the
// reading of a cancel). No I/O here: callers feed bytes and get messages to send.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cordon::api::jsonrpc {

using json = nlohmann::json;

inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
// Server-defined (-32000..-32099).
inline constexpr int kServerBusy = -32000;
inline constexpr int kResourceNotFound = -32002;  // the MCP spec's code for resources/read

/// The longest line accepted (16 MiB). A longer one is discarded up to its newline and
/// answered with kInvalidRequest; the connection keeps serving.
inline constexpr size_t kMaxLineBytes = size_t{16} << 20;

/// The deepest nesting of arrays and objects accepted. nlohmann parses iteratively but copies,
/// compares and serializes recursively: a line of 100 000 nested arrays overflowed the
/// connection thread's stack and ended the daemon. A deeper message is answered with
/// kInvalidRequest (null id) without being parsed; no MCP message comes near the bound.
inline constexpr size_t kMaxDepth = 512;

/// How deep arrays and objects nest in `text` (brackets inside strings do not count); stops
/// counting at `limit` + 1.
size_t nesting_depth(std::string_view text, size_t limit = kMaxDepth);

/// The most values (arrays, objects, and the members and elements in them) one line may hold.
/// Failure fixed (a review, session 13): a parsed value costs ~100 times its bytes, so one
/// 16 MiB line of `[{},{},…]` took ~450 MB to parse, and eight connections at once 3.8 GB. A
/// line with more is answered with kInvalidRequest without being parsed (a tools/call with
/// an argv of ~65000 arguments still fits; one big string is one value).
inline constexpr size_t kMaxValues = 65536;

/// Why `line` is not to be parsed at all (nesting_depth or value_count over its bound), or
/// nullopt. Every line the server parses is checked by this first.
std::optional<std::string> over_parse_bounds(std::string_view line);

/// The most requests in one JSON-RPC batch (2024-11-05 and 2025-03-26 sessions). Failure fixed
/// (the same review): a 559 KB batch of 10 000 `tools/list` grew the daemon by 1 GB and made
/// one 190 MB reply.
inline constexpr size_t kMaxBatch = 64;

/// An upper bound of the values in `text` (each `[`, `{` and `,` outside strings, plus one);
/// stops counting at `limit` + 1.
size_t value_count(std::string_view text, size_t limit = kMaxValues);

json make_error(const json& id, int code, const std::string& message, const json& data = nullptr);
json make_result(const json& id, json result);
json make_notification(const std::string& method, json params);

/// Splits a byte stream into lines of at most `max_bytes` (without the `\n`; a trailing `\r`
/// is dropped). A line over the bound is reported once as overlong and skipped to its end.
class LineSplitter {
 public:
  struct Line {
    std::string text;
    bool overlong = false;  // text is empty; the line had more than max_bytes
  };
  explicit LineSplitter(size_t max_bytes = kMaxLineBytes) : max_(max_bytes) {}
  /// Appends bytes; returns the lines they completed.
  std::vector<Line> feed(std::string_view bytes);
  /// At EOF: the unterminated last line, if any (an overlong one is reported as such).
  std::vector<Line> finish();
  /// A line has begun and not ended (the daemon's stall timeout watches this).
  bool pending() const { return skipping_ || !buf_.empty(); }

 private:
  size_t max_;
  std::string buf_;
  bool skipping_ = false;
};

/// A batch's responses go out as one array once its last member answered. What a member's
/// answer holds until then (the daemon counts a call in flight until its response is written)
/// is let go by after_sent: a batch of 32 pages otherwise held 32 replies while counting as
/// one call (a red-team review, session 38).
class BatchHold {
 public:
  /// Runs `fn` once the batch's array is written (or needs none); at once if it already was.
  void after_sent(std::function<void()> fn);
  /// The array is written: runs every `fn` given so far.
  void sent();

 private:
  std::mutex mu_;
  bool sent_ = false;
  std::vector<std::function<void()>> waiting_;
};

/// One incoming request or notification, validated.
struct Request {
  json id;  // string or integer; null for a notification
  bool notification = false;
  std::string method;
  json params;                       // object, array or null (absent)
  std::shared_ptr<BatchHold> batch;  // set for a member of a batch
};

/// Answers a request exactly once with a response object (make_result / make_error), or
/// with null when it gets no response (MCP: a cancelled request is not answered). Null still
/// counts as the answer: a batch's other responses go out once each member answered.
using Reply = std::function<void(json response)>;

class Dispatcher {
 public:
  using Method = std::function<void(const Request&, Reply)>;
  using Notification = std::function<void(const Request&)>;
  using Send = std::function<void(const json& message)>;

  explicit Dispatcher(Send send) : send_(std::move(send)) {}

  void on(const std::string& method, Method m) { methods_[method] = std::move(m); }
  void on_notification(const std::string& method, Notification n) {
    notifications_[method] = std::move(n);
  }
  /// Batches (a JSON array of messages) are part of JSON-RPC 2.0 and MCP up to 2025-03-26;
  /// MCP 2025-06-18 removed them. Off: an array is answered with kInvalidRequest.
  void set_allow_batch(bool allow) { allow_batch_ = allow; }

  /// Handles one line: parses it, validates each message and dispatches it. Replies (and
  /// errors) go out through `send`; a batch's replies go out together as one array.
  void handle_line(std::string_view line);
  /// An overlong line gets an error with a null id (its id cannot be read).
  void handle_overlong(size_t max_bytes);

 private:
  // Runs one message; `reply` gets its response, `no_reply` is called when there is none.
  void run(const json& msg, const Reply& reply, const std::function<void()>& no_reply,
           const std::shared_ptr<BatchHold>& batch = nullptr);

  Send send_;
  std::map<std::string, Method> methods_;
  std::map<std::string, Notification> notifications_;
  bool allow_batch_ = false;
};

/// Parses and validates a single message object (not a batch). Returns the error response
/// to send instead when it is not a valid request or notification; a response object (a
/// message with result or error and no method) is reported as ignorable with a null json.
struct Checked {
  std::optional<Request> request;
  json error;  // a response to send, or null to send nothing
};
Checked check_message(const json& msg);

}  // namespace cordon::api::jsonrpc
