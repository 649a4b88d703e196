// The Llama tensor-parallel plan (torchtitan's parallelize_llama): q/k/v column-parallel and o
// row-parallel, w1/w3 column-parallel and w2 row-parallel, the embedding table row-parallel
// (vocabulary shards), the output head column-parallel with loss parallel (vocabulary-sharded
// logits into the loss), and with sequence parallelism the norms on sequence shards and each
// attention / feed-forward input gathered once for its projections (PrepareModuleInput).
//
//   models::parallelize_llama(model, std::make_shared<const DeviceMesh>((*mesh)["tp"]));
//
// `model` may be a pipeline stage (LlamaStage): the plan then covers what the stage holds (the
// embeddings on the first, the norm and the head on the last, its blocks).
//
// Heads split over tp: n_heads and n_kv_heads must both divide by it (checked, naming them,
// before anything changes); replicating kv heads when tp > n_kv_heads is not supported yet.
#pragma once

#include <memory>
#include <string>

#include "mesh/device_mesh.h"
#include "models/llama/llama.h"
#include "models/tp_plan_options.h"

namespace loom::models {

using LlamaPlanOptions = TPPlanOptions;

void parallelize_llama(LlamaStage& model, std::shared_ptr<const DeviceMesh> tp_mesh,
                       const LlamaPlanOptions& options = {});

}  // namespace loom::models
