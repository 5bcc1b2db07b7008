#define BOOST_TEST_MODULE hostile_input
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "helpers/cordon_fixture.hpp"
#include "helpers/daemon_fixture.hpp"
#include "helpers/mcp_client.hpp"

// Every malformed request gets a JSON-RPC error or an in-band refusal with a message, on the
// connection that sent it; none crashes the daemon or disturbs another session's work.

using namespace cordon::test;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

// An MCP client on a daemon session, through `cordon mcp --connect`.
struct Client {
  McpProcess proc;
  Client(const DaemonProcess& d, const std::string& session)
      : proc({cordon_bin(), "mcp", "--connect", d.sock(), "--session", session},
             d.box().base + "/" + session + ".stderr") {
    BOOST_REQUIRE(proc.started());
    auto r = proc.request("initialize", {{"protocolVersion", "2025-06-18"},
                                         {"capabilities", json::object()},
                                         {"clientInfo", {{"name", "hostile"}, {"version", "1"}}}});
    BOOST_REQUIRE_MESSAGE(r.has_value() && r->contains("result"),
                          "no answer to initialize; stderr: " + proc.stderr_text());
    proc.send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  }
  // The next response (notifications skipped).
  std::optional<json> response() {
    for (;;) {
      auto m = proc.next(30s);
      if (!m || !m->contains("method")) {
        return m;
      }
    }
  }
  // The echo of a real command: the session works.
  void runs_a_command(const std::string& word) {
    auto r = proc.request("tools/call",
                          {{"name", "run_command"}, {"arguments", {{"argv", {"/bin/echo", word}}}}},
                          60s);
    BOOST_REQUIRE_MESSAGE(r.has_value() && r->contains("result"), "no result for run_command");
    const json& res = (*r)["result"];
    BOOST_TEST(res.value("isError", true) == false, res.dump());
    BOOST_TEST(res["structuredContent"]["output"]["stdout"].value("content", "") == word + "\n",
               res.dump());
  }
};

enum class Want { kError, kToolError, kNothing, kAnyReply };

struct Case {
  std::string line;
  Want want;
  int code = 0;     // for kError
  json id;          // the id the reply must carry (null for an unreadable one)
  std::string why;  // what the case is
};

std::string deep(size_t n, bool close) {
  std::string s(n, '[');
  if (close) {
    s += std::string(n, ']');
  }
  return s;
}

