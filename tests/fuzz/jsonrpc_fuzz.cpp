// JSON-RPC framing and dispatch (src/api/jsonrpc.cpp) against a reference reading of
// JSON-RPC 2.0 as jsonrpc.hpp documents it:
//  - LineSplitter gives the same lines however the stream is chunked, and the same as a naive
//    split (overlong lines reported once, a trailing CR dropped from terminated lines);
//  - every line gets exactly the replies the spec asks for: a parse error for bad JSON, one
//    response per request carrying its id, nothing for notifications or responses, one array
//    for a batch (when batches are on) whose members match the reference in order;
//  - every reply is a well-formed JSON-RPC response; nothing throws.

#include <fuzzer/FuzzedDataProvider.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/jsonrpc.hpp"
#include "fuzz/fuzz_check.hpp"

namespace {

using cordon::fuzz::show;
using json = nlohmann::json;
namespace rpc = cordon::api::jsonrpc;

struct Line {
  std::string text;
  bool overlong = false;
  bool operator==(const Line&) const = default;
};

std::vector<Line> naive_split(std::string_view s, size_t max) {
  std::vector<Line> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    std::string_view raw = s.substr(pos, nl == std::string_view::npos ? s.npos : nl - pos);
    if (raw.size() > max) {
      out.push_back({"", true});
    } else if (nl != std::string_view::npos) {
      std::string t(raw);
      if (!t.empty() && t.back() == '\r') {
        t.pop_back();
      }
      out.push_back({t, false});
    } else if (!raw.empty()) {
      out.push_back({std::string(raw), false});  // at EOF: kept as is
    }
    if (nl == std::string_view::npos) {
      break;
    }
    pos = nl + 1;
  }
  return out;
}

std::vector<Line> split_chunked(std::string_view s, size_t max, const std::vector<size_t>& cuts) {
  rpc::LineSplitter splitter(max);
  std::vector<Line> out;
  size_t pos = 0;
  auto take = [&](std::vector<rpc::LineSplitter::Line> ls) {
    for (auto& l : ls) {
      out.push_back({std::move(l.text), l.overlong});
    }
  };
  for (size_t c : cuts) {
    size_t n = std::min(c, s.size() - pos);
    take(splitter.feed(s.substr(pos, n)));
    pos += n;
  }
  take(splitter.feed(s.substr(pos)));
  take(splitter.finish());
  return out;
}

// What one message must get: nothing, or a response with this id and (for errors) code.
struct Expect {
  bool reply = false;
  json id;
  std::optional<int> error;  // unset: a result
};

// Nesting of arrays and objects outside strings (the reference for kMaxDepth).
size_t depth(std::string_view s) {
  size_t d = 0, most = 0;
  bool str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (str) {
      if (s[i] == '\\') {
        ++i;
      } else if (s[i] == '"') {
        str = false;
      }
    } else if (s[i] == '"') {
      str = true;
    } else if (s[i] == '[' || s[i] == '{') {
      most = std::max(most, ++d);
    } else if ((s[i] == ']' || s[i] == '}') && d > 0) {
      --d;
    }
  }
  return most;
}

