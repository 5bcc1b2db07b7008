#define BOOST_TEST_MODULE api_tools
#include <boost/test/unit_test.hpp>

#include <set>

#include "api/schema.hpp"
#include "api/tools.hpp"

using namespace cordon::api;

BOOST_AUTO_TEST_CASE(validator_names_the_json_pointer) {
  json schema = {{"type", "object"},
                 {"properties",
                  {{"argv", {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "string"}}}}},
                   {"mode", {{"type", "string"}, {"enum", {"any", "all"}}}},
                   {"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 10}}}}},
                 {"required", {"argv"}},
                 {"additionalProperties", false}};
  BOOST_TEST(validate_schema(schema, {{"argv", {"/bin/true"}}}).empty());
  auto issues = validate_schema(
      schema, {{"argv", {"/bin/echo", 3}}, {"mode", "some"}, {"n", 11}, {"extra", true}});
  BOOST_REQUIRE_EQUAL(issues.size(), 4u);
  std::set<std::string> pointers;
  for (const auto& i : issues) pointers.insert(i.pointer);
  BOOST_TEST(pointers.contains("/argv/1"));
  BOOST_TEST(pointers.contains("/mode"));
  BOOST_TEST(pointers.contains("/n"));
  BOOST_TEST(pointers.contains("/extra"));
  auto missing = validate_schema(schema, json::object());
  BOOST_REQUIRE_EQUAL(missing.size(), 1u);
  BOOST_TEST(missing[0].message.find("argv") != std::string::npos);
  BOOST_TEST(describe_issues(missing).find("`/`") != std::string::npos);
  // JSON Schema counts 2.0 as an integer, and a float is not one.
  BOOST_TEST(validate_schema(schema, {{"argv", {"x"}}, {"n", 2.0}}).empty());
  BOOST_TEST(!validate_schema(schema, {{"argv", {"x"}}, {"n", 2.5}}).empty());
  BOOST_TEST(!validate_schema(schema, json::array()).empty());
}

BOOST_AUTO_TEST_CASE(anyof_and_nullable_types) {
  json schema = {
      {"type", "object"},
      {"properties", {{"a", {{"type", {"integer", "null"}}}}, {"b", {{"type", "string"}}}}},
      {"anyOf", {{{"required", {"a"}}}, {{"required", {"b"}}}}}};
  BOOST_TEST(validate_schema(schema, {{"a", nullptr}}).empty());
  BOOST_TEST(validate_schema(schema, {{"b", "x"}}).empty());
  BOOST_TEST(!validate_schema(schema, json::object()).empty());
  BOOST_TEST(!validate_schema(schema, {{"a", "x"}}).empty());
}

BOOST_AUTO_TEST_CASE(every_tool_has_schemas_in_the_supported_subset) {
  std::set<std::string> names;
  for (const auto& t : tool_table()) {
    names.insert(t.name);
    BOOST_TEST(t.description.size() > 80u, t.name);
    BOOST_TEST(t.input_schema["type"] == "object", t.name);
    BOOST_TEST(t.output_schema["type"] == "object", t.name);
    BOOST_TEST(unsupported_keywords(t.input_schema).empty(), t.name);
    BOOST_TEST(unsupported_keywords(t.output_schema).empty(), t.name);
    BOOST_TEST(t.handle != nullptr);
  }
  for (const char* n : {"run_command_bg", "run_command", "command_status", "command_wait",
                        "command_output", "command_kill", "command_write", "command_resize",
                        "command_list", "command_remove", "retrieve_context"}) {
    BOOST_TEST(names.contains(n), n);
    BOOST_TEST(find_tool(n) != nullptr);
  }
  BOOST_TEST(find_tool("bash") == nullptr);
  // The commands' tools say there is no shell.
  BOOST_TEST(find_tool("run_command")->description.find("no shell") != std::string::npos);
  BOOST_TEST(find_tool("run_command_bg")->description.find("no shell") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(an_error_result_validates_against_every_output_schema) {
  json err = {{"error", {{"code", "refused"}, {"message", "no"}, {"knownTaskIds", {"t1"}}}},
              {"running", 0},
              {"finished", 0}};
  for (const auto& t : tool_table()) {
    auto issues = validate_schema(t.output_schema, err);
    BOOST_TEST(issues.empty(), t.name << ": " << describe_issues(issues));
    // Without the counters it does not.
    BOOST_TEST(!validate_schema(t.output_schema, {{"error", err["error"]}}).empty(), t.name);
  }
}

BOOST_AUTO_TEST_CASE(a_status_validates_against_the_status_tools) {
  cordon::JobStatus s;
  s.task_id = "t1";
  s.argv = {"/bin/echo", "x"};
  s.state = "exited";
  s.exit_code = 0;
  s.started_at = "2025-01-01T00:00:00.000Z";
  s.ended_at = "2025-01-01T00:00:01.000Z";
  s.stdout_artifact = cordon::ArtifactRef{
      .artifact_id = "a1", .task_id = "t1", .stream = "stdout", .size_bytes = 2, .sha256 = "ab"};
  json j = status_json(s);
  j["running"] = 0;
  j["finished"] = 1;
  for (const char* n : {"command_status", "command_kill", "run_command_bg", "run_command"}) {
    auto issues = validate_schema(find_tool(n)->output_schema, j);
    BOOST_TEST(issues.empty(), n << ": " << describe_issues(issues));
  }
  j["bogus"] = 1;
  BOOST_TEST(!validate_schema(find_tool("command_status")->output_schema, j).empty());
}

// Failure fixed (a review, session 29): length and count bounds counted only when the schema
// held them as unsigned JSON numbers, and the tool table writes them as plain (signed) int
// literals, so none was checked: a 15 MB label (kept in meta.json, outside the disk quota),
// a 100000-item argv and a 1000-id command_wait all passed. Lengths count characters.
BOOST_AUTO_TEST_CASE(length_and_count_bounds_of_the_tool_schemas_hold) {
  const json& run = find_tool("run_command_bg")->input_schema;
  BOOST_TEST(
      validate_schema(run, {{"argv", {"/bin/true"}}, {"label", std::string(200, 'a')}}).empty());
  auto label = validate_schema(run, {{"argv", {"/bin/true"}}, {"label", std::string(201, 'a')}});
  BOOST_REQUIRE_EQUAL(label.size(), 1u);
  BOOST_TEST(label[0].pointer == "/label");
  BOOST_TEST(label[0].message == "must be at most 200 characters long");
  // 200 characters of 3 bytes each are 200 characters.
  std::string wide;
  for (int i = 0; i < 200; ++i) wide += "\xe6\x97\xa5";
  BOOST_TEST(validate_schema(run, {{"argv", {"/bin/true"}}, {"label", wide}}).empty());
  BOOST_TEST(!validate_schema(run, {{"argv", {"/bin/true"}}, {"label", wide + "x"}}).empty());
  BOOST_TEST(validate_schema(run, {{"argv", std::vector<std::string>(65536, "x")}}).empty());
  auto many = validate_schema(run, {{"argv", std::vector<std::string>(65537, "x")}});
  BOOST_REQUIRE_EQUAL(many.size(), 1u);
  BOOST_TEST(many[0].pointer == "/argv");
  BOOST_TEST(!validate_schema(run, {{"argv", json::array()}}).empty());  // minItems 1
  const json& wait = find_tool("command_wait")->input_schema;
  BOOST_TEST(validate_schema(wait, {{"taskIds", std::vector<std::string>(64, "t1")}}).empty());
  BOOST_TEST(!validate_schema(wait, {{"taskIds", std::vector<std::string>(65, "t1")}}).empty());
}
