// Interleaved 1F1B: torch's ScheduleInterleaved1F1B / Megatron-LM's virtual pipeline order.
#include <algorithm>
#include <map>

#include "base/error.h"
#include "parallel/pipeline/communication.h"
#include "parallel/pipeline/schedule_checks.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule interleaved_one_f_one_b_schedule(int num_ranks, int num_microbatches,
                                          int stages_per_rank) {
  constexpr const char* kName = "interleaved_one_f_one_b_schedule";
  detail::check_ranks_and_microbatches(kName, num_ranks, num_microbatches);
  const int p = num_ranks, m = num_microbatches, v = stages_per_rank;
  LOOM_CHECK(v >= 1, "{}: got {} stages per rank; need at least 1", kName, v);
  // Microbatches enter in rounds (torch's ScheduleInterleaved1F1B): m / p of them (at least 1),
  // each of r = m / rounds microbatches. A round of r >= p keeps a microbatch leaving the last
  // rank on one local stage from waiting for the first rank on the next; r < p (m < p) runs one
  // round with bubbles. A partial round would break that timing.
  const auto equal_rounds = [p](int n) { return n % std::max(1, n / p) == 0; };
  const int rounds = std::max(1, m / p);
  if (!equal_rounds(m)) {
    int below = m, above = m;
    while (!equal_rounds(below)) --below;  // 1 always splits
    while (!equal_rounds(above)) ++above;  // a multiple of p always splits
    LOOM_FAIL(
        "{}: {} microbatches do not split into {} equal rounds (torch's rule: m / p rounds "
        "of m / rounds microbatches each, for p = {} ranks); e.g. {} or {} microbatches",
        kName, m, rounds, p, below, above);
  }
  const int r = m / rounds;  // microbatches per round
  const int total = m * v;   // forwards (and backwards) per rank
  std::vector<std::vector<Action>> compute(p);
  for (int rank = 0; rank < p; ++rank) {
    // The last rank needs (v-1) rounds of forwards before its last local stage sees
    // microbatch 0; each rank further from it needs 2 more (a forward hop and a backward hop).
    const int warmup = std::min((v - 1) * r + 2 * (p - 1 - rank), total);
    auto forward_stage = [&](int k) { return (k / r) % v * p + rank; };
    auto backward_stage = [&](int k) { return (v - 1 - (k / r) % v) * p + rank; };
    std::map<int, int> next_forward_mb, next_backward_mb;  // per stage
    auto& ops = compute[rank];
    auto forward = [&](int k) {
      const int stage = forward_stage(k);
      ops.push_back({ActionKind::kForward, stage, next_forward_mb[stage]++});
    };
    auto backward = [&](int k) {
      const int stage = backward_stage(k);
      ops.push_back({ActionKind::kBackward, stage, next_backward_mb[stage]++});
    };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < total - warmup; ++k) {
      forward(warmup + k);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return add_communication("Interleaved1F1B", p, p * v, m, compute);
}

}  // namespace loom::pipeline
