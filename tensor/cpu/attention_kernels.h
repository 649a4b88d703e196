// Fused causal/full attention on CPU, f32 (tensor/ops_nn_attention.cc calls these for every CPU
// scaled_dot_product_attention). One query row at a time: scores against the visible keys into a
// row-long scratch, softmax, then the weighted sum of values; no (Tq, Tk) matrix is ever stored,
// so memory grows with T, not T^2. The backward recomputes each row's probabilities from the
// saved logsumexp, as FlashAttention does.
//
// Threads: the batch entries (batch x heads) are split over the kernel threads (in the backward,
// the key/value entries with their group's query entries); each is computed start to end by one
// thread, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/attention_dropout_mask.h"

namespace loom::cpu {

struct AttentionShape {
  int64_t entries = 0;  // batch entries (product of the batch dims)
  int64_t tq = 0, tk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  bool causal = false;        // query i sees keys j <= i + causal_offset
  int64_t causal_offset = 0;  // 0: top-left aligned; tk - tq: bottom-right; may be negative
  // Dropout on the probabilities (inactive by default): out = (P * factor) v, and the backward
  // takes dP through the same factors (tensor/attention_dropout_mask.h).
  AttentionDropoutMask dropout;
  // Grouped-query attention: entry e's keys and values are key/value entry e / group (q, out and
  // dq have `entries` matrices; k, v, dk and dv entries / group).
  int64_t group = 1;
};

// Matrices of one operand: entry e's row r starts at base + offsets[e] + r * row_stride; the
// last dim is contiguous.
struct RowMatrices {
  const float* base;
  std::span<const int64_t> offsets;
  int64_t row_stride;
};

// out: (entries, tq, dv) contiguous; lse: (entries, tq), -inf for a row that sees no key (tk == 0,
// or causal with i + causal_offset < 0): its output row is 0.
void attention_forward(const AttentionShape& shape, const RowMatrices& q, const RowMatrices& k,
                       const RowMatrices& v, float* out, float* lse);

// dq (entries, tq, d), dk (entries / group, tk, d), dv (entries / group, tk, dv): contiguous,
// overwritten.
// dS = P * (dP - rowsum(P * dP)) * scale, the rowsum accumulated in double; under dropout dP is
// (dO v^T) * factor and dv = (P * factor)^T dO. A row that sees no
// key (or whose lse is -inf) contributes nothing: its dq row is 0. `delta` (entries, tq)
// contiguous, when not null, replaces the rowsum (ring attention's whole-row rowsum(dO * out)).
void attention_backward(const AttentionShape& shape, const RowMatrices& q, const RowMatrices& k,
                        const RowMatrices& v, const RowMatrices& grad_out, const float* lse,
                        float* dq, float* dk, float* dv, const float* delta = nullptr);

}  // namespace loom::cpu
