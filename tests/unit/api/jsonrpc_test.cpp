#define BOOST_TEST_MODULE api_jsonrpc
#include <boost/test/unit_test.hpp>

#include <vector>

#include "api/jsonrpc.hpp"

using namespace cordon::api::jsonrpc;

namespace {

struct Harness {
  std::vector<json> sent;
  std::vector<Reply> pending;  // replies a test answers later (asynchronous methods)
  Dispatcher d{[this](const json& m) { sent.push_back(m); }};
  Harness() {
    d.on("echo", [](const Request& r, Reply reply) { reply(make_result(r.id, r.params)); });
    d.on("later", [this](const Request&, Reply reply) { pending.push_back(reply); });
  }
};

int error_code(const json& m) { return m.at("error").at("code").get<int>(); }

}  // namespace

BOOST_AUTO_TEST_CASE(splits_lines_and_drops_carriage_returns) {
  LineSplitter s(100);
  auto a = s.feed("{\"a\":1}\r\n{\"b\"");
  BOOST_REQUIRE_EQUAL(a.size(), 1u);
  BOOST_TEST(a[0].text == "{\"a\":1}");
  auto b = s.feed(":2}\n");
  BOOST_REQUIRE_EQUAL(b.size(), 1u);
  BOOST_TEST(b[0].text == "{\"b\":2}");
  BOOST_TEST(s.feed("tail").empty());
  auto c = s.finish();
  BOOST_REQUIRE_EQUAL(c.size(), 1u);
  BOOST_TEST(c[0].text == "tail");
}

BOOST_AUTO_TEST_CASE(overlong_line_is_reported_once_and_the_next_line_survives) {
  LineSplitter s(10);
  std::vector<LineSplitter::Line> all;
  for (const char* chunk : {"0123456", "789abcdef", "ghij", "klm\n{\"ok\":1}\n"}) {
    for (auto& l : s.feed(chunk)) all.push_back(l);
  }
  BOOST_REQUIRE_EQUAL(all.size(), 2u);
  BOOST_TEST(all[0].overlong);
  BOOST_TEST(all[1].text == "{\"ok\":1}");
  // Exactly at the bound is fine.
  auto ok = s.feed("0123456789\n");
  BOOST_REQUIRE_EQUAL(ok.size(), 1u);
  BOOST_TEST(!ok[0].overlong);
}

BOOST_AUTO_TEST_CASE(parse_error_has_code_32700_and_a_null_id) {
  Harness h;
  h.d.handle_line("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kParseError);
  BOOST_TEST(h.sent[0]["id"].is_null());
}

BOOST_AUTO_TEST_CASE(invalid_requests_get_32600) {
  Harness h;
  h.d.handle_line("42");
  h.d.handle_line(R"({"id": 1, "method": "echo"})");                       // no jsonrpc
  h.d.handle_line(R"({"jsonrpc": "1.0", "id": 2, "method": "echo"})");     // wrong version
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 3, "method": 7})");          // method not a string
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": null, "method": "echo"})");  // MCP: no null ids
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": {"x": 1}, "method": "echo"})");
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 4, "method": "echo", "params": 5})");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 7u);
  for (const auto& m : h.sent) {
    BOOST_TEST(error_code(m) == kInvalidRequest, m.dump());
  }
  BOOST_TEST(h.sent[1]["id"] == 1);
  BOOST_TEST(h.sent[2]["id"] == 2);
  BOOST_TEST(h.sent[5]["id"].is_null());  // an id we cannot echo is answered with null
}

BOOST_AUTO_TEST_CASE(unknown_method_is_32601_and_unknown_notification_is_silent) {
  Harness h;
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": "a", "method": "nope"})");
  h.d.handle_line(R"({"jsonrpc": "2.0", "method": "notifications/nope"})");
  h.d.handle_line(R"({"jsonrpc": "2.0", "method": "echo", "params": {"x": 1}})");  // no id
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kMethodNotFound);
  BOOST_TEST(h.sent[0]["id"] == "a");
}

BOOST_AUTO_TEST_CASE(responses_from_the_client_are_ignored_and_blank_lines_too) {
  Harness h;
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 9, "result": {}})");
  h.d.handle_line("   ");
  BOOST_TEST(h.sent.empty());
}

