// call_op entries for tensor/ops_nn.h. Inputs are the op's tensors and attrs its non-tensor
// parameters, both in declaration order; multi-output ops return their result struct's fields
// in order. Reduction is an int64 attr (its enum value); dropout's seed is an int64 attr holding
// the uint64 bits.
#include "tensor/attention_attrs.h"
#include "tensor/op_table.h"
#include "tensor/ops_nn.h"

namespace loom {

void register_nn_ops(OpTable& t) {
  using C = const OpCall&;
  using V = std::vector<Tensor>;
  // Softmax.
  t[OpId::softmax] = [](C c) { return V{ops::softmax(c.inputs[0], c.int_attr(0))}; };
  t[OpId::log_softmax] = [](C c) { return V{ops::log_softmax(c.inputs[0], c.int_attr(0))}; };
  t[OpId::softmax_backward] = [](C c) {
    return V{ops::softmax_backward(c.inputs[0], c.inputs[1], c.int_attr(0))};
  };
  t[OpId::log_softmax_backward] = [](C c) {
    return V{ops::log_softmax_backward(c.inputs[0], c.inputs[1], c.int_attr(0))};
  };
  // Layer norm: inputs (x, weight, bias), attrs (normalized_shape, eps).
  t[OpId::layer_norm] = [](C c) {
    auto r =
        ops::layer_norm(c.inputs[0], c.ints_attr(0), c.inputs[1], c.inputs[2], c.double_attr(1));
    return V{r.out, r.mean, r.rstd};
  };
  // Inputs (grad_out, x, mean, rstd, weight), attrs (normalized_shape).
  t[OpId::layer_norm_backward] = [](C c) {
    auto r = ops::layer_norm_backward(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3],
                                      c.inputs[4], c.ints_attr(0));
    return V{r.grad_x, r.grad_weight, r.grad_bias};
  };
  // RMS norm: inputs (x, weight), attrs (eps); backward inputs (grad_out, x, rstd, weight).
  t[OpId::rms_norm] = [](C c) {
    auto r = ops::rms_norm(c.inputs[0], c.inputs[1], c.double_attr(0));
    return V{r.out, r.rstd};
  };
  t[OpId::rms_norm_backward] = [](C c) {
    auto r = ops::rms_norm_backward(c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3]);
    return V{r.grad_x, r.grad_weight};
  };
  // Rotary embedding: inputs (x, cos, sin), attrs (inverse).
  t[OpId::rope] = [](C c) {
    return V{ops::rope(c.inputs[0], c.inputs[1], c.inputs[2], c.bool_attr(0))};
  };
  // Embedding.
  t[OpId::embedding] = [](C c) { return V{ops::embedding(c.inputs[0], c.inputs[1])}; };
  t[OpId::embedding_backward] = [](C c) {
    const Tensor weight = c.inputs.size() > 2 ? c.inputs[2] : Tensor();
    return V{ops::embedding_backward(c.inputs[0], c.inputs[1], c.int_attr(0), weight)};
  };
  // Cross entropy: attrs (ignore_index, reduction, shard offset, classes); a call of two is not
  // sharded.
  const auto class_shard = [](C c) -> ops::ClassShard {
    if (c.attrs.size() <= 2) return {};
    return {.offset = c.int_attr(2), .classes = c.int_attr(3)};
  };
  t[OpId::cross_entropy] = [class_shard](C c) {
    auto r = ops::cross_entropy(c.inputs[0], c.inputs[1], c.int_attr(0),
                                static_cast<ops::Reduction>(c.int_attr(1)), class_shard(c));
    return V{r.loss, r.logsumexp};
  };
  // Inputs (grad_loss, logits, targets, logsumexp — may be undefined).
  t[OpId::cross_entropy_backward] = [class_shard](C c) {
    const Tensor lse = c.inputs.size() > 3 ? c.inputs[3] : Tensor();
    return V{ops::cross_entropy_backward(c.inputs[0], c.inputs[1], c.inputs[2], c.int_attr(0),
                                         static_cast<ops::Reduction>(c.int_attr(1)), lse,
                                         class_shard(c), c.attrs.size() > 4 && c.bool_attr(4))};
  };
  // Attention: attrs (is_causal, scale, causal_offset); a call of two attrs (made before the
  // offset existed) means offset 0.
  const auto causal_offset = [](C c) { return c.attrs.size() > 2 ? c.int_attr(2) : int64_t{0}; };
  // Then enable_gqa (absent: false) and dropout's (tensor/attention_attrs.h).
  t[OpId::scaled_dot_product_attention] = [causal_offset](C c) {
    auto r = ops::scaled_dot_product_attention(
        c.inputs[0], c.inputs[1], c.inputs[2], c.bool_attr(0), c.double_attr(1), causal_offset(c),
        ops::attention_dropout_of(c, ops::kAttentionDropoutAttrs),
        c.attrs.size() > 3 && c.bool_attr(3));
    return V{r.out, r.logsumexp};
  };
  // Inputs (grad_out, q, k, v, out, logsumexp); attrs (is_causal, scale, causal_offset,
  // delta_from_out, enable_gqa, then dropout's): a flag absent (a call made before it existed)
  // means false.
  t[OpId::scaled_dot_product_attention_backward] = [causal_offset](C c) {
    const bool delta_from_out = c.attrs.size() > 3 && c.bool_attr(3);
    auto r = ops::scaled_dot_product_attention_backward(
        c.inputs[0], c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4], c.inputs[5],
        c.bool_attr(0), c.double_attr(1), causal_offset(c), delta_from_out,
        ops::attention_dropout_of(c, ops::kAttentionBackwardDropoutAttrs),
        c.attrs.size() > 4 && c.bool_attr(4));
    return V{r.dq, r.dk, r.dv};
  };
  // Dropout: attrs (p, seed, training), then the region's global shape and offset when given,
  // and its runs (runs_dim, triples...) when it has them.
  t[OpId::dropout] = [](C c) {
    auto r = ops::dropout(c.inputs[0], c.double_attr(0), static_cast<uint64_t>(c.int_attr(1)),
                          c.bool_attr(2), ops::dropout_region_of(c));
    return V{r.out, r.mask};
  };
  t[OpId::dropout_backward] = [](C c) {
    return V{ops::dropout_backward(c.inputs[0], c.inputs[1], c.double_attr(0))};
  };
}

}  // namespace loom
