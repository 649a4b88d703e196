#include "base/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.h"

namespace loom {

namespace {
// LOOM_LOG_LEVEL's level; none for a value that is not one.
std::optional<LogLevel> parse_level(const char* text) {
  if (text == nullptr || *text == '\0') return LogLevel::kInfo;
  const std::string value(text);
  if (value == "debug") return LogLevel::kDebug;
  if (value == "info") return LogLevel::kInfo;
  if (value == "warn") return LogLevel::kWarn;
  if (value == "error") return LogLevel::kError;
  return std::nullopt;
}
constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error"};
}  // namespace

LogLevel log_threshold() {
  // Logging itself never throws: a bad value logs at info (check_log_level_env names it).
  static const LogLevel threshold =
      parse_level(std::getenv("LOOM_LOG_LEVEL")).value_or(LogLevel::kInfo);
  return threshold;
}

void check_log_level_env() {
  const char* value = std::getenv("LOOM_LOG_LEVEL");
  LOOM_CHECK(parse_level(value).has_value(),
             "LOOM_LOG_LEVEL='{}': expected debug, info, warn or error (the lowest level printed)",
             value);
}

void log_line(LogLevel level, std::string_view message) {
  // One fprintf per line under a lock so lines from rank threads never interleave mid-line.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[loom %s] %.*s\n", kLevelNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace loom