BOOST_AUTO_TEST_CASE(a_request_is_answered_with_its_own_id) {
  Harness h;
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 12, "method": "echo", "params": {"v": [1, 2]}})");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(h.sent[0]["id"] == 12);
  BOOST_TEST(h.sent[0]["jsonrpc"] == "2.0");
  BOOST_TEST(h.sent[0]["result"] == (json{{"v", {1, 2}}}));
}

BOOST_AUTO_TEST_CASE(batches_are_refused_unless_allowed) {
  Harness h;
  h.d.handle_line(R"([{"jsonrpc": "2.0", "id": 1, "method": "echo"}])");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  BOOST_TEST(h.sent[0]["error"]["message"].get<std::string>().find("2025-06-18") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_batch_is_answered_as_one_array_after_its_last_member) {
  Harness h;
  h.d.set_allow_batch(true);
  h.d.handle_line(
      R"([{"jsonrpc": "2.0", "id": 1, "method": "echo", "params": [1]},
          {"jsonrpc": "2.0", "method": "echo"},
          {"jsonrpc": "2.0", "id": 2, "method": "later"},
          {"jsonrpc": "2.0", "id": 3, "method": "missing"},
          17])");
  BOOST_TEST(h.sent.empty());  // `later` has not answered yet
  BOOST_REQUIRE_EQUAL(h.pending.size(), 1u);
  h.pending[0](make_result(2, "done"));
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  const json& arr = h.sent[0];
  BOOST_REQUIRE(arr.is_array());
  BOOST_REQUIRE_EQUAL(arr.size(), 4u);  // the notification gets nothing
  int results = 0, errors = 0;
  for (const auto& m : arr) {
    (m.contains("result") ? results : errors)++;
  }
  BOOST_TEST(results == 2);
  BOOST_TEST(errors == 2);
}

BOOST_AUTO_TEST_CASE(empty_batch_and_notification_only_batch) {
  Harness h;
  h.d.set_allow_batch(true);
  h.d.handle_line("[]");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  h.d.handle_line(R"([{"jsonrpc": "2.0", "method": "echo"}])");
  BOOST_TEST(h.sent.size() == 1u);  // nothing more
}

BOOST_AUTO_TEST_CASE(overlong_line_error_names_the_bound) {
  Harness h;
  h.d.handle_overlong(kMaxLineBytes);
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  BOOST_TEST(h.sent[0]["error"]["message"].get<std::string>().find("16777216") !=
             std::string::npos);
}

// Found by the hostile-input test: 100 000 nested arrays in params overflowed the stack of the
// daemon's connection thread (nlohmann copies and serializes recursively).
BOOST_AUTO_TEST_CASE(a_message_nested_deeper_than_the_bound_is_refused_unparsed) {
  Harness h;
  std::string deep = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"d\":" +
                     std::string(100000, '[') + std::string(100000, ']') + "}}";
  h.d.handle_line(deep);
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  BOOST_TEST(h.sent[0]["id"].is_null());
  BOOST_TEST(h.sent[0]["error"]["message"].get<std::string>().find("deeper than 512 levels") !=
             std::string::npos);
  // At the bound it is served; brackets inside strings do not count.
  std::string ok = "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":" +
                   std::string(kMaxDepth - 1, '[') + "\"[[[[\\\"[[\"" +
                   std::string(kMaxDepth - 1, ']') + "}";
  h.sent.clear();
  h.d.handle_line(ok);
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(h.sent[0].contains("result"), h.sent[0].dump().substr(0, 200));
  BOOST_TEST(nesting_depth("[{\"a\":\"[{\"}]") == 2u);
}

