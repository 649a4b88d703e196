// Ring attention (Liu et al.; torchtitan's and Megatron's CP "p2p"): each cp rank keeps its own
// queries; the keys and values travel around the ring of cp ranks, one block per step, sent to
// the next rank while this rank attends to the block it holds, and the per-block partial results
// merge by the online softmax (a running log-sum-exp per query row, in f32). Backward travels the
// ring again with the blocks and their gradient accumulators (each rank adds its queries'
// contribution to the block it holds; one last hop returns each block's dK and dV to its owner),
// every block's backward using the whole row's output and log-sum-exp
// (scaled_dot_product_attention_backward's delta_from_out).
//
// Memory: a rank holds its own K and V plus the one block in flight: 1/cp of the sequence, not
// the whole of it as allgather does. Causal load balancing comes from the sequence layout
// (sequence_layout.h): with the head-tail split every rank has the same number of visible
// (query chunk, key chunk) pairs at every step.
//
// Collective contract (per attention call, cp > 1), point to point on the cp group, every message
// one of this rank's K or V (or their f32 gradients): forward, cp - 1 steps of 2 sends and 2
// receives (K, V); backward, cp - 1 steps of 2 (K, V, sent while the step computes) and cp
// exchanges of 2 (dK, dV accumulators, sent while the next step computes; the last one the hop
// home).
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "parallel/cp/sequence_layout.h"
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
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                      double scale, const SequenceLayout& layout,
                      std::shared_ptr<comm::ProcessGroup> group,
                      RingAttentionProfile* profile = nullptr);

}  // namespace loom::parallel::cp
