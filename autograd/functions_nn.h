// The neural-network ops as torch.nn.functional spells them: each returns the op's main output.
// softmax, log_softmax and embedding are the ops of tensor/ops_nn.h themselves; layer_norm,
// cross_entropy, scaled_dot_product_attention and dropout return the first field of the op's
// result (loom::ops::layer_norm also returns mean and rstd, ...). Either spelling records
// autograd the same way (tensor/dispatch.h).
#pragma once

#include "tensor/ops_nn.h"

namespace loom {

using ops::embedding;
using ops::log_softmax;
using ops::rope;
using ops::softmax;

// weight/bias may be undefined (no affine transform).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps = 1e-5);
// RMSNorm over the last dim (ops::rms_norm's out).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
// logits (N, V), targets (N,) i64; rows whose target is ignore_index contribute nothing.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::kMean);
// q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv); scale <= 0 means 1/sqrt(D). is_causal masks
// key j for query i when j > i + causal_offset (0: top-left aligned; context parallelism's query
// chunk at global positions s.. against keys 0.. passes s); see ops::scaled_dot_product_attention.
// `dropout` drops attention probabilities (torch's dropout_p) with a keep-mask drawn from its
// seed inside the kernels; pass p = 0 (the default) outside training. enable_gqa: k and v may
// have fewer heads than q (grouped-query attention, read in place).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal = false, double scale = 0.0,
                                    int64_t causal_offset = 0, const AttentionDropout& dropout = {},
                                    bool enable_gqa = false);
// Deterministic by seed; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training = true);

}  // namespace loom
