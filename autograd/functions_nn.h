// Differentiable neural-network ops (the kernels and their backward kernels are in
// tensor/ops_nn.h). Same names as torch.nn.functional.
#pragma once

#include "tensor/ops_nn.h"

namespace loom {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// weight/bias may be undefined (no affine transform).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps = 1e-5);
Tensor embedding(const Tensor& weight, const Tensor& indices);
// logits (N, V), targets (N,) i64; rows whose target is ignore_index contribute nothing.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::kMean);
// q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv); scale <= 0 means 1/sqrt(D).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal = false, double scale = 0.0);
// Deterministic by seed; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training = true);

}  // namespace loom
