// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", handcrafted schedule 1; torch's ZB1P
// with one stage per rank): 1F1B with each backward split into I (the input's gradient, which the
// previous stage waits for) and W (the weights'), rank r running each W r microbatches after its
// I. The later a rank, the more of its W's wait, filling the idle slots 1F1B leaves it while the
// gradients travel back; rank r then holds up to (p - r) + r = p microbatches' activations, 1F1B's
// peak (rank 0's), on every rank.
#include <algorithm>
#include <deque>

#include "parallel/pipeline/communication.h"
#include "parallel/pipeline/schedule_checks.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule zb_h1_schedule(int num_ranks, int num_microbatches) {
  detail::check_ranks_and_microbatches("zb_h1_schedule", num_ranks, num_microbatches);
  const int p = num_ranks, m = num_microbatches;
  std::vector<std::vector<Action>> compute(p);
  for (int rank = 0; rank < p; ++rank) {
    const int warmup = std::min(p - 1 - rank, m);
    auto& ops = compute[rank];
    std::deque<int> waiting;  // microbatches whose I ran and whose W has not
    const auto input_part = [&](int mb) {
      ops.push_back({ActionKind::kBackwardInput, rank, mb});
      waiting.push_back(mb);
      while (static_cast<int>(waiting.size()) > rank) {  // W r microbatches behind its I
        ops.push_back({ActionKind::kBackwardWeight, rank, waiting.front()});
        waiting.pop_front();
      }
    };
    int next_forward = 0, next_backward = 0;
    while (next_forward < warmup) ops.push_back({ActionKind::kForward, rank, next_forward++});
    while (next_forward < m) {
      ops.push_back({ActionKind::kForward, rank, next_forward++});
      input_part(next_backward++);
    }
    while (next_backward < m) input_part(next_backward++);
    for (int mb : waiting) ops.push_back({ActionKind::kBackwardWeight, rank, mb});
  }
  return add_communication("ZB-H1", p, p, m, compute);
}

}  // namespace loom::pipeline
