#include "base/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace loom {

namespace {
LogLevel parse_level(const char* text) {
  if (text == nullptr) return LogLevel::kInfo;
  const std::string value(text);
  if (value == "debug") return LogLevel::kDebug;
  if (value == "warn") return LogLevel::kWarn;
  if (value == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}
constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error"};
}  // namespace

LogLevel log_threshold() {
  static const LogLevel threshold = parse_level(std::getenv("LOOM_LOG_LEVEL"));
  return threshold;
}

void log_line(LogLevel level, std::string_view message) {
  // One fprintf per line under a lock so lines from rank threads never interleave mid-line.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[loom %s] %.*s\n", kLevelNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace loom
