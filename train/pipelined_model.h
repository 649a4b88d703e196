// A model's pipeline stages on this rank (models::PipelineModel), as the training loop sees it (a
// ParallelModel): the schedule runs each step, and checkpoints load per stage and save the whole
// model gathered on the mesh's first rank. GPT and Llama jobs both use it; what differs — the
// spec, the Hugging Face files, the whole model's type — comes in as functions.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "models/pipeline_model.h"
#include "nn/module.h"
#include "train/parallel_gpt.h"

namespace loom::train {

struct PipelinedModelParts {
  // Loads a stage's parameters from a Hugging Face file (each stage loads what it holds).
  std::function<void(nn::Module& stage, const std::string& path)> load_stage;
  // The whole model (on the CPU, any values): the first rank gathers every stage into it.
  std::function<std::unique_ptr<nn::Module>()> make_whole;
  // Writes the gathered whole model as a Hugging Face file.
  std::function<void(const nn::Module& whole, const std::string& path)> save_whole;
};

std::unique_ptr<ParallelModel> pipelined_model(std::unique_ptr<models::PipelineModel> model,
                                               PipelinedModelParts parts);

// The pipeline options of a job's ParallelConfig (schedule, microbatches resolved, virtual
// stages, sequence parallelism, mixed precision).
models::PipelineModelOptions pipeline_model_options(const ParallelConfig& parallel);

}  // namespace loom::train
