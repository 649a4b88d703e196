// How a job is parallelized: the degrees, and the options of each layer of the composition
// (train/parallel_model.h applies them), validated once against the world and the batch.
#pragma once

#include <cstdint>
#include <optional>

#include "models/tp_plan_options.h"
#include "nn/mixed_precision.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/cp/context_parallel.h"
#include "parallel/pipeline/pipeline_model.h"
#include "train/parallel_dims.h"

namespace loom::train {

struct ParallelConfig {
  ParallelDims dims;
  models::TPPlanOptions tp_plan;  // sequence parallelism on by default (as torchtitan)
  // Micro-batches per optimizer step without a pipeline; with one, schedule runs per step (each
  // on its share of the batch, split into the schedule's microbatches).
  int grad_accum = 1;
  pipeline::ScheduleOptions pipeline;  // with dims.pp > 1
  // bf16 compute over f32 master weights (optimizer, clipping and DDP stay f32); none: all f32.
  std::optional<nn::MixedPrecisionPolicy> mixed_precision;
  // Which blocks recompute their activations in backward (none, full, every N-th).
  parallel::ActivationCheckpointing activation_checkpoint;
  // Build on the meta device and materialize only this rank's shards (parallel/build_stage.h).
  bool meta_init = true;
  // With dims.cp > 1: how sequences split over cp and which attention joins them.
  parallel::cp::ContextParallelOptions cp;

  // Microbatches per step as the pipeline runs them (the default resolved; 1 without one).
  int microbatches() const;

  // Throws loom::Error naming the field and the values when the layout cannot run a global batch
  // of `global_batch` sequences of `seq_len` tokens on `world_size` ranks: degrees that do not
  // multiply to the world, a batch that does not split over dp x grad_accum or into the
  // microbatches (per grad_accum share), pipeline options without one, an unknown schedule,
  // a sequence that does not split over tp under sequence parallelism.
  void validate(int64_t world_size, int64_t global_batch, int64_t seq_len) const;

  // The block range of every pipeline stage of a model of `n_layers` blocks, in stage order (the
  // whole model without a pipeline), split as the pipeline splits it. Throws naming the stages
  // and layers when they do not split (a stage would have no block).
  std::vector<pipeline::StageRange> stage_ranges(int64_t n_layers) const;
};

}  // namespace loom::train