// Failure fixed (a review, session 13): a line of many small values (`[{},{},…]`, 16 MiB)
// took ~450 MB to parse, and a 559 KB batch of 10 000 requests grew the daemon by 1 GB and
// made a 190 MB reply. A line with more than kMaxValues values is refused unparsed, a batch of
// more than kMaxBatch requests is refused whole and runs none of them.
BOOST_AUTO_TEST_CASE(a_line_of_too_many_values_and_an_oversized_batch_are_refused) {
  Harness h;
  int echoed = 0;
  h.d.on("count", [&](const Request& r, Reply reply) {
    ++echoed;
    reply(make_result(r.id, 1));
  });
  std::string many = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":[";
  for (size_t i = 0; i < kMaxValues; ++i) many += i == 0 ? "{}" : ",{}";
  many += "]}";
  h.d.handle_line(many);
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  BOOST_TEST(h.sent[0]["id"].is_null());
  BOOST_TEST(h.sent[0]["error"]["message"].get<std::string>().find("more than 65536 values") !=
                 std::string::npos,
             h.sent[0].dump());
  // Commas and brackets inside strings are not values: one long string is served.
  h.sent.clear();
  h.d.handle_line("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":[\"" +
                  std::string(200000, ',') + "[{\"]}");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(h.sent[0].contains("result"));
  BOOST_TEST(value_count("[1,\"a,b\",{\"c\":[2,3]}]") == 7u);

  h.d.set_allow_batch(true);
  auto batch = [](size_t n) {
    std::string b = "[";
    for (size_t i = 0; i < n; ++i) {
      b += (i ? "," : "") + std::string("{\"jsonrpc\":\"2.0\",\"id\":") + std::to_string(i) +
           ",\"method\":\"count\"}";
    }
    return b + "]";
  };
  h.sent.clear();
  h.d.handle_line(batch(kMaxBatch + 1));
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  BOOST_TEST(
      h.sent[0]["error"]["message"].get<std::string>().find("at most 64") != std::string::npos,
      h.sent[0].dump());
  BOOST_TEST(echoed == 0);
  h.sent.clear();
  h.d.handle_line(batch(kMaxBatch));
  BOOST_REQUIRE_EQUAL(h.sent.size(), 1u);
  BOOST_REQUIRE(h.sent[0].is_array());
  BOOST_TEST(h.sent[0].size() == kMaxBatch);
  BOOST_TEST(echoed == static_cast<int>(kMaxBatch));
}

// The last resort: a handler that reads a field with the wrong type (nlohmann throws) costs
// that one message an internal error; the dispatcher keeps answering.
BOOST_AUTO_TEST_CASE(a_throwing_handler_gets_an_internal_error_and_the_next_message_works) {
  Harness h;
  h.d.on("typed", [](const Request& r, Reply reply) {
    reply(make_result(r.id, r.params.at("n").get<int>() + 1));  // throws on a string
  });
  h.d.on_notification("notifications/typed",
                      [](const Request& r) { (void)r.params.at("n").get<int>(); });
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 1, "method": "typed", "params": {"n": "x"}})");
  h.d.handle_line(R"({"jsonrpc": "2.0", "method": "notifications/typed", "params": {}})");
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 2, "method": "typed", "params": {"n": 41}})");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 2u);
  BOOST_TEST(error_code(h.sent[0]) == kInternalError);
  BOOST_TEST(h.sent[0]["id"] == 1);
  std::string msg = h.sent[0]["error"]["message"];
  BOOST_TEST(msg.find("typed") != std::string::npos, msg);
  BOOST_TEST(h.sent[1]["result"] == 42);
}

// A key twice in one object is refused with the request's id, nothing of it run: JSON parsers
// disagree on which one wins, so a filter in front of cordon could read another argv than the
// one cordon ran (a review, session 34: the last one won, silently).
BOOST_AUTO_TEST_CASE(a_key_twice_in_one_object_is_refused_and_nothing_runs) {
  Harness h;
  int ran = 0;
  h.d.on("count", [&ran](const Request& r, Reply reply) {
    ++ran;
    reply(make_result(r.id, r.params));
  });
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": 7, "method": "count", "method": "echo"})");
  h.d.handle_line(R"({"jsonrpc": "2.0", "id": "s", "method": "count", "params": {"arguments": )"
                  R"({"argv": ["/bin/echo"], "argv": ["/bin/sleep", "9"]}}})");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 2u);
  BOOST_TEST(error_code(h.sent[0]) == kInvalidRequest);
  BOOST_TEST(h.sent[0]["id"] == 7);
  BOOST_TEST(h.sent[0]["error"]["message"].get<std::string>().find("the key `method` appears "
                                                                   "twice") != std::string::npos);
  BOOST_TEST(h.sent[1]["id"] == "s");
  BOOST_TEST(h.sent[1]["error"]["message"].get<std::string>().find("`argv` appears twice") !=
             std::string::npos);
  BOOST_TEST(ran == 0);
  // The same key in two objects, and in an array's objects, is fine.
  h.d.handle_line(
      R"({"jsonrpc": "2.0", "id": 8, "method": "count", "params": {"a": {"x": 1}, "b": {"x": 2}, )"
      R"("c": [{"x": 1}, {"x": 2}]}})");
  BOOST_REQUIRE_EQUAL(h.sent.size(), 3u);
  BOOST_TEST(h.sent[2].contains("result"), h.sent[2].dump());
  BOOST_TEST(ran == 1);
}
