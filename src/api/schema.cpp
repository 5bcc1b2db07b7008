#include "api/schema.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>

#include <cmath>
#include <set>

#include <fmt/format.h>

#include "base/json_fields.hpp"
#include "policy/json_pointer.hpp"

namespace cordon::api {
namespace {

using json = nlohmann::json;

std::string child(const std::string& base, const std::string& key) {
  return policy::json_pointer_key(base, key);
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

bool has_type(const json& v, const std::string& t) {
  if (t == "integer") {
    if (v.is_number_integer()) {
      return true;
    }
    // JSON Schema counts 3.0 as an integer.
    return v.is_number_float() && std::isfinite(v.get<double>()) &&
           std::floor(v.get<double>()) == v.get<double>();
  }
  if (t == "number") {
    return v.is_number();
  }
  return t == type_name(v);
}

std::string short_dump(const json& v) {
  std::string s = json_fields::dump(v);
  if (s.size() > 60) {
    s = s.substr(0, 57) + "...";
  }
  return s;
}

void check(const json& schema, const json& v, const std::string& ptr,
           std::vector<SchemaIssue>& out) {
  if (!schema.is_object()) {
    if (schema.is_boolean() && !schema.get<bool>()) {
      out.push_back({ptr, "no value is allowed here"});
    }
    return;
  }
  if (auto t = schema.find("type"); t != schema.end()) {
    std::vector<std::string> types;
    if (t->is_string()) {
      types.push_back(t->get<std::string>());
    } else if (t->is_array()) {
      for (const auto& x : *t) {
        if (x.is_string()) {
          types.push_back(x.get<std::string>());
        }
      }
    }
    bool ok = false;
    for (const auto& x : types) {
      ok = ok || has_type(v, x);
    }
    if (!ok) {
      out.push_back(
          {ptr, fmt::format("expected {}, got {}", fmt::join(types, " or "), type_name(v))});
      return;  // the other keywords would only repeat the mismatch
    }
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    bool found = false;
    for (const auto& x : *e) {
      found = found || x == v;
    }
    if (!found) {
      std::vector<std::string> names;
      for (const auto& x : *e) {
        names.push_back(short_dump(x));
      }
      out.push_back(
          {ptr, fmt::format("must be one of {}, not {}", fmt::join(names, ", "), short_dump(v))});
    }
  }
  if (auto c = schema.find("const"); c != schema.end() && *c != v) {
    out.push_back({ptr, fmt::format("must be {}", short_dump(*c))});
  }
  if (v.is_number()) {
    double d = v.get<double>();
    if (auto m = schema.find("minimum");
        m != schema.end() && m->is_number() && d < m->get<double>()) {
      out.push_back({ptr, fmt::format("must be at least {}", m->dump())});
    }
    if (auto m = schema.find("maximum");
        m != schema.end() && m->is_number() && d > m->get<double>()) {
      out.push_back({ptr, fmt::format("must be at most {}", m->dump())});
    }
  }
  // A bound is any non-negative integer. Failure fixed (a review, session 29): only unsigned
  // JSON numbers counted, and the tool schemas' literals are signed, so no length or count
  // bound was ever checked (a 15 MB label, a 5001-item argv, a 1000-id wait all passed).
  auto bound = [&schema](const char* key) -> std::optional<uint64_t> {
    auto m = schema.find(key);
    if (m == schema.end() || !m->is_number_integer() || m->get<int64_t>() < 0) {
      return std::nullopt;
    }
    return m->get<uint64_t>();
  };
  if (v.is_string()) {
    // Characters (code points) as JSON Schema counts them; the text is valid UTF-8.
    const auto& text = v.get_ref<const std::string&>();
    const uint64_t n = static_cast<uint64_t>(std::count_if(
        text.begin(), text.end(), [](char c) { return (static_cast<uint8_t>(c) & 0xC0) != 0x80; }));
    if (auto m = bound("minLength"); m && n < *m) {
      out.push_back({ptr, fmt::format("must be at least {} characters long", *m)});
    }
    if (auto m = bound("maxLength"); m && n > *m) {
      out.push_back({ptr, fmt::format("must be at most {} characters long", *m)});
    }
  }
  if (v.is_array()) {
    if (auto m = bound("minItems"); m && v.size() < *m) {
      out.push_back({ptr, fmt::format("needs at least {} item(s)", *m)});
    }
    if (auto m = bound("maxItems"); m && v.size() > *m) {
      out.push_back({ptr, fmt::format("takes at most {} items", *m)});
    }
    if (auto it = schema.find("items"); it != schema.end()) {
      for (size_t i = 0; i < v.size(); ++i) {
        check(*it, v[i], ptr + "/" + std::to_string(i), out);
      }
    }
  }
  if (v.is_object()) {
    const json* props = nullptr;
    if (auto p = schema.find("properties"); p != schema.end() && p->is_object()) {
      props = &*p;
    }
    if (auto r = schema.find("required"); r != schema.end() && r->is_array()) {
      for (const auto& k : *r) {
        if (k.is_string() && !v.contains(k.get<std::string>())) {
          out.push_back({ptr, fmt::format("missing required property `{}`", k.get<std::string>())});
        }
      }
    }
    auto extra = schema.find("additionalProperties");
    for (const auto& [k, x] : v.items()) {
      if (props != nullptr && props->contains(k)) {
        check((*props)[k], x, child(ptr, k), out);
      } else if (extra != schema.end()) {
        if (extra->is_boolean() && !extra->get<bool>()) {
          std::vector<std::string> names;
          if (props != nullptr) {
            for (const auto& [name, _] : props->items()) {
              names.push_back(name);
            }
          }
          out.push_back(
              {child(ptr, k), fmt::format("unknown property; known: {}", fmt::join(names, ", "))});
        } else {
          check(*extra, x, child(ptr, k), out);
        }
      }
    }
  }
  if (auto a = schema.find("anyOf"); a != schema.end() && a->is_array()) {
    std::vector<SchemaIssue> first;
    bool any = false;
    for (const auto& branch : *a) {
      std::vector<SchemaIssue> mine;
      check(branch, v, ptr, mine);
      if (mine.empty()) {
        any = true;
        break;
      }
      if (first.empty()) {
        first = std::move(mine);
      }
    }
    if (!any) {
      out.push_back({ptr, fmt::format("matches none of the {} allowed shapes (first: {})",
                                      a->size(), describe_issues(first, 2))});
    }
  }
}

const std::set<std::string>& known_keywords() {
  static const std::set<std::string> k = {
      "type",     "properties", "required",    "additionalProperties",
      "items",    "enum",       "const",       "minimum",
      "maximum",  "minLength",  "maxLength",   "minItems",
      "maxItems", "anyOf",      "description", "default",
      "title",    "$schema",    "examples"};
  return k;
}

void scan(const json& s, const std::string& ptr, std::vector<std::string>& out) {
  if (!s.is_object()) {
    return;
  }
  for (const auto& [k, v] : s.items()) {
    if (!known_keywords().contains(k)) {
      out.push_back(child(ptr, k));
      continue;
    }
    if (k == "properties" && v.is_object()) {
      for (const auto& [name, sub] : v.items()) {
        scan(sub, child(child(ptr, k), name), out);
      }
    } else if ((k == "items" || k == "additionalProperties") && v.is_object()) {
      scan(v, child(ptr, k), out);
    } else if (k == "anyOf" && v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) {
        scan(v[i], child(ptr, k) + "/" + std::to_string(i), out);
      }
    }
  }
}

}  // namespace

std::vector<SchemaIssue> validate_schema(const json& schema, const json& value) {
  std::vector<SchemaIssue> out;
  check(schema, value, "", out);
  return out;
}

std::string describe_issues(const std::vector<SchemaIssue>& issues, size_t max) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < issues.size() && i < max; ++i) {
    parts.push_back(fmt::format("`{}`: {}", issues[i].pointer.empty() ? "/" : issues[i].pointer,
                                issues[i].message));
  }
  if (issues.size() > max) {
    parts.push_back(fmt::format("and {} more", issues.size() - max));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::vector<std::string> unsupported_keywords(const json& schema) {
  std::vector<std::string> out;
  scan(schema, "", out);
  return out;
}

}  // namespace cordon::api
