// A whole model on one pipeline stage, as the training loop sees it (a ParallelModel): already
// tensor-parallel, made data parallel (models/data_parallel.h), run with gradient accumulation
// over micro-batches (synchronizing on the last only). GPT and Llama jobs both use it; what
// differs — the loss, and the Hugging Face files — comes in as functions.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "models/data_parallel.h"
#include "nn/module.h"
#include "train/parallel_gpt.h"

namespace loom::train {

struct OneStageModelParts {
  std::shared_ptr<nn::Module> model;  // on the mesh's device, its TP plan applied
  std::unique_ptr<models::DataParallel> data_parallel;
  std::function<Tensor(const Tensor& ids, const Tensor& targets)> loss;
  std::function<void(const std::string& path)> load;
  std::function<void(const std::string& path, bool write)> save;
};

std::unique_ptr<ParallelModel> one_stage_model(OneStageModelParts parts, int grad_accum);

}  // namespace loom::train
