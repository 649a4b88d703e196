// loom::Error and the check macros every layer uses.
//
// Two families, on purpose:
//   LOOM_CHECK(cond, fmt, args...)   a *user* error: bad shapes, placements, flags. Throws
//                                    loom::Error whose message names what was given and what
//                                    was expected. Tests match these messages.
//   LOOM_INTERNAL_ASSERT(cond, ...)  a *library* bug: an invariant Loom itself broke. Throws
//                                    loom::InternalError, tagged with file:line, so a bug report
//                                    points at the code rather than at the caller.
// Library code never calls exit() or abort(): a failing rank must be able to report, and its
// peers must be able to fail with a named error instead of hanging.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace loom {

// A user-facing error: the message says what was given and what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A user error found once a process is running that the same command would meet again (a
// checkpoint folder another job holds): a job exits 2 on it, as on a bad flag, and launchers do
// not restart it.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(message) {}
};

// A broken internal invariant (a bug in Loom, not in the caller's input).
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message) : Error(message) {}
};

namespace detail {
[[noreturn]] void throw_error(std::string message);
[[noreturn]] void throw_internal_error(const char* file, int line, const char* condition,
                                       std::string message);
}  // namespace detail

}  // namespace loom

// Throws loom::Error(fmt::format(...)) when `cond` is false. The format arguments are evaluated
// only on failure, so checks on hot paths cost one branch.
#define LOOM_CHECK(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) [[unlikely]] {                                \
      ::loom::detail::throw_error(::fmt::format(__VA_ARGS__)); \
    }                                                          \
  } while (0)

// Throws loom::Error unconditionally; for the branch of a switch that cannot be taken by valid
// input.
#define LOOM_FAIL(...) ::loom::detail::throw_error(::fmt::format(__VA_ARGS__))

#define LOOM_INTERNAL_ASSERT(cond, ...)                                    \
  do {                                                                     \
    if (!(cond)) [[unlikely]] {                                            \
      ::loom::detail::throw_internal_error(__FILE__, __LINE__, #cond,      \
                                           ::fmt::format("" __VA_ARGS__)); \
    }                                                                      \
  } while (0)
