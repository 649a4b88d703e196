// Context parallelism: every sequence sharded over the cp ranks for the whole model (torchtitan's
// context_parallel, Megatron's CP). Each rank holds its chunks of every sequence
// (sequence_layout.h); everything but attention is per token and needs nothing more; attention
// needs every earlier key and value, which the ranks exchange.
//
// ContextParallel is the SequenceContext (autograd/sequence_context.h) a model's forward and
// backward run under: loom::scaled_dot_product_attention becomes its attention() and the model's
// positions its global ones.
//
// Attention variants:
//   allgather  keys and values are all-gathered over cp (one all-gather each per layer forward;
//              their gradients reduce-scattered in backward), reordered into global order, and
//              each of this rank's query chunks attends to the keys up to its end with the causal
//              mask shifted to its position (scaled_dot_product_attention's causal_offset): no
//              work on keys a chunk cannot see. torchtitan's default for causal attention.
//   ring       keys and values passed around the ring of cp ranks, overlapped with the block's
//              compute, partial results merged by the online softmax (ring_attention.h): 1/cp
//              of the sequence's K and V held at a time.
//   alltoall   Ulysses (DeepSpeed): q, k and v resharded from sequence to heads by an all-to-all
//              over cp (each rank then holds the whole sequence for heads / cp of its heads, which
//              cp must divide), local causal attention in global order, and the output resharded
//              back by a second all-to-all; backward: the inverse exchanges.
//
// Collective contract (per attention call, cp > 1), over the cp group: allgather: forward 2
// all-gathers (K and V, each B·H·T_local·D elements in), backward 2 reduce-scatters (dK, dV);
// alltoall: forward 4 all-to-alls (q, k, v in, the output back), backward 4; ring: see
// ring_attention.h (point to point).
#pragma once

#include <memory>
#include <string>

#include "autograd/sequence_context.h"
#include "mesh/device_mesh.h"
#include "parallel/cp/sequence_layout.h"

namespace loom::parallel::cp {

// Ulysses (--cp-attention alltoall): how many times each of a rank's `kv_heads` key/value heads
// is repeated so that they split over cp, as its `q_heads` query heads must (1: as they are;
// more only for grouped heads). Throws naming the heads and cp when either does not split: what
// the job checks before its ranks start and the attention where it runs.
int64_t ulysses_kv_repeat(int64_t q_heads, int64_t kv_heads, int64_t cp);

struct ContextParallelOptions {
  bool load_balance = true;             // the head-tail split (sequence_layout.h)
  std::string attention = "allgather";  // the variant: allgather, ring or alltoall

  // Throws naming the flag and the variants when `attention` is unknown.
  void validate() const;
};

class ContextParallel : public SequenceContext {
 public:
  // `mesh`: the 1-D cp mesh (ParallelMeshes::cp) of this rank.
  ContextParallel(std::shared_ptr<const DeviceMesh> mesh, ContextParallelOptions options);

  // The layout of a sequence of `seq_len` tokens over this rank's cp group.
  SequenceLayout layout(int64_t seq_len) const;

  std::vector<int64_t> positions(int64_t local_len) const override;
  int64_t sequence_length(int64_t local_len) const override;
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale,
                   bool enable_gqa, const AttentionDropout& dropout) override;

  const ContextParallelOptions& options() const { return options_; }

 private:
  // The alltoall variant (Ulysses).
  Tensor ulysses(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale,
                 bool enable_gqa, const AttentionDropout& dropout, const SequenceLayout& seq);

  std::shared_ptr<const DeviceMesh> mesh_;
  ContextParallelOptions options_;
};

}  // namespace loom::parallel::cp
