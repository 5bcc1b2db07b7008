#pragma once

// A validator for the subset of JSON Schema (draft 2020-12) the tool table uses: type (one or
// a list), properties, required, additionalProperties (bool or schema), items, enum, const,
// minimum, maximum, minLength, maxLength, minItems, maxItems, anyOf. Keywords outside the
// subset are ignored, so a schema that uses one is a bug the tool-table test catches
// (schema_keywords_are_supported). No dependency: the tools layer and the tests share it.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cordon::api {

struct SchemaIssue {
  std::string pointer;  // RFC 6901 pointer of the offending value, "" for the root
  std::string message;
};

/// Every issue of `value` against `schema`; empty when it validates.
[[nodiscard]] std::vector<SchemaIssue> validate_schema(const nlohmann::json& schema,
                                                       const nlohmann::json& value);

/// The issues as one line for a model: "`/argv/0`: expected string, got number; …".
std::string describe_issues(const std::vector<SchemaIssue>& issues, size_t max = 5);

/// The keywords of `schema` (recursively) outside the supported subset, as pointers.
std::vector<std::string> unsupported_keywords(const nlohmann::json& schema);

}  // namespace cordon::api
