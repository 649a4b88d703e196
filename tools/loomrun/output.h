// loomrun's own writes to its stdout and stderr.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <string_view>

namespace loom::loomrun {

// Writes all of `bytes` to `fd`, retrying on EINTR and waiting when the descriptor is
// non-blocking and full. Gives up silently when the reader is gone (EPIPE) or on another error:
// losing output must not stop the supervision of the ranks.
void write_all(int fd, std::string_view bytes);

// Writes "loomrun: <message>\n" to stderr.
template <typename... Args>
void log_line(fmt::format_string<Args...> format, Args&&... args) {
  write_all(STDERR_FILENO,
            fmt::format("loomrun: {}\n", fmt::format(format, std::forward<Args>(args)...)));
}

}  // namespace loom::loomrun
