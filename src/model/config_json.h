// Typed fields of a config.json object, each error naming the file (`path`) and the field. Shared by
// the target's and the draft's config parsers.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace aerie::config_json {

/// A positive integer field; throws when missing (or null), not an integer or <= 0.
inline int64_t required_int(const nlohmann::json& j, const char* key, const std::string& path) {
  AERIE_CHECK(j.contains(key) && !j[key].is_null(), path << ": config lacks \"" << key << "\"");
  AERIE_CHECK(j[key].is_number_integer(), path << ": field \"" << key << "\" is not an integer: " << j[key].dump());
  int64_t v = j[key].get<int64_t>();
  AERIE_CHECK(v > 0, path << ": field \"" << key << "\" must be positive, got " << v);
  return v;
}

/// An integer field, `fallback` when absent or null; throws when it is not an integer.
inline int64_t optional_int(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  AERIE_CHECK(j[key].is_number_integer(), path << ": field \"" << key << "\" is not an integer");
  return j[key].get<int64_t>();
}

/// A number field, `fallback` when absent or null; throws when it is not a number.
inline double optional_double(const nlohmann::json& j, const char* key, double fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  AERIE_CHECK(j[key].is_number(), path << ": field \"" << key << "\" is not a number");
  return j[key].get<double>();
}

/// A boolean field, `fallback` when absent or null; throws when it is not a boolean.
inline bool optional_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  AERIE_CHECK(j[key].is_boolean(), path << ": field \"" << key << "\" is not a boolean");
  return j[key].get<bool>();
}

/// A string field, `fallback` when absent or null; throws when it is not a string.
inline std::string optional_string(const nlohmann::json& j, const char* key, const std::string& fallback,
                                   const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  AERIE_CHECK(j[key].is_string(), path << ": field \"" << key << "\" is not a string");
  return j[key].get<std::string>();
}

}  // namespace aerie::config_json
