// The options every family's tensor-parallel plan takes.
#pragma once

namespace loom::models {

struct TPPlanOptions {
  // Norms and dropout on sequence shards between the blocks' gathers and reduce-scatters
  // (Megatron's sequence parallelism, torchtitan's default).
  bool sequence_parallel = true;
};

}  // namespace loom::models
