// Differentiable wrappers over the nn kernels: each saves what its backward kernel needs.
#include "autograd/functions_nn.h"

#include "autograd/function.h"

namespace loom {

using autograd::any_requires_grad;
using autograd::record;
using Grads = std::vector<Tensor>;

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = ops::softmax(x, dim);
  if (!any_requires_grad({x})) return out;
  return record("SoftmaxBackward", {x}, out, [out, dim](const Grads& g) {
    return Grads{ops::softmax_backward(g[0], out, dim)};
  });
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor out = ops::log_softmax(x, dim);
  if (!any_requires_grad({x})) return out;
  return record("LogSoftmaxBackward", {x}, out, [out, dim](const Grads& g) {
    return Grads{ops::log_softmax_backward(g[0], out, dim)};
  });
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  ops::LayerNormResult result = ops::layer_norm(x, normalized_shape, weight, bias, eps);
  if (!any_requires_grad({x, weight, bias})) return result.out;
  return record("LayerNormBackward", {x, weight, bias}, result.out,
                [x, weight, normalized_shape, mean = result.mean, rstd = result.rstd](const Grads& g) {
                  ops::LayerNormGrads grads =
                      ops::layer_norm_backward(g[0], x, mean, rstd, weight, normalized_shape);
                  return Grads{grads.grad_x, grads.grad_weight, grads.grad_bias};
                });
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = ops::embedding(weight, indices);
  if (!any_requires_grad({weight})) return out;
  return record("EmbeddingBackward", {weight, indices}, out,
                [indices, rows = weight.size(0)](const Grads& g) {
                  return Grads{ops::embedding_backward(g[0], indices, rows), Tensor()};
                });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     Reduction reduction) {
  ops::CrossEntropyResult result = ops::cross_entropy(logits, targets, ignore_index, reduction);
  if (!any_requires_grad({logits})) return result.loss;
  return record("CrossEntropyBackward", {logits, targets}, result.loss,
                [logits, targets, ignore_index, reduction, lse = result.logsumexp](const Grads& g) {
                  return Grads{ops::cross_entropy_backward(g[0], logits, targets, ignore_index,
                                                           reduction, lse),
                               Tensor()};
                });
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool is_causal, double scale) {
  ops::AttentionResult result = ops::scaled_dot_product_attention(q, k, v, is_causal, scale);
  if (!any_requires_grad({q, k, v})) return result.out;
  return record("ScaledDotProductAttentionBackward", {q, k, v}, result.out,
                [q, k, v, out = result.out, lse = result.logsumexp, is_causal, scale](const Grads& g) {
                  ops::AttentionGrads grads = ops::scaled_dot_product_attention_backward(
                      g[0], q, k, v, out, lse, is_causal, scale);
                  return Grads{grads.dq, grads.dk, grads.dv};
                });
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training) {
  ops::DropoutResult result = ops::dropout(x, p, seed, training);
  if (!any_requires_grad({x}) || !result.mask.defined()) return result.out;
  return record("DropoutBackward", {x}, result.out, [mask = result.mask, p](const Grads& g) {
    return Grads{ops::dropout_backward(g[0], mask, p)};
  });
}

}  // namespace loom
