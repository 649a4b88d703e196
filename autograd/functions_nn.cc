#include "autograd/functions_nn.h"

namespace loom {

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  return ops::layer_norm(x, normalized_shape, weight, bias, eps).out;
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return ops::rms_norm(x, weight, eps).out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     Reduction reduction) {
  return ops::cross_entropy(logits, targets, ignore_index, reduction).loss;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal, double scale) {
  return ops::scaled_dot_product_attention(q, k, v, is_causal, scale).out;
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training) {
  return ops::dropout(x, p, seed, training).out;
}

}  // namespace loom
