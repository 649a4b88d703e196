#include "base/error.h"

namespace loom::detail {

void throw_error(std::string message) { throw Error(std::move(message)); }

void throw_internal_error(const char* file, int line, const char* condition, std::string message) {
  throw InternalError(
      fmt::format("internal error at {}:{}: `{}` failed{}{} (this is a bug in Loom)", file, line,
                  condition, message.empty() ? "" : ": ", message));
}

}  // namespace loom::detail
