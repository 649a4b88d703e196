// The options every family's tensor-parallel plan takes.
#pragma once

namespace loom::models {

struct TPPlanOptions {
  // Norms and dropout on sequence shards between the blocks' gathers and reduce-scatters
  // (Megatron's sequence parallelism, torchtitan's default).
  bool sequence_parallel = true;
  // With sequence parallelism, each block's attention and feed-forward keep their input's
  // sequence shard between forward and backward and gather it again for backward, as Megatron
  // does, instead of keeping the gathered input (tp::PrepareInputOptions::regather_in_backward):
  // per layer 1/tp of the two gathered inputs' bytes, for two more all-gathers per layer.
  bool regather_in_backward = true;
  // A mixture of experts' experts split over tp along their hidden width (torchtitan's expert
  // tensor parallelism): w1 and w3 by rows, w2 by columns, the partial outputs summed over tp.
  // Off (experts whole on every tp rank) with expert parallelism, which splits them over ep.
  bool expert_tensor_parallel = true;
};

}  // namespace loom::models
