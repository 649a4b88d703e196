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
// Collective contract (per attention call, cp > 1), point to point on the cp group: forward,
// cp - 1 steps of 2 sends and 2 receives (K, V); backward, cp - 1 steps of 4 sends and 4 receives
// (K, V, dK, dV) and a last hop of 2 (dK, dV).
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "parallel/cp/sequence_layout.h"
#include "tensor/tensor.h"

namespace loom::parallel::cp {

// q, k, v: (B, H, T_local, D), this rank's tokens as `layout` places them; `group`: the cp group
// (its rank = layout.rank). Differentiable.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                      double scale, const SequenceLayout& layout,
                      std::shared_ptr<comm::ProcessGroup> group);

}  // namespace loom::parallel::cp