std::vector<Case> battery() {
  auto req = [](int id, const std::string& method, const std::string& params) {
    return "{\"jsonrpc\":\"2.0\",\"id\":" + std::to_string(id) + ",\"method\":\"" + method +
           "\",\"params\":" + params + "}";
  };
  auto tool = [&](int id, const std::string& name, const std::string& args) {
    return req(id, "tools/call", "{\"name\":\"" + name + "\",\"arguments\":" + args + "}");
  };
  return {
      {"not json", Want::kError, -32700, nullptr, "not JSON"},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"", Want::kError, -32700, nullptr,
       "truncated JSON"},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"x\":\"\xff\xfe\"}}",
       Want::kError, -32700, nullptr, "invalid UTF-8 in a string"},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"x\":1e99999}}",
       Want::kError, -32700, nullptr, "a number that overflows a double"},
      {deep(200000, false), Want::kError, -32600, nullptr, "200000 unclosed brackets"},
      {"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":{\"d\":" + deep(100000, true) +
           "}}",
       Want::kError, -32600, nullptr, "100000 nested arrays in params"},
      {"[]", Want::kError, -32600, nullptr, "an empty batch"},
      {"[{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}]", Want::kError, -32600, nullptr,
       "a batch (removed in 2025-06-18)"},
      {"42", Want::kError, -32600, nullptr, "a number"},
      {"\"ping\"", Want::kError, -32600, nullptr, "a string"},
      {"null", Want::kError, -32600, nullptr, "null"},
      {"{\"id\":4,\"method\":\"ping\"}", Want::kError, -32600, 4, "no jsonrpc member"},
      {"{\"jsonrpc\":\"1.0\",\"id\":5,\"method\":\"ping\"}", Want::kError, -32600, 5,
       "jsonrpc 1.0"},
      {"{\"jsonrpc\":2.0,\"id\":6,\"method\":\"ping\"}", Want::kError, -32600, 6,
       "jsonrpc as a number"},
      {"{\"jsonrpc\":\"2.0\",\"id\":{\"a\":1},\"method\":\"ping\"}", Want::kError, -32600, nullptr,
       "an object id"},
      {"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}", Want::kError, -32600, nullptr,
       "a null id"},
      {"{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", Want::kError, -32600, nullptr,
       "a fractional id"},
      {"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":17}", Want::kError, -32600, 7,
       "a method that is not a string"},
      {"{\"jsonrpc\":\"2.0\",\"id\":8}", Want::kError, -32600, 8, "no method"},
      {req(9, "tools/call", "\"x\""), Want::kError, -32600, 9, "params a string"},
      {req(10, "no/such/method", "{}"), Want::kError, -32601, 10, "an unknown method"},
      {req(11, "tools/call", "{}"), Want::kError, -32602, 11, "tools/call without a name"},
      {req(12, "tools/call", "{\"name\":7}"), Want::kError, -32602, 12, "a numeric tool name"},
      {req(13, "tools/call", "{\"name\":\"no_such_tool\"}"), Want::kError, -32602, 13,
       "an unknown tool"},
      {tool(14, "run_command", "[1]"), Want::kError, -32602, 14, "arguments an array"},
      {req(15, "initialize", "{}"), Want::kError, -32602, 15, "initialize without a version"},
      {req(16, "initialize", "{\"protocolVersion\":5}"), Want::kError, -32602, 16,
       "initialize with a numeric version"},
      {req(17, "logging/setLevel", "{\"level\":\"loud\"}"), Want::kError, -32602, 17,
       "an unknown log level"},
      {req(18, "logging/setLevel", "{\"level\":7}"), Want::kError, -32602, 18,
       "a numeric log level"},
      {req(19, "logging/setLevel", "[]"), Want::kError, -32602, 19, "setLevel params an array"},
      {req(20, "resources/read", "{\"uri\":\"file:///etc/passwd\"}"), Want::kError, -32002, 20,
       "a resource outside cordon://jobs/"},
      {req(21, "resources/read", "{\"uri\":[]}"), Want::kError, -32602, 21, "a non-string uri"},
      {req(22, "resources/subscribe", "{}"), Want::kError, -32602, 22, "subscribe without uri"},
      {tool(23, "run_command", "{\"argv\":\"/bin/echo hi\"}"), Want::kToolError, 0, 23,
       "argv a string"},
      {tool(24, "run_command", "{\"argv\":[]}"), Want::kToolError, 0, 24, "an empty argv"},
      {tool(25, "run_command", "{\"argv\":[\"/bin/sh\",\"-c\",\"id\"]}"), Want::kToolError, 0, 25,
       "a program the policy does not allow"},
      {tool(26, "run_command", "{\"argv\":[\"/bin/echo\"],\"cwd\":\"../../etc\"}"),
       Want::kToolError, 0, 26, "a cwd outside the root"},
      {tool(27, "run_command", "{\"argv\":[\"/bin/echo\"],\"env\":{\"LD_PRELOAD\":\"/x.so\"}}"),
       Want::kToolError, 0, 27, "LD_PRELOAD"},
      {tool(28, "run_command", "{\"argv\":[\"/bin/echo\"],\"timeoutMs\":-1}"), Want::kToolError, 0,
       28, "a negative timeout"},
      {tool(29, "run_command", "{\"argv\":[\"/bin/echo\"],\"bogus\":1}"), Want::kToolError, 0, 29,
       "an unknown argument"},
      {tool(30, "command_status", "{\"taskId\":\"../../etc/passwd\"}"), Want::kToolError, 0, 30,
       "a task id that is a path"},
      {tool(31, "command_output", "{\"taskId\":\"t1\",\"offset\":-5}"), Want::kToolError, 0, 31,
       "a negative offset"},
      {tool(32, "command_output", "{\"taskId\":\"t1\",\"limit\":1e300}"), Want::kToolError, 0, 32,
       "a huge limit"},
      {tool(33, "command_write", "{\"taskId\":\"t1\",\"keys\":[\"C-Enter\"]}"), Want::kToolError, 0,
       33, "a key no terminal can send"},
      {tool(34, "command_wait", "{\"taskIds\":[]}"), Want::kToolError, 0, 34,
       "nothing to wait for"},
      {"{\"jsonrpc\":\"2.0\",\"id\":35,\"result\":{}}", Want::kNothing, 0, nullptr,
       "a response to nothing"},
      {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":5}", Want::kNothing,
       0, nullptr, "a notification with bad params"},
      {"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":"
       "99,\"reason\":42}}",
       Want::kNothing, 0, nullptr, "a cancel with a numeric reason"},
      {"{\"jsonrpc\":\"2.0\",\"method\":\"no/such/notification\"}", Want::kNothing, 0, nullptr,
       "an unknown notification"},
      {"   \t ", Want::kNothing, 0, nullptr, "a blank line"},
      // A key twice in one object is refused (session 34; the last one won before), with the
      // request's id unless the id is the repeated key.
      {"{\"jsonrpc\":\"2.0\",\"id\":36,\"method\":\"ping\",\"id\":37}", Want::kError, -32600,
       nullptr, "a duplicate id"},
      {"{\"jsonrpc\":\"2.0\",\"id\":38,\"method\":\"ping\",\"method\":\"x\"}", Want::kError, -32600,
       38, "a duplicate key"},
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(malformed_requests_get_errors_and_leave_other_sessions_working) {
  DaemonProcess d;
  BOOST_REQUIRE_MESSAGE(d.alive() && std::filesystem::exists(d.sock()), "the daemon did not start");
  Client good(d, "good");
  good.runs_a_command("before");
  Client bad(d, "bad");
  for (const Case& c : battery()) {
    BOOST_TEST_CONTEXT(c.why) {
      BOOST_REQUIRE(bad.proc.send_raw(c.line + "\n"));
      // A ping after every case: a case that must not be answered shows up as a reply that is
      // not the ping's, and a dead server as no reply at all.
      json ping_id = 1000 + bad.proc.allocate_id();
      BOOST_REQUIRE(bad.proc.send({{"jsonrpc", "2.0"}, {"id", ping_id}, {"method", "ping"}}));
      // Tool calls answer from their own threads, so the ping may overtake the case's reply.
      std::optional<json> reply, pong;
      while (!pong || (c.want != Want::kNothing && !reply)) {
        auto m = bad.response();
        BOOST_REQUIRE_MESSAGE(
            m.has_value(), "no reply; the daemon is " + std::string(d.alive() ? "alive" : "dead"));
        if (m->value("id", json()) == ping_id) {
          pong = m;
        } else {
          BOOST_REQUIRE_MESSAGE(c.want != Want::kNothing && !reply,
                                "an unexpected reply: " + m->dump());
          reply = m;
        }
      }
      BOOST_TEST(pong->contains("result"), pong->dump());
      if (c.want == Want::kNothing) {
        continue;
      }
      const json& r = *reply;
      BOOST_TEST(r.value("id", json("(none)")) == c.id, r.dump());
      if (c.want == Want::kError) {
        BOOST_REQUIRE_MESSAGE(r.contains("error") && r["error"].is_object(), r.dump());
        BOOST_TEST(r["error"].value("code", 0) == c.code, r.dump());
        BOOST_TEST(!r["error"].value("message", "").empty(), r.dump());
      } else if (c.want == Want::kToolError) {
        BOOST_REQUIRE_MESSAGE(r.contains("result") && r["result"].is_object(), r.dump());
        const json& res = r["result"];
        BOOST_TEST(res.value("isError", false) == true, res.dump());
        BOOST_REQUIRE_MESSAGE(res.contains("structuredContent") &&
                                  res["structuredContent"].contains("error") &&
                                  res["structuredContent"]["error"].is_object(),
                              res.dump());
        BOOST_TEST(res["structuredContent"]["error"].value("message", "").size() > 10u, res.dump());
      }
    }
  }
  BOOST_TEST(d.alive());
  good.runs_a_command("after");
  bad.runs_a_command("still");
}

