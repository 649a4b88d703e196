// ZBV (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", the zero-bubble V
// schedule; torch's ScheduleZBVZeroBubble): two stages per rank in a V (rank r holds stage r on
// the way down and 2p - 1 - r on the way up), every backward split into I and W. The first
// rank's forwards run down to the last rank and straight back up through the second stages on
// the same ranks, so the loss — on rank 0 — comes early, and each W fills the slot where a rank
// would wait for a gradient.
#include <algorithm>

#include "parallel/pipeline/communication.h"
#include "parallel/pipeline/schedule_checks.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule zbv_schedule(int num_ranks, int num_microbatches) {
  detail::check_ranks_and_microbatches("zbv_schedule", num_ranks, num_microbatches);
  const int p = num_ranks, m = num_microbatches;
  // The pattern is written for at least 2p - 1 microbatches (the warm-up fills both stages of
  // every rank); with fewer, the same order without the microbatches beyond m (each dependency
  // is within one microbatch, so what stays is still in order, and the validator proves it).
  const int n = std::max(m, 2 * p - 1);
  std::vector<std::vector<Action>> compute(p);
  for (int rank = 0; rank < p; ++rank) {
    const int down = rank, up = 2 * p - 1 - rank;
    auto& ops = compute[rank];
    const auto add = [&](ActionKind kind, int stage, int mb) {
      if (mb < m) ops.push_back({kind, stage, mb});
    };
    int f_down = 0, f_up = 0, b_down = 0, b_up = 0;
    const auto split_backward = [&](int stage, int& count) {
      add(ActionKind::kBackwardInput, stage, count);
      add(ActionKind::kBackwardWeight, stage, count);
      ++count;
    };
    // Warm-up: forwards down until the first microbatch comes back up, then the up stage's
    // forwards, each followed at once by its backward (the loss is one stage away on rank 0; the
    // gradient is next for the other ranks as it turns).
    for (int i = 0; i < 2 * (p - rank) - 1; ++i) add(ActionKind::kForward, down, f_down++);
    for (int i = 0; i < rank; ++i) {
      add(ActionKind::kForward, up, f_up++);
      add(ActionKind::kForward, down, f_down++);
    }
    for (int i = 0; i < p - rank; ++i) {
      add(ActionKind::kForward, up, f_up++);
      split_backward(up, b_up);
    }
    // Steady state: F I W on the down stage, then on the up stage.
    while (f_up < f_down || f_down < n) {
      if (f_down < n) add(ActionKind::kForward, down, f_down++);
      split_backward(down, b_down);
      add(ActionKind::kForward, up, f_up++);
      split_backward(up, b_up);
    }
    // Cool-down: the gradients' way back up the ranks; the W's wait for idle slots.
    int w_down = b_down, w_up = b_up;
    for (int i = 0; i < rank; ++i) {
      add(ActionKind::kBackwardInput, down, b_down++);
      add(ActionKind::kBackwardInput, up, b_up++);
    }
    for (int i = 0; i < p - rank; ++i) {
      add(ActionKind::kBackwardInput, down, b_down++);
      add(ActionKind::kBackwardWeight, down, w_down++);
    }
    while (w_up < b_up) add(ActionKind::kBackwardWeight, up, w_up++);
    while (w_down < b_down) add(ActionKind::kBackwardWeight, down, w_down++);
  }
  return add_communication("ZBV", p, 2 * p, m, compute, StagePlacement::kV);
}

}  // namespace loom::pipeline
