// The GPT's tensor-parallel plan (Megatron-style, as torchtitan's): in every block, the
// attention input projection and the MLP's first layer are column-parallel (each rank computes
// its heads / its slice of the hidden features on local tensors), the output projections are
// row-parallel (one all-reduce each). Embeddings, norms and the LM head stay replicated for now.
#pragma once

#include <memory>

#include "mesh/device_mesh.h"
#include "models/gpt/gpt.h"
#include "parallel/tp/parallelize.h"

namespace loom::models {

tp::ParallelizePlan gpt_tensor_parallel_plan();

// Applies the plan on a 1-D `tp` mesh after checking that heads split evenly:
// "parallelize_gpt: n_head=4 is not divisible by the tp mesh size 3".
void parallelize_gpt(GPT& model, std::shared_ptr<const DeviceMesh> tp_mesh);

}  // namespace loom::models
