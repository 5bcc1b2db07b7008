#pragma once

// JSON from a peer, parsed with every key of an object counted once. nlohmann keeps the last
// of duplicate keys silently, so a filter or reviewer in front of cordon could read
// `{"argv": [echo], "argv": [sleep]}` as echo while cordon ran sleep (a review, session 34).
// Callers refuse a message with a duplicate key; the policy file has its own check, which
// also names where in the file the key is (policy.cpp, StrictnessCheck).

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cordon {

struct UniqueKeysParse {
  nlohmann::json value;   // discarded (is_discarded()) when the text is not JSON
  std::string duplicate;  // the first key written twice in one object, or ""
  std::set<std::string> top_level_duplicates;  // keys written twice in the outermost object
};

inline UniqueKeysParse parse_unique_keys(std::string_view text) {
  UniqueKeysParse out;
  std::vector<std::set<std::string>> objects;
  nlohmann::json::parser_callback_t track = [&](int, nlohmann::json::parse_event_t event,
                                                nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      objects.emplace_back();
    } else if (event == Event::object_end && !objects.empty()) {
      objects.pop_back();
    } else if (event == Event::key && !objects.empty() && parsed.is_string() &&
               !objects.back().insert(parsed.get<std::string>()).second) {
      if (objects.size() == 1) {
        out.top_level_duplicates.insert(parsed.get<std::string>());
      }
      if (out.duplicate.empty()) {
        out.duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  out.value = nlohmann::json::parse(text, track, false);
  return out;
}

}  // namespace cordon
