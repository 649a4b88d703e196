// Ring attention (Liu et al.; torchtitan's and Megatron's CP "p2p"): each cp rank keeps its own
// queries; the keys and values travel around the ring of cp ranks, one block per step, sent to
// the next rank while this rank attends to the block it holds, and the per-block partial results
// merge by the online softmax (a running log-sum-exp per query row, in f32). Backward travels the
// ring the other way, starting from the block forward ended with (kept) and ending with the
// rank's own: each rank adds its queries' part of the block it holds to that block's dK and dV
// accumulators and passes them on, so they arrive complete at the owner's last step, with no hop
// home. Every exchange is in flight while a block computes (the next block's K and V during this
// step, the accumulators during the next). Every block's backward uses the whole row's output and
// log-sum-exp (scaled_dot_product_attention_backward's delta_from_out).
//
// Memory: a rank keeps its own K and V and the one block forward ended with for backward, and
// holds one block in flight: 2/cp of the sequence's K and V (allgather keeps all of it).
// Causal load balancing comes from the sequence layout (sequence_layout.h): with the head-tail
// split every rank has the same number of visible (query chunk, key chunk) pairs at every step.
//
// Collective contract (per attention call, cp > 1), point to point on the cp group, every message
// one of this rank's K or V or their f32 gradients (the same elements): forward, cp - 1 exchanges
// of 2 sends and 2 receives (K, V, to the next rank); backward, cp - 2 exchanges of K and V and
// cp - 1 of the dK, dV accumulators (to the previous rank).
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "parallel/cp/sequence_layout.h"
#include "tensor/ops_nn.h"
#include "tensor/tensor.h"

namespace loom::parallel::cp {

// Where a call's time went, summed over its forward and backward (tools/bench/ring_overlap_bench):
// the block computes, and the waits for sends and receives that the compute did not hide.
struct RingAttentionProfile {
  double compute_ms = 0;
  double wait_ms = 0;
  int64_t sent_bytes = 0;
};

// q, k, v: (B, H, T_local, D), this rank's tokens as `layout` places them; `group`: the cp group
// (its rank = layout.rank). Differentiable. `profile`, when given, must outlive the backward.
// enable_gqa: k and v may have fewer heads than q (grouped-query attention); their blocks travel
// the ring at their own size. dropout: each block drops its piece of the whole sequence's mask
// (its region, if any, placing q's batch and heads: parallel/cp/dropout_placement.h).
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                      double scale, const SequenceLayout& layout,
                      std::shared_ptr<comm::ProcessGroup> group,
                      RingAttentionProfile* profile = nullptr, bool enable_gqa = false,
                      const AttentionDropout& dropout = {});

}  // namespace loom::parallel::cp
