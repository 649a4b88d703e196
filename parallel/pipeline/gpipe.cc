// GPipe: all forwards, then all backwards.
#include "parallel/pipeline/communication.h"
#include "parallel/pipeline/schedule_checks.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule gpipe_schedule(int num_ranks, int num_microbatches) {
  detail::check_ranks_and_microbatches("gpipe_schedule", num_ranks, num_microbatches);
  std::vector<std::vector<Action>> compute(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    for (int mb = 0; mb < num_microbatches; ++mb)
      compute[rank].push_back({ActionKind::kForward, rank, mb});
    for (int mb = 0; mb < num_microbatches; ++mb)
      compute[rank].push_back({ActionKind::kBackward, rank, mb});
  }
  return add_communication("GPipe", num_ranks, num_ranks, num_microbatches, compute);
}

}  // namespace loom::pipeline
