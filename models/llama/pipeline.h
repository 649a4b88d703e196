// A Llama over the job's meshes: the spec that makes pipeline::PipelineModel
// (parallel/pipeline/pipeline_model.h) run Llama's stages (LlamaStage), its tensor-parallel plan
// (models/llama/plans.h) and its loss, and the blocks FSDP shards one by one.
//
//   pipeline::PipelineModel model(models::llama_pipeline_spec(config, seed), meshes,
//                                 {.schedule = {.microbatches = 4}, .sequence_parallel = true});
//   double loss = model.step(inputs, targets);
//
// An untied head (Llama 3's) sends nothing between stages after the step; a tied one
// (tie_word_embeddings: Llama 3.2's) sums its two copies' gradients between the first and the last
// stage, as GPT's does (models/tied_embedding_pipeline.h).
#pragma once

#include <vector>

#include "models/llama/llama.h"
#include "models/llama/plans.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline/pipeline_model.h"

namespace loom::models {

// A Llama's or a Llama stage's transformer blocks, named "layers.{i}" by their index in the whole
// model: FSDP's units.
std::vector<parallel::DataParallel::Block> llama_blocks(const LlamaStage& stage);

pipeline::PipelineModelSpec llama_pipeline_spec(const LlamaConfig& config, uint64_t seed,
                                                const LlamaPlanOptions& plan = {});

}  // namespace loom::models
