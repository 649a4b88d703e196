#include "train/parallel_llama.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "models/llama/hf.h"
#include "models/llama/llama.h"
#include "models/llama/pipeline.h"
#include "models/llama/plans.h"
#include "models/pipeline_model.h"
#include "train/one_stage_model.h"
#include "train/pipelined_model.h"

namespace loom::train {

namespace {

// pp = 1: one Llama, the TP plan over "tp", then data parallelism, run as a OneStageModel.
std::unique_ptr<ParallelModel> one_stage_llama(const models::LlamaConfig& config, uint64_t seed,
                                               const std::shared_ptr<const DeviceMesh>& mesh,
                                               const ParallelConfig& parallel) {
  auto model = std::make_shared<models::Llama>(config, seed);
  model->to(mesh->device());  // before the TP plan and data parallelism take the parameters
  if (mesh->size("tp") > 1) {
    models::parallelize_llama(*model, std::make_shared<const DeviceMesh>((*mesh)["tp"]),
                              {.sequence_parallel = parallel.tp_plan.sequence_parallel});
  }
  OneStageModelParts parts;
  parts.data_parallel = std::make_unique<models::DataParallel>(model, models::llama_blocks(*model),
                                                               *mesh, parallel.mixed_precision);
  parts.loss = [model](const Tensor& x, const Tensor& y) { return model->loss(x, y); };
  parts.load = [model](const std::string& path) { models::load_llama_hf(*model, path); };
  parts.save = [model](const std::string& path, bool write) {
    models::save_llama_hf(*model, path, write);
  };
  parts.model = model;
  return one_stage_model(std::move(parts), parallel.grad_accum);
}

}  // namespace

std::unique_ptr<ParallelModel> build_parallel_llama(const models::LlamaConfig& config,
                                                    uint64_t seed,
                                                    std::shared_ptr<const DeviceMesh> mesh,
                                                    const ParallelConfig& parallel) {
  LOOM_CHECK(mesh != nullptr, "build_parallel_llama: the mesh is null");
  LOOM_CHECK(mesh->dim_names() == parallel.dims.names() && mesh->shape() == parallel.dims.sizes(),
             "build_parallel_llama: the mesh {} is not the ({}) mesh of {}; build it with "
             "ParallelDims::build_mesh",
             mesh->str(), fmt::join(parallel.dims.names(), ", "), parallel.dims.str());
  if (parallel.dims.pp > 1) {
    // pp > 1: this rank's Llama stages, each with the TP plan, mixed precision and data
    // parallelism, driven by the pipeline schedule.
    auto model = std::make_unique<models::PipelineModel>(
        models::llama_pipeline_spec(config, seed,
                                    {.sequence_parallel = parallel.tp_plan.sequence_parallel}),
        std::move(mesh), pipeline_model_options(parallel));
    return pipelined_model(
        std::move(model),
        {.load_stage =
             [](nn::Module& stage, const std::string& path) {
               models::load_llama_hf(dynamic_cast<models::LlamaStage&>(stage), path);
             },
         .make_whole = [config] { return std::make_unique<models::Llama>(config, /*seed=*/0); },
         .save_whole =
             [](const nn::Module& whole, const std::string& path) {
               models::save_llama_hf(dynamic_cast<const models::Llama&>(whole), path);
             }});
  }
  return one_stage_llama(config, seed, mesh, parallel);
}

}  // namespace loom::train
