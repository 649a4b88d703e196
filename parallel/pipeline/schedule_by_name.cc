#include "base/error.h"
#include "parallel/pipeline/schedules.h"

namespace loom::pipeline {

Schedule schedule_by_name(const std::string& name, int num_ranks, int num_microbatches,
                          int stages_per_rank) {
  if (name == "interleaved")
    return interleaved_one_f_one_b_schedule(num_ranks, num_microbatches, stages_per_rank);
  LOOM_CHECK(name == "gpipe" || name == "1f1b" || name == "zb-h1",
             "pipeline: unknown schedule '{}' (expected gpipe, 1f1b, zb-h1 or interleaved)", name);
  LOOM_CHECK(stages_per_rank == 1,
             "pipeline: {} places one stage per rank; {} virtual stages per rank need --schedule "
             "interleaved",
             name, stages_per_rank);
  if (name == "zb-h1") return zb_h1_schedule(num_ranks, num_microbatches);
  return name == "gpipe" ? gpipe_schedule(num_ranks, num_microbatches)
                         : one_f_one_b_schedule(num_ranks, num_microbatches);
}

}  // namespace loom::pipeline
