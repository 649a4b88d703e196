#include "parallel/pipeline/placement.h"

#include <fmt/format.h>

namespace loom::pipeline {

std::string_view placement_name(StagePlacement placement) {
  return placement == StagePlacement::kV ? "v" : "loop";
}

int rank_of_stage(StagePlacement placement, int stage, int num_ranks, int num_stages) {
  if (placement == StagePlacement::kV && stage >= num_ranks) return num_stages - 1 - stage;
  return stage % num_ranks;
}

std::vector<int> stages_of_rank(StagePlacement placement, int rank, int num_ranks, int num_stages) {
  std::vector<int> stages;
  for (int stage = 0; stage < num_stages; ++stage) {
    if (rank_of_stage(placement, stage, num_ranks, num_stages) == rank) stages.push_back(stage);
  }
  return stages;
}

std::string placement_rule(StagePlacement placement, int num_ranks) {
  if (placement == StagePlacement::kV) {
    return fmt::format("stage s on rank s for s < {0} and on rank {1} - s after (a V)", num_ranks,
                       2 * num_ranks - 1);
  }
  return fmt::format("stage s on rank s % {}", num_ranks);
}

}  // namespace loom::pipeline
