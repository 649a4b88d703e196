// Learning-rate schedules: a pure function of the step, so every rank computes the same rate
// without communication and a resumed run continues where it left off.
//
//   optim::WarmupCosine schedule{.peak_lr = 3e-3, .warmup_steps = 15, .total_steps = 300};
//   opt.set_lr(schedule(step));
#pragma once

namespace loom::optim {

// Linear warmup to peak_lr over warmup_steps (step 0 gets peak_lr / warmup_steps, step
// warmup_steps - 1 the peak), then cosine decay from the peak at step warmup_steps to
// min_ratio * peak_lr at step total_steps, constant after (nanoGPT's and torchtitan's shape).
// Throws naming the field when the fields do not fit (peak_lr <= 0, warmup_steps < 0, total_steps
// <= warmup_steps, min_ratio outside [0, 1]).
struct WarmupCosine {
  double peak_lr = 0;
  int warmup_steps = 0;
  int total_steps = 0;
  double min_ratio = 0.1;

  double operator()(int step) const;
};

}  // namespace loom::optim