// A key twice in one object, found by a SAX pass (the dispatcher uses a parse callback): the
// message is refused whole, with its id unless the id itself is the repeated key.
struct Duplicates : nlohmann::json_sax<json> {
  std::vector<std::set<std::string>> objects;
  bool any = false, top_id = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    objects.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (!objects.back().insert(k).second) {
      any = true;
      top_id = top_id || (objects.size() == 1 && k == "id");
    }
    return true;
  }
  bool end_object() override {
    objects.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

const char* kMethods[] = {"echo", "fail"};

bool known(const std::string& m) { return m == "echo" || m == "fail"; }

Expect reference(const json& msg) {
  if (!msg.is_object()) {
    return {true, nullptr, rpc::kInvalidRequest};
  }
  bool has_id = msg.contains("id");
  const json id = has_id ? msg["id"] : json();
  bool id_ok = !has_id || id.is_string() || id.is_number_integer();
  json rid = id_ok ? id : json();
  if (!msg.contains("method") && (msg.contains("result") || msg.contains("error"))) {
    return {};
  }
  if (!msg.contains("jsonrpc") || !msg["jsonrpc"].is_string() || msg["jsonrpc"] != "2.0") {
    return {true, rid, rpc::kInvalidRequest};
  }
  if (!msg.contains("method") || !msg["method"].is_string()) {
    return {true, rid, rpc::kInvalidRequest};
  }
  if (!id_ok) {
    return {true, nullptr, rpc::kInvalidRequest};
  }
  if (msg.contains("params") && !msg["params"].is_object() && !msg["params"].is_array()) {
    if (!has_id) {
      return {};
    }
    return {true, rid, rpc::kInvalidRequest};
  }
  if (!has_id) {
    return {};
  }
  std::string m = msg["method"].get<std::string>();
  if (!known(m)) {
    return {true, id, rpc::kMethodNotFound};
  }
  if (m == "fail") {
    return {true, id, rpc::kInvalidParams};
  }
  return {true, id, std::nullopt};
}

void check_response(const json& r, const Expect& e, const std::string& line) {
  FUZZ_CHECK(r.is_object(), "a reply that is not an object: {} for `{}`", r.dump(), show(line));
  FUZZ_CHECK(r.value("jsonrpc", json()) == "2.0", "reply without jsonrpc 2.0: {}", r.dump());
  FUZZ_CHECK(r.contains("id") && r["id"] == e.id, "reply id {} but expected {} for `{}`",
             r.value("id", json("(none)")).dump(), e.id.dump(), show(line));
  FUZZ_CHECK(r.contains("result") != r.contains("error"),
             "a reply must have exactly one of result and error: {}", r.dump());
  if (e.error) {
    FUZZ_CHECK(r.contains("error"), "expected error {} for `{}`, got {}", *e.error, show(line),
               r.dump());
    const json& err = r["error"];
    FUZZ_CHECK(err.is_object() && err.contains("code") && err["code"].is_number_integer() &&
                   err["code"].get<int>() == *e.error,
               "expected code {} for `{}`, got {}", *e.error, show(line), r.dump());
    FUZZ_CHECK(err.contains("message") && err["message"].is_string() &&
                   !err["message"].get<std::string>().empty(),
               "an error without a message: {}", r.dump());
  } else {
    FUZZ_CHECK(r.contains("result"), "expected a result for `{}`, got {}", show(line), r.dump());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  size_t max = fdp.ConsumeIntegralInRange<size_t>(1, 300);
  bool batches = fdp.ConsumeBool();
  std::vector<size_t> cuts(fdp.ConsumeIntegralInRange<size_t>(0, 8));
  for (auto& c : cuts) {
    c = fdp.ConsumeIntegralInRange<size_t>(0, 64);
  }
  std::string stream = fdp.ConsumeRemainingBytesAsString();

  // Framing.
  std::vector<Line> whole = split_chunked(stream, max, {});
  std::vector<Line> chunked = split_chunked(stream, max, cuts);
  std::vector<Line> naive = naive_split(stream, max);
  FUZZ_CHECK(whole == chunked, "chunking changed the lines of `{}`", show(stream));
  FUZZ_CHECK(whole == naive, "lines differ from a naive split of `{}` ({} vs {})", show(stream),
             whole.size(), naive.size());

  // Dispatch: every line on its own, with methods that answer synchronously.
  std::vector<json> sent;
  rpc::Dispatcher d([&](const json& m) { sent.push_back(m); });
  d.set_allow_batch(batches);
  d.on("echo", [](const rpc::Request& r, rpc::Reply reply) {
    FUZZ_CHECK(!r.notification, "a notification reached a method");
    reply(rpc::make_result(r.id, r.params));
  });
  d.on("fail", [](const rpc::Request& r, rpc::Reply reply) {
    reply(rpc::make_error(r.id, rpc::kInvalidParams, "Invalid params: no"));
  });
  size_t notes = 0;
  d.on_notification("echo", [&](const rpc::Request& r) {
    FUZZ_CHECK(r.notification && r.id.is_null(), "a request reached a notification handler");
    ++notes;
  });
  (void)kMethods;

  for (const Line& l : whole) {
    sent.clear();
    if (l.overlong) {
      d.handle_overlong(max);
      FUZZ_CHECK(sent.size() == 1, "an overlong line got {} replies", sent.size());
      check_response(sent[0], {true, nullptr, rpc::kInvalidRequest}, "(overlong)");
      continue;
    }
    d.handle_line(l.text);
    if (l.text.find_first_not_of(" \t\r") == std::string::npos) {
      FUZZ_CHECK(sent.empty(), "a blank line got a reply");
      continue;
    }
    if (depth(l.text) > rpc::kMaxDepth) {
      FUZZ_CHECK(sent.size() == 1, "a too deep line got {} replies", sent.size());
      check_response(sent[0], {true, nullptr, rpc::kInvalidRequest}, l.text);
      continue;
    }
    if (rpc::value_count(l.text) > rpc::kMaxValues) {
      FUZZ_CHECK(sent.size() == 1, "a line of too many values got {} replies", sent.size());
      check_response(sent[0], {true, nullptr, rpc::kInvalidRequest}, l.text);
      continue;
    }
    json msg = json::parse(l.text, nullptr, false);
    if (msg.is_discarded()) {
      FUZZ_CHECK(sent.size() == 1, "bad JSON `{}` got {} replies", show(l.text), sent.size());
      check_response(sent[0], {true, nullptr, rpc::kParseError}, l.text);
      continue;
    }
    Duplicates dups;
    json::sax_parse(l.text, &dups);
    if (dups.any) {
      FUZZ_CHECK(sent.size() == 1, "`{}` (a key twice) got {} replies", show(l.text), sent.size());
      json id = !dups.top_id && msg.is_object() && msg.contains("id") &&
                        (msg["id"].is_string() || msg["id"].is_number_integer())
                    ? msg["id"]
                    : json(nullptr);
      check_response(sent[0], {true, id, rpc::kInvalidRequest}, l.text);
      continue;
    }
    if (!msg.is_array()) {
      Expect e = reference(msg);
      FUZZ_CHECK(sent.size() == (e.reply ? 1u : 0u), "`{}` got {} replies, expected {}",
                 show(l.text), sent.size(), e.reply ? 1 : 0);
      if (e.reply) {
        check_response(sent[0], e, l.text);
      }
      continue;
    }
    if (!batches || msg.empty() || msg.size() > rpc::kMaxBatch) {
      FUZZ_CHECK(sent.size() == 1, "a refused batch got {} replies", sent.size());
      check_response(sent[0], {true, nullptr, rpc::kInvalidRequest}, l.text);
      continue;
    }
    std::vector<Expect> want;
    for (const auto& m : msg) {
      if (Expect e = reference(m); e.reply) {
        want.push_back(e);
      }
    }
    if (want.empty()) {
      FUZZ_CHECK(sent.empty(), "a batch of notifications got {} replies", sent.size());
      continue;
    }
    FUZZ_CHECK(sent.size() == 1 && sent[0].is_array() && sent[0].size() == want.size(),
               "batch `{}`: expected one array of {} responses, got {}", show(l.text), want.size(),
               sent.empty() ? std::string("nothing") : sent[0].dump());
    for (size_t i = 0; i < want.size(); ++i) {
      check_response(sent[0][i], want[i], l.text);
    }
  }
  return 0;
}
