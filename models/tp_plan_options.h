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
};

}  // namespace loom::models
