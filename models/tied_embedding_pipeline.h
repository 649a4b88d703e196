// A tied embedding across pipeline stages (Megatron's approach, GPT's and a tied Llama's): the
// first stage holds the embedding, the last stage its own copy for the tied head. The copies
// start equal (each initialized from the same seed and name, or loaded from the same tensor);
// after each step the two stages sum their gradients, so both take identical optimizer steps
// and stay equal bit for bit; the gradient norm counts the first stage's copy only.
//
// Collective contract: sum_tied_embedding_gradients sends and receives over the pp group between
// the first and the last stage's ranks (one tensor each way, the embedding's local shard);
// nothing when one rank holds both (one pp rank, or interleaved stages ending on it).
#pragma once

#include <functional>
#include <vector>

#include "nn/layers.h"
#include "parallel/pipeline/pipeline_model.h"

namespace loom::models {

// A stage's copy of the tied embedding (null when it holds none) and where the stage sits.
struct TiedCopy {
  const nn::Embedding* embedding = nullptr;
  pipeline::StageRange range;
};
using TiedCopyOf = std::function<TiedCopy(const nn::Module& stage)>;

// PipelineModelSpec::after_step: the copies' gradients summed (both get the same bits).
void sum_tied_embedding_gradients(pipeline::PipelineModel& model, const TiedCopyOf& copy_of);

// PipelineModelSpec::not_counted: the last stage's copy (when it is not also the first).
std::vector<Tensor> tied_copies_not_counted(const pipeline::PipelineModel& model,
                                            const TiedCopyOf& copy_of);

}  // namespace loom::models
