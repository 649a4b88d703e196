#include "models/gpt/plans.h"

#include "base/error.h"

namespace loom::models {

tp::ParallelizePlan gpt_tensor_parallel_plan() {
  return {
      {"h.*.attn.c_attn", std::make_shared<tp::ColwiseParallel>()},
      {"h.*.attn.c_proj", std::make_shared<tp::RowwiseParallel>()},
      {"h.*.mlp.c_fc", std::make_shared<tp::ColwiseParallel>()},
      {"h.*.mlp.c_proj", std::make_shared<tp::RowwiseParallel>()},
  };
}

void parallelize_gpt(GPT& model, std::shared_ptr<const DeviceMesh> tp_mesh) {
  LOOM_CHECK(tp_mesh != nullptr && tp_mesh->ndim() == 1, "parallelize_gpt: expected a 1-D tp mesh, got {}",
             tp_mesh ? tp_mesh->str() : "null");
  const int64_t tp = tp_mesh->size(0);
  LOOM_CHECK(model.config().n_head % tp == 0, "parallelize_gpt: n_head={} is not divisible by the tp mesh size {}",
             model.config().n_head, tp);
  tp::parallelize_module(model, std::move(tp_mesh), gpt_tensor_parallel_plan());
}

}  // namespace loom::models
