#include "train/parallel_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/split.h"

namespace loom::train {

int ParallelConfig::microbatches() const {
  return dims.pp > 1 ? pipeline.microbatches_for(dims.pp) : std::max(1, pipeline.microbatches);
}

void ParallelConfig::validate(int64_t world_size, int64_t global_batch, int64_t seq_len) const {
  dims.validate(world_size);
  LOOM_CHECK(grad_accum >= 1, "ParallelConfig: grad_accum must be at least 1, got {}", grad_accum);
  LOOM_CHECK(pipeline.microbatches >= 0 && pipeline.virtual_stages >= 1,
             "ParallelConfig: microbatches must be >= 0 (0: the default) and virtual_stages >= 1, "
             "got {} and {}",
             pipeline.microbatches, pipeline.virtual_stages);
  LOOM_CHECK(global_batch >= 1 && seq_len >= 1,
             "ParallelConfig: the batch size and the sequence length must be at least 1, got {} "
             "and {}",
             global_batch, seq_len);
  LOOM_CHECK(global_batch % (dims.dp() * grad_accum) == 0,
             "ParallelConfig: a global batch of {} sequences does not split over dp x grad_accum "
             "= {} x {} (dp = dp_replicate x dp_shard)",
             global_batch, dims.dp(), grad_accum);
  if (dims.pp > 1) {
    ::loom::pipeline::schedule_by_name(
        pipeline.schedule, static_cast<int>(dims.pp), microbatches(),
        pipeline.virtual_stages);  // throws naming an unknown schedule
    // Each of the grad_accum pipeline steps of an optimizer step takes its share of the dp
    // rank's sequences and splits it into the schedule's microbatches.
    LOOM_CHECK(
        (global_batch / dims.dp() / grad_accum) % microbatches() == 0,
        "ParallelConfig: each dp rank's {} sequences over grad_accum {} do not split into {} "
        "microbatches",
        global_batch / dims.dp(), grad_accum, microbatches());
  } else {
    LOOM_CHECK(pipeline.microbatches <= 1 && pipeline.virtual_stages == 1,
               "ParallelConfig: microbatches and virtual_stages apply to pipelines (pp > 1); for "
               "micro-batches without one use grad_accum (got microbatches {}, virtual_stages {})",
               pipeline.microbatches, pipeline.virtual_stages);
    LOOM_CHECK(pipeline.layers_per_stage.empty(),
               "ParallelConfig: layers_per_stage splits a pipeline's layers (pp > 1), got {} "
               "stages' counts without one",
               pipeline.layers_per_stage.size());
  }
  int64_t local_len = seq_len;  // the tokens of a sequence one rank holds
  if (dims.cp > 1) {
    cp.validate();
    parallel::cp::SequenceLayout{.cp = dims.cp, .seq_len = seq_len, .load_balance = cp.load_balance}
        .check(
            fmt::format("ParallelConfig: context parallelism over cp {}: the sequence", dims.cp));
    local_len = seq_len / dims.cp;
  }
  LOOM_CHECK(dims.tp == 1 || !tp_plan.sequence_parallel || local_len % dims.tp == 0,
             "ParallelConfig: sequence parallelism splits each sequence{} over tp ranks: a "
             "sequence length of {} does not divide by tp {} (or turn sequence_parallel off)",
             dims.cp > 1
                 ? fmt::format(" (its {} tokens on each of the cp {} ranks)", local_len, dims.cp)
                 : "",
             local_len, dims.tp);
}

std::vector<pipeline::StageRange> ParallelConfig::stage_ranges(int64_t n_layers) const {
  if (dims.pp == 1) return {pipeline::StageRange::whole(n_layers)};
  // The schedule's stages without building it (validate() has checked it builds): a pipeline
  // of more stages than layers is refused before any schedule of its size is made.
  const int stages = static_cast<int>(dims.pp) * ::loom::pipeline::stages_per_rank_of(
                                                     pipeline.schedule, pipeline.virtual_stages);
  LOOM_CHECK(pipeline.layers_per_stage.empty() ||
                 static_cast<int64_t>(pipeline.layers_per_stage.size()) == stages,
             "--layers-per-stage {}: {} counts, but pp {} under schedule {} has {} stages ({} per "
             "rank); give one count per stage, in stage order",
             fmt::format("{}", fmt::join(pipeline.layers_per_stage, ",")),
             pipeline.layers_per_stage.size(), dims.pp, pipeline.schedule, stages,
             pipeline.stages_per_rank());
  LOOM_CHECK(!pipeline.layers_per_stage.empty() || n_layers >= stages,
             "ParallelConfig: pp {} under schedule {} has {} stages ({} per rank), but the model "
             "has {} layers; each stage needs at least one (fewer pp ranks, or a schedule with "
             "fewer stages per rank)",
             dims.pp, pipeline.schedule, stages, pipeline.stages_per_rank(), n_layers);
  const auto layers = pipeline.layers_per_stage.empty()
                          ? ::loom::pipeline::split_layers(n_layers, stages)
                          : ::loom::pipeline::split_layers(n_layers, pipeline.layers_per_stage);
  std::vector<pipeline::StageRange> out;
  for (int s = 0; s < stages; ++s) {
    out.push_back({layers[s].begin, layers[s].end, s == 0, s == stages - 1});
  }
  return out;
}

}  // namespace loom::train
