// The GPT's tensor-parallel plans (Megatron-style, as torchtitan's), for a 1-D `tp` mesh.
//
// Both plans: in every block the attention input projection and the MLP's first layer are
// column-parallel (each rank computes its heads / its slice of the hidden features on local
// tensors) and the output projections row-parallel. The token embedding is vocab-parallel
// (RowwiseParallel on wte: each rank holds a range of rows, uneven when the vocabulary does not
// divide by tp — GPT-2's 50257), and since the LM head is tied to it the logits come out sharded
// by vocabulary: the loss is computed loss-parallel (parallel/tp/loss_parallel.h), never
// gathering the (B, T, V) logits.
//
// Without sequence parallelism the residual stream is replicated: per forward, one all-reduce
// for the embedding, two per block, three small per-row all-reduces in the loss.
//
// With sequence parallelism (the default) the residual stream between blocks is sharded along
// the sequence: norms and dropout run on each rank's tokens only (SequenceParallel), each block
// all-gathers the sequence before attention and before the MLP and reduce-scatters after their
// output projections (the same bytes as the two all-reduces, a 1/tp share of the activations
// memory). The position embedding's output is cut to the rank's positions; the LM head gathers
// the sequence once. The sequence length must divide by tp.
#pragma once

#include <memory>

#include "mesh/device_mesh.h"
#include "models/gpt/gpt.h"
#include "models/tp_plan_options.h"
#include "parallel/tp/parallelize.h"

namespace loom::models {

using GPTPlanOptions = TPPlanOptions;

// The plan for a whole GPT, or for the modules a pipeline stage holds (`range`): entries for
// modules the stage lacks are left out (a middle stage has no embeddings or head). Between
// pipeline stages, sequence-parallel activations travel as each rank's local sequence shard.
tp::ParallelizePlan gpt_tensor_parallel_plan(const GPTPlanOptions& options = {},
                                             const GPTStageRange& range = {});

// Applies the plan on a 1-D `tp` mesh after checking that heads split evenly:
// "parallelize_gpt: n_head=4 is not divisible by the tp mesh size 3".
void parallelize_gpt(GPTStage& model, std::shared_ptr<const DeviceMesh> tp_mesh,
                     const GPTPlanOptions& options = {});

}  // namespace loom::models
