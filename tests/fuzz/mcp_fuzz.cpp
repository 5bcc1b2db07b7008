// The MCP server's message handling (src/api/mcp.cpp) on a real engine: each input is a whole
// connection's bytes, served by serve_mcp_connection() from a memfd to a memfd. The engine has
// no policy, so every start is refused in-band and nothing is ever spawned. Invariants:
//  - the server returns 0 and its output is only JSON-RPC: one JSON value per line, each an
//    object (or a batch array of objects) with "jsonrpc": "2.0";
//  - every response echoes an id the input sent (or null), has exactly one of result/error,
//    and an error has an integer code and a message;
//  - a well-formed request on a line of its own gets exactly one response (unless the input
//    also cancels something), and no id is answered more often than it was asked;
//  - the shared engine keeps answering afterwards.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "api/mcp.hpp"
#include "base/log.hpp"
#include "cordon/engine.hpp"
#include "fuzz/fuzz_check.hpp"

namespace {

using cordon::fuzz::show;
using json = nlohmann::json;

std::shared_ptr<cordon::Engine> g_engine;

std::string id_key(const json& id) { return id.dump(); }

bool valid_request(const json& m) {
  return m.is_object() && m.contains("jsonrpc") && m["jsonrpc"] == "2.0" && m.contains("method") &&
         m["method"].is_string() && m.contains("id") &&
         (m["id"].is_string() || m["id"].is_number_integer()) &&
         (!m.contains("params") || m["params"].is_object() || m["params"].is_array());
}

std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  off_t off = 0;
  for (;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    FUZZ_CHECK(n >= 0, "pread the server's output");
    if (n == 0) {
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
    off += n;
  }
}

void check_response(const json& r, const std::map<std::string, int>& asked) {
  FUZZ_CHECK(r.is_object(), "a message that is not an object: {}", r.dump());
  FUZZ_CHECK(r.contains("jsonrpc") && r["jsonrpc"] == "2.0", "no jsonrpc 2.0: {}", r.dump());
  if (r.contains("method")) {
    FUZZ_CHECK(!r.contains("id"), "the server sent a request: {}", r.dump());
    return;  // a notification (log, progress, list_changed)
  }
  FUZZ_CHECK(r.contains("id"), "a response without an id: {}", r.dump());
  FUZZ_CHECK(r["id"].is_null() || asked.contains(id_key(r["id"])),
             "a response to id {} that was never sent", r["id"].dump());
  FUZZ_CHECK(r.contains("result") != r.contains("error"), "result and error: {}", r.dump());
  if (r.contains("error")) {
    const json& e = r["error"];
    FUZZ_CHECK(e.is_object() && e.contains("code") && e["code"].is_number_integer() &&
                   e.contains("message") && e["message"].is_string() &&
                   !e["message"].get<std::string>().empty(),
               "a malformed error: {}", r.dump());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cordon::log::silence_all();
  const char* spawner = ::getenv("CORDON_SPAWNER");
  const char* init = ::getenv("CORDON_INIT");
  const char* seccomp = ::getenv("CORDON_SECCOMP_DIR");
  if (spawner == nullptr || init == nullptr || seccomp == nullptr) {
    std::fprintf(stderr, "mcp_fuzz: set CORDON_SPAWNER, CORDON_INIT, CORDON_SECCOMP_DIR\n");
    std::exit(2);
  }
  // Under $TMPDIR: tools/fuzz.sh gives each run its own and removes it afterwards.
  const char* tmp = ::getenv("TMPDIR");
  std::string dir =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/cordon-mcp-fuzz.XXXXXX";
  FUZZ_CHECK(::mkdtemp(dir.data()) != nullptr, "mkdtemp under {}", dir);
  cordon::EngineOptions o;
  o.state_dir = dir + "/state";
  o.spawner_path = spawner;
  o.init_path = init;
  o.default_seccomp_profile = std::string(seccomp) + "/default.json";
  auto e = cordon::Engine::open(o);
  FUZZ_CHECK(e.has_value(), "open the engine: {}", e ? "" : e.error().message());
  g_engine = std::move(*e);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int in = ::memfd_create("mcp-in", MFD_CLOEXEC);
  int out = ::memfd_create("mcp-out", MFD_CLOEXEC);
  FUZZ_CHECK(in >= 0 && out >= 0, "memfd_create");
  FUZZ_CHECK(::write(in, data, size) == static_cast<ssize_t>(size), "write the input");
  FUZZ_CHECK(::lseek(in, 0, SEEK_SET) == 0, "lseek");
  cordon::api::ConnectionLimits limits;
  limits.max_calls = 4;
  int rc = cordon::api::serve_mcp_connection(g_engine, "fuzz", in, out, limits);
  FUZZ_CHECK(rc == 0, "the server returned {}", rc);

  // What the input asked, by id.
  std::string input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, int> asked, must;
  bool cancels = false;  // a cancelled request gets no response
  size_t pos = 0;
  while (pos <= input.size()) {
    size_t nl = input.find('\n', pos);
    std::string line = input.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    json m = json::parse(line, nullptr, false);
    if (!m.is_discarded()) {
      for (const json& x : m.is_array() ? m : json::array({m})) {
        if (x.is_object() && x.contains("id")) {
          ++asked[id_key(x["id"])];
        }
        if (x.is_object() && x.contains("method") && x["method"] == "notifications/cancelled") {
          cancels = true;
        }
      }
      // A message whose id is a key twice is refused without an id (which one was meant is
      // unknown): nothing to require for it.
      int top_ids = 0, open_objects = 0;
      json::parser_callback_t count_ids = [&](int, json::parse_event_t event, json& k) {
        if (event == json::parse_event_t::object_start) {
          ++open_objects;
        } else if (event == json::parse_event_t::object_end) {
          --open_objects;
        } else if (event == json::parse_event_t::key && open_objects == 1 && k == "id") {
          ++top_ids;
        }
        return true;
      };
      (void)json::parse(line, count_ids, false);
      if (valid_request(m) && top_ids <= 1) {
        ++must[id_key(m["id"])];
      }
    }
    if (nl == std::string::npos) {
      break;
    }
    pos = nl + 1;
  }

  std::string output = read_all(out);
  ::close(in);
  ::close(out);
  std::map<std::string, int> answered;
  pos = 0;
  while (pos < output.size()) {
    size_t nl = output.find('\n', pos);
    FUZZ_CHECK(nl != std::string::npos, "the output ends without a newline: `{}`",
               show(output.substr(pos)));
    std::string line = output.substr(pos, nl - pos);
    pos = nl + 1;
    json m = json::parse(line, nullptr, false);
    FUZZ_CHECK(!m.is_discarded(), "an output line is not JSON: `{}`", show(line));
    if (m.is_array()) {
      FUZZ_CHECK(!m.empty(), "an empty batch response");
    }
    for (const json& r : m.is_array() ? m : json::array({m})) {
      check_response(r, asked);
      if (!r.contains("method") && !r["id"].is_null()) {
        ++answered[id_key(r["id"])];
      }
    }
  }
  for (const auto& [id, n] : answered) {
    FUZZ_CHECK(n <= asked[id], "id {} answered {} times, asked {}", id, n, asked[id]);
  }
  if (!cancels) {
    for (const auto& [id, n] : must) {
      FUZZ_CHECK(answered[id] >= n, "request id {} sent {} times, answered {}", id, n,
                 answered[id]);
    }
  }
  auto list = g_engine->list("fuzz", std::nullopt);
  FUZZ_CHECK(list.has_value(), "the engine stopped answering: {}",
             list ? "" : list.error().message());
  return 0;
}
