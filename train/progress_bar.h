// A one-line progress bar on the user's terminal. It writes to /dev/tty rather than stdout, so it
// still reaches the terminal when loomrun pipes rank 0's output, and never enters logs or pipes
// (tests, CI: no terminal, no bar).
#pragma once

#include <cstdio>

namespace loom::train {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(int step, int steps, double loss, double tokens_per_s);
  // Clears the bar before a regular line is printed.
  void clear();

 private:
  std::FILE* tty_;
};

}  // namespace loom::train
