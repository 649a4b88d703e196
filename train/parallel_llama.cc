#include "train/parallel_llama.h"

#include <fmt/format.h>

#include "base/error.h"
#include "models/llama/hf.h"
#include "models/llama/llama.h"
#include "models/llama/plans.h"
#include "train/one_stage_model.h"

namespace loom::train {

std::unique_ptr<ParallelModel> build_parallel_llama(const models::LlamaConfig& config,
                                                    uint64_t seed,
                                                    std::shared_ptr<const DeviceMesh> mesh,
                                                    const ParallelConfig& parallel) {
  LOOM_CHECK(mesh != nullptr, "build_parallel_llama: the mesh is null");
  LOOM_CHECK(parallel.dims.pp == 1,
             "build_parallel_llama: pipeline stages for Llama are not built yet (pp {}); use pp 1",
             parallel.dims.pp);
  auto model = std::make_shared<models::Llama>(config, seed);
  model->to(mesh->device());  // before the TP plan and data parallelism take the parameters
  if (mesh->size("tp") > 1) {
    models::parallelize_llama(*model, std::make_shared<const DeviceMesh>((*mesh)["tp"]),
                              {.sequence_parallel = parallel.tp_plan.sequence_parallel});
  }
  std::vector<models::DataParallel::Block> blocks;
  for (size_t i = 0; i < model->layers.size(); ++i) {
    blocks.push_back({fmt::format("layers.{}", i), model->layers[i].get()});
  }
  OneStageModelParts parts;
  parts.data_parallel = std::make_unique<models::DataParallel>(model, std::move(blocks), *mesh,
                                                               parallel.mixed_precision);
  parts.loss = [model](const Tensor& x, const Tensor& y) { return model->loss(x, y); };
  parts.load = [model](const std::string& path) { models::load_llama_hf(*model, path); };
  parts.save = [model](const std::string& path, bool write) {
    models::save_llama_hf(*model, path, write);
  };
  parts.model = model;
  return one_stage_model(std::move(parts), parallel.grad_accum);
}

}  // namespace loom::train