BOOST_AUTO_TEST_CASE(malformed_handshakes_are_refused_and_the_daemon_keeps_serving) {
  DaemonProcess d;
  BOOST_REQUIRE(d.alive());
  const char* lines[] = {
      "{\"cordon\":5,\"session\":\"x\"}",
      "{\"cordon\":\"connect\",\"session\":5}",
      "{\"cordon\":\"connect\",\"session\":\"../x\"}",
      "[1,2,3]",
      "\xff\xfe",
      "{\"cordon\":[\"connect\"]}",
      "{\"cordon\":null}",
  };
  for (const char* l : lines) {
    BOOST_TEST_CONTEXT(l) {
      LineClient conn(d.connect_fd());
      BOOST_REQUIRE(conn.fd() >= 0);
      BOOST_REQUIRE(conn.send_raw(std::string(l) + "\n"));
      std::string reply = conn.line().value_or("");
      conn.close();
      json r = json::parse(reply, nullptr, false);
      BOOST_TEST(r.is_object(), reply);
      if (r.is_object()) {
        BOOST_TEST(r.value("ok", true) == false, reply);
        BOOST_TEST(r.value("error", "").find("first line must be") != std::string::npos, reply);
      }
      BOOST_TEST(d.alive());
    }
  }
  Client after(d, "after");
  after.runs_a_command("served");
}

