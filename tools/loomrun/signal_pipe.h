// Turns signals into readable bytes (the self-pipe trick), so the supervision loop can wait for
// output, child exits and SIGINT/SIGTERM in one poll().
#pragma once

#include <csignal>
#include <vector>

#include "tools/loomrun/unique_fd.h"

namespace loom::loomrun {

class SignalPipe {
 public:
  // Installs handlers for `signals`; the previous dispositions come back on destruction. One
  // SignalPipe may exist at a time (the handler writes to a process-wide descriptor).
  explicit SignalPipe(std::vector<int> signals);
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Becomes readable when a signal arrived.
  int fd() const { return read_.get(); }

  // The signals received since the last call, in arrival order (a signal arriving many times
  // before a call may appear once per arrival, or fewer times if the pipe was full).
  std::vector<int> take();

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  UniqueFd read_;
  UniqueFd write_;
};

}  // namespace loom::loomrun
