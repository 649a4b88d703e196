#include "train/parallel_gpt.h"

#include <fmt/ranges.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/data_parallel.h"
#include "models/gpt/gpt.h"
#include "models/gpt/hf.h"
#include "models/gpt/pipeline.h"
#include "optim/clip_grad.h"
#include "parallel/pipeline/schedules.h"
#include "tensor/ops.h"
#include "train/one_stage_model.h"
#include "train/pipelined_model.h"

namespace loom::train {

namespace {

// pp = 1: one GPT, the TP plan over "tp", then data parallelism (DDP or FSDP, with mixed
// precision), run as a OneStageModel.
std::unique_ptr<ParallelModel> one_stage_gpt(const models::GPTConfig& config, uint64_t seed,
                                             const std::shared_ptr<const DeviceMesh>& mesh,
                                             const ParallelConfig& parallel) {
  auto model = std::make_shared<models::GPT>(config, seed);
  model->to(mesh->device());  // before the TP plan and data parallelism take the parameters
  if (mesh->size("tp") > 1) {
    models::parallelize_gpt(*model, std::make_shared<const DeviceMesh>((*mesh)["tp"]),
                            parallel.tp_plan);
  }
  OneStageModelParts parts;
  parts.data_parallel =
      std::make_unique<models::GPTDataParallel>(model, *mesh, parallel.mixed_precision);
  parts.loss = [model](const Tensor& x, const Tensor& y) { return model->loss(x, y); };
  parts.load = [model](const std::string& path) { models::load_gpt2_hf(*model, path); };
  parts.save = [model](const std::string& path, bool write) {
    models::save_gpt2_hf(*model, path, write);
  };
  parts.model = model;
  return one_stage_model(std::move(parts), parallel.grad_accum);
}

}  // namespace

int ParallelConfig::microbatches() const {
  if (pipeline.microbatches > 0) return pipeline.microbatches;
  return dims.pp > 1 ? static_cast<int>(dims.pp) * pipeline.virtual_stages : 1;
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
    LOOM_CHECK(grad_accum == 1,
               "ParallelConfig: with pp {} the batch is already split into microbatches; use "
               "grad_accum 1 (got {})",
               dims.pp, grad_accum);
    ::loom::pipeline::schedule_by_name(
        pipeline.schedule, static_cast<int>(dims.pp), microbatches(),
        pipeline.virtual_stages);  // throws naming an unknown schedule
    LOOM_CHECK((global_batch / dims.dp()) % microbatches() == 0,
               "ParallelConfig: each dp rank's {} sequences do not split into {} microbatches",
               global_batch / dims.dp(), microbatches());
  } else {
    LOOM_CHECK(pipeline.microbatches <= 1 && pipeline.virtual_stages == 1,
               "ParallelConfig: microbatches and virtual_stages apply to pipelines (pp > 1); for "
               "micro-batches without one use grad_accum (got microbatches {}, virtual_stages {})",
               pipeline.microbatches, pipeline.virtual_stages);
  }
  LOOM_CHECK(dims.tp == 1 || !tp_plan.sequence_parallel || seq_len % dims.tp == 0,
             "ParallelConfig: sequence parallelism splits each sequence over tp ranks: a "
             "sequence length of {} does not divide by tp {} (or turn sequence_parallel off)",
             seq_len, dims.tp);
}

std::unique_ptr<ParallelModel> build_parallel_gpt(const models::GPTConfig& config, uint64_t seed,
                                                  std::shared_ptr<const DeviceMesh> mesh,
                                                  const ParallelConfig& parallel) {
  LOOM_CHECK(mesh != nullptr, "build_parallel_gpt: the mesh is null");
  LOOM_CHECK(mesh->dim_names() == parallel.dims.names() && mesh->shape() == parallel.dims.sizes(),
             "build_parallel_gpt: the mesh {} is not the ({}) mesh of {}; build it with "
             "ParallelDims::build_mesh",
             mesh->str(), fmt::join(parallel.dims.names(), ", "), parallel.dims.str());
  if (parallel.dims.pp > 1) {
    // pp > 1: this rank's GPT stages, each with the TP plan, mixed precision and data
    // parallelism, driven by the pipeline schedule.
    auto model = std::make_unique<models::PipelineModel>(
        models::gpt_pipeline_spec(config, seed, parallel.tp_plan), std::move(mesh),
        pipeline_model_options(parallel));
    return pipelined_model(
        std::move(model),
        {.load_stage =
             [](nn::Module& stage, const std::string& path) {
               models::load_gpt2_hf(dynamic_cast<models::GPTStage&>(stage), path);
             },
         .make_whole = [config] { return std::make_unique<models::GPT>(config, /*seed=*/0); },
         .save_whole =
             [](const nn::Module& whole, const std::string& path) {
               models::save_gpt2_hf(dynamic_cast<const models::GPT&>(whole), path);
             }});
  }
  return one_stage_gpt(config, seed, mesh, parallel);
}

}  // namespace loom::train
