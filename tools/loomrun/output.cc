#include "tools/loomrun/output.h"

#include <poll.h>

#include <cerrno>

namespace loom::loomrun {

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t written = write(fd, bytes.data(), bytes.size());
    if (written > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(written));
    } else if (written < 0 && errno == EINTR) {
      continue;
    } else if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd waiting{fd, POLLOUT, 0};
      poll(&waiting, 1, 1000);
    } else {
      return;  // EPIPE or another error: drop the output
    }
  }
}

}  // namespace loom::loomrun
