// 1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards.
#include <algorithm>

#include "parallel/pipeline/communication.h"
#include "parallel/pipeline/schedule_checks.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule one_f_one_b_schedule(int num_ranks, int num_microbatches) {
  detail::check_ranks_and_microbatches("one_f_one_b_schedule", num_ranks, num_microbatches);
  const int p = num_ranks, m = num_microbatches;
  std::vector<std::vector<Action>> compute(p);
  for (int rank = 0; rank < p; ++rank) {
    // Rank r must have p-1-r forwards in flight before the first gradient can come back to it.
    const int warmup = std::min(p - 1 - rank, m);
    auto& ops = compute[rank];
    int next_forward = 0, next_backward = 0;
    while (next_forward < warmup) ops.push_back({ActionKind::kForward, rank, next_forward++});
    while (next_forward < m) {
      ops.push_back({ActionKind::kForward, rank, next_forward++});
      ops.push_back({ActionKind::kBackward, rank, next_backward++});
    }
    while (next_backward < m) ops.push_back({ActionKind::kBackward, rank, next_backward++});
  }
  return add_communication("1F1B", p, p, m, compute);
}

}  // namespace loom::pipeline
