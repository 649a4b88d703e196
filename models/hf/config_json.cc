#include "models/hf/config_json.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace loom::models::hf {

ConfigJson ConfigJson::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "'{}': cannot read it: {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("'{}' is not valid JSON: {}", path, e.what());
  }
  LOOM_CHECK(json.is_object(), "'{}' must hold a JSON object, got {}", path, json.type_name());
  return ConfigJson(std::move(json), "'" + path + "'");
}

ConfigJson::ConfigJson(nlohmann::json json, std::string where)
    : json_(std::move(json)), where_(std::move(where)) {}

const nlohmann::json* ConfigJson::find(std::string_view key) const {
  const auto it = json_.find(std::string(key));
  return it == json_.end() || it->is_null() ? nullptr : &*it;
}

bool ConfigJson::has(std::string_view key) const { return find(key) != nullptr; }

void ConfigJson::wrong_type(std::string_view key, std::string_view expected) const {
  LOOM_FAIL("{}: \"{}\" must be {}, got {}", where_, key, expected, find(key)->dump());
}

void ConfigJson::fail(std::string_view message) const { LOOM_FAIL("{}: {}", where_, message); }

int64_t ConfigJson::positive_int(std::string_view key) const {
  LOOM_CHECK(has(key), "{} has no \"{}\"", where_, key);
  return positive_int_or(key, 0);
}

int64_t ConfigJson::non_negative_int_or(std::string_view key, int64_t fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_number_integer() || value->get<int64_t>() < 0) {
    wrong_type(key, "a non-negative integer");
  }
  return value->get<int64_t>();
}

int64_t ConfigJson::positive_int_or(std::string_view key, int64_t fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_number_integer() || value->get<int64_t>() <= 0) {
    wrong_type(key, "a positive integer");
  }
  return value->get<int64_t>();
}

double ConfigJson::number(std::string_view key) const {
  LOOM_CHECK(has(key), "{} has no \"{}\"", where_, key);
  return number_or(key, 0);
}

double ConfigJson::number_or(std::string_view key, double fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_number() || !std::isfinite(value->get<double>())) wrong_type(key, "a number");
  return value->get<double>();
}

bool ConfigJson::bool_or(std::string_view key, bool fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) wrong_type(key, "true or false");
  return value->get<bool>();
}

std::string ConfigJson::string_or(std::string_view key, const std::string& fallback) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return fallback;
  if (!value->is_string()) wrong_type(key, "a string");
  return value->get<std::string>();
}

std::optional<ConfigJson> ConfigJson::object_or_none(std::string_view key) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_object()) wrong_type(key, "an object");
  return ConfigJson(*value, fmt::format("{}: \"{}\"", where_, key));
}

void ConfigJson::refuse_unless(bool ok, std::string_view key, std::string_view why) const {
  if (ok) return;
  const nlohmann::json* value = find(key);
  LOOM_FAIL("{}: \"{}\" = {}: {}", where_, key, value ? value->dump() : "null", why);
}

}  // namespace loom::models::hf
