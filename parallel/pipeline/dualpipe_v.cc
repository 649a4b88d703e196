// DualPipeV (DeepSeek-AI's DualPipe cut in half, as torchtitan and torch's ScheduleDualPipeV run
// it): two stages per rank in a V, like ZBV, in DualPipe's eight steps. Its main phase pairs a
// forward on one stage with a whole backward on the other (F0 B1, F1 B0): on GPUs with expert
// parallelism the pair's compute hides the other's all-to-all. Here the pair runs one after the
// other (torch's default without an overlap callback) — the same order of the same work, so the
// same numbers; the split backwards (I, W) only fill the warm-up and cool-down.
#include <deque>
#include <map>
#include <utility>

#include "base/error.h"
#include "parallel/pipeline/communication.h"
#include "parallel/pipeline/schedule_checks.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule dualpipev_schedule(int num_ranks, int num_microbatches) {
  detail::check_ranks_and_microbatches("dualpipev_schedule", num_ranks, num_microbatches);
  const int p = num_ranks, m = num_microbatches;
  LOOM_CHECK(m >= 2 * p,
             "dualpipev_schedule: got {} microbatches for {} ranks; DualPipeV's main phase needs "
             "at least 2 x {} = {} (DeepSeek's num_chunks >= num_ranks * 2), or use zbv",
             m, p, p, 2 * p);
  std::vector<std::vector<Action>> compute(p);
  for (int rank = 0; rank < p; ++rank) {
    const int down = rank, up = 2 * p - 1 - rank;
    auto& ops = compute[rank];
    std::map<int, int> forwards, backwards;   // per stage: the next microbatch
    std::deque<std::pair<int, int>> weights;  // (stage, mb) of I's whose W has not run, in order
    const auto forward = [&](int stage) {
      ops.push_back({ActionKind::kForward, stage, forwards[stage]++});
    };
    const auto backward = [&](int stage, bool split) {
      const int mb = backwards[stage]++;
      ops.push_back({split ? ActionKind::kBackwardInput : ActionKind::kBackward, stage, mb});
      if (split) weights.emplace_back(stage, mb);
    };
    const auto weight = [&] {
      if (weights.empty()) return;
      ops.push_back({ActionKind::kBackwardWeight, weights.front().first, weights.front().second});
      weights.pop_front();
    };
    // 1: forwards down, as far as the last rank is from this one (twice: down and back).
    for (int i = 0; i < 2 * (p - rank - 1); ++i) forward(down);
    // 2: forwards on both stages.
    for (int i = 0; i <= rank; ++i) {
      forward(down);
      forward(up);
    }
    // 3: the up stage's first backwards, split, each W at once (zero bubble).
    for (int i = 0; i < p - rank - 1; ++i) {
      backward(up, true);
      weight();
      forward(up);
    }
    // 4, the main phase: F down with B up, then F up with B down (DualPipe's overlapped pairs).
    for (int i = 0; i < m - 2 * p + rank + 1; ++i) {
      forward(down);
      backward(up, false);
      forward(up);
      backward(down, false);
    }
    // 5: B up, then F up with B down.
    for (int i = 0; i < p - rank - 1; ++i) {
      backward(up, false);
      forward(up);
      backward(down, false);
    }
    // 6: backwards on both stages; from the middle on split, so their W's fill step 7 and 8.
    bool split = false;
    for (int i = 0; i <= rank; ++i) {
      if (i == (rank + 1) / 2 && rank % 2 == 1) split = true;
      backward(up, split);
      if (i == (rank + 1) / 2 && rank % 2 == 0) split = true;
      backward(down, split);
    }
    // 7: W, then the down stage's last backwards, split.
    for (int i = 0; i < p - rank - 1; ++i) {
      weight();
      backward(down, true);
    }
    // 8: the remaining W's.
    while (!weights.empty()) weight();
  }
  return add_communication("DualPipeV", p, 2 * p, m, compute, StagePlacement::kV);
}

}  // namespace loom::pipeline