// A cancel whose reason is not a string, for a call in flight: the server logs the reason, and
// reading it must not throw (it ended the daemon, every session with it).
BOOST_AUTO_TEST_CASE(a_cancel_with_a_numeric_reason_cancels_the_call) {
  DaemonProcess d;
  BOOST_REQUIRE(d.alive());
  Client c(d, "cancel");
  auto bg = c.proc.request(
      "tools/call", {{"name", "run_command_bg"}, {"arguments", {{"argv", {"/bin/sleep", "60"}}}}});
  BOOST_REQUIRE(bg.has_value() && bg->contains("result"));
  std::string task = (*bg)["result"]["structuredContent"].value("taskId", "");
  BOOST_REQUIRE(!task.empty());
  json wait_id = 700;
  BOOST_REQUIRE(c.proc.send(
      {{"jsonrpc", "2.0"},
       {"id", wait_id},
       {"method", "tools/call"},
       {"params",
        {{"name", "command_wait"}, {"arguments", {{"taskIds", {task}}, {"timeoutMs", 60000}}}}}}));
  BOOST_REQUIRE(c.proc.send({{"jsonrpc", "2.0"},
                             {"method", "notifications/cancelled"},
                             {"params", {{"requestId", wait_id}, {"reason", 42}}}}));
  auto pong = c.proc.request("ping");
  BOOST_REQUIRE_MESSAGE(pong.has_value(), "no answer after the cancel; the daemon is " +
                                              std::string(d.alive() ? "alive" : "dead"));
  auto killed =
      c.proc.request("tools/call", {{"name", "command_kill"}, {"arguments", {{"taskId", task}}}});
  BOOST_TEST(killed.has_value());
  BOOST_TEST(d.alive());
  Client other(d, "other");
  other.runs_a_command("alive");
}
