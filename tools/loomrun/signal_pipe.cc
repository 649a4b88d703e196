#include "tools/loomrun/signal_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace loom::loomrun {

namespace {

volatile sig_atomic_t g_write_fd = -1;

void on_signal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  if (g_write_fd >= 0) {
    [[maybe_unused]] ssize_t n = write(g_write_fd, &byte, 1);
  }
  errno = saved_errno;
}

}  // namespace

SignalPipe::SignalPipe(std::vector<int> signals) : signals_(std::move(signals)) {
  LOOM_INTERNAL_ASSERT(g_write_fd < 0, "only one SignalPipe may exist at a time");
  int fds[2];
  LOOM_CHECK(pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "cannot create a pipe: {}",
             std::strerror(errno));
  read_.reset(fds[0]);
  write_.reset(fds[1]);
  g_write_fd = write_.get();
  previous_.resize(signals_.size());
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    // SIGCHLD also when a child stops or continues (no SA_NOCLDSTOP): a rank stopped by
    // SIGSTOP is reported, and named when its peers time out waiting for it.
    action.sa_flags = SA_RESTART;
    sigaction(signals_[i], &action, &previous_[i]);
  }
}

SignalPipe::~SignalPipe() {
  for (std::size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
  g_write_fd = -1;
}

std::vector<int> SignalPipe::take() {
  std::vector<int> received;
  unsigned char buffer[64];
  for (;;) {
    const ssize_t got = read(read_.get(), buffer, sizeof(buffer));
    if (got > 0) {
      received.insert(received.end(), buffer, buffer + got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EAGAIN: drained
    }
  }
  return received;
}

}  // namespace loom::loomrun
