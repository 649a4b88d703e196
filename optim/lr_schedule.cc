#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace loom::optim {

double WarmupCosine::operator()(int step) const {
  LOOM_CHECK(peak_lr > 0, "WarmupCosine: peak_lr must be positive, got {}", peak_lr);
  LOOM_CHECK(warmup_steps >= 0, "WarmupCosine: warmup_steps must be >= 0, got {}", warmup_steps);
  LOOM_CHECK(total_steps > warmup_steps, "WarmupCosine: total_steps {} must exceed warmup_steps {}",
             total_steps, warmup_steps);
  LOOM_CHECK(min_ratio >= 0 && min_ratio <= 1, "WarmupCosine: min_ratio must be in [0, 1], got {}",
             min_ratio);
  LOOM_CHECK(step >= 0, "WarmupCosine: step must be >= 0, got {}", step);
  if (step < warmup_steps) return peak_lr * (step + 1) / warmup_steps;
  // 0 at the first step after warmup, reaching 1 (min_ratio * peak_lr) at total_steps.
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / (total_steps - warmup_steps));
  return peak_lr *
         (min_ratio + (1 - min_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
}

}  // namespace loom::optim
