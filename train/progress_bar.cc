#include "train/progress_bar.h"

#include <fmt/format.h>

#include <string>

namespace loom::train {

ProgressBar::ProgressBar(bool enabled) : tty_(enabled ? std::fopen("/dev/tty", "w") : nullptr) {}

ProgressBar::~ProgressBar() {
  if (tty_) {
    std::fputs("\r\033[K", tty_);
    std::fclose(tty_);
  }
}

void ProgressBar::update(int step, int steps, double loss, double tokens_per_s) {
  if (!tty_) return;
  constexpr int kWidth = 30;
  const int filled = steps > 0 ? kWidth * (step + 1) / steps : kWidth;
  fmt::print(tty_, "\r\033[K[{}{}] {}/{} loss {:.4f} {:.0f} tok/s", std::string(filled, '#'),
             std::string(kWidth - filled, '.'), step + 1, steps, loss, tokens_per_s);
  std::fflush(tty_);
}

void ProgressBar::clear() {
  if (tty_) std::fputs("\r\033[K", tty_), std::fflush(tty_);
}

}  // namespace loom::train
