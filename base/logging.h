// Minimal leveled logging to stderr: LOOM_LOG(warn, "store: dropped client {}", peer).
// Levels below LOOM_LOG_LEVEL (debug|info|warn|error; default info) are skipped cheaply.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace loom {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// The threshold read once from LOOM_LOG_LEVEL (info when unset, or when not a level).
LogLevel log_threshold();
// Throws loom::Error naming LOOM_LOG_LEVEL's value when it is set and not debug, info, warn or
// error (a job checks it before its ranks start).
void check_log_level_env();
void log_line(LogLevel level, std::string_view message);

}  // namespace loom

#define LOOM_LOG_LEVEL_debug ::loom::LogLevel::kDebug
#define LOOM_LOG_LEVEL_info ::loom::LogLevel::kInfo
#define LOOM_LOG_LEVEL_warn ::loom::LogLevel::kWarn
#define LOOM_LOG_LEVEL_error ::loom::LogLevel::kError

#define LOOM_LOG(level, ...)                                                \
  do {                                                                      \
    if (LOOM_LOG_LEVEL_##level >= ::loom::log_threshold()) {                \
      ::loom::log_line(LOOM_LOG_LEVEL_##level, ::fmt::format(__VA_ARGS__)); \
    }                                                                       \
  } while (0)
