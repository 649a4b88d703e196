// Formulas of the neural-network ops: each saves what its backward kernel (tensor/ops_nn.h)
// needs. Their extra outputs (layer norm's mean and rstd, the logsumexps, dropout's mask) are
// saved for backward and returned unrecorded.
#include "autograd/formulas.h"
#include "base/error.h"
#include "tensor/attention_attrs.h"

namespace loom::autograd {

namespace {
using C = const OpCall&;
using Outs = std::vector<Tensor>;
}  // namespace

void register_nn_formulas(FormulaTable& f) {
  // Attrs (dim).
  f[OpId::softmax] = [](C c, Outs out) {
    return record_first("SoftmaxBackward", c, out,
                        [y = out[0], dim = c.int_attr(0)](const Grads& g) {
                          return Grads{ops::softmax_backward(g[0], y, dim)};
                        });
  };
  f[OpId::log_softmax] = [](C c, Outs out) {
    return record_first("LogSoftmaxBackward", c, out,
                        [y = out[0], dim = c.int_attr(0)](const Grads& g) {
                          return Grads{ops::log_softmax_backward(g[0], y, dim)};
                        });
  };
  // Inputs (x, weight, bias), attrs (normalized_shape, eps); outputs (out, mean, rstd).
  f[OpId::layer_norm] = [](C c, Outs out) {
    return record_first("LayerNormBackward", c, out,
                        [x = c.inputs[0], weight = c.inputs[1], shape = c.ints_attr(0),
                         mean = out[1], rstd = out[2]](const Grads& g) {
                          ops::LayerNormGrads grads =
                              ops::layer_norm_backward(g[0], x, mean, rstd, weight, shape);
                          return Grads{grads.grad_x, grads.grad_weight, grads.grad_bias};
                        });
  };
  // Inputs (x, weight), attrs (eps); outputs (out, rstd).
  f[OpId::rms_norm] = [](C c, Outs out) {
    return record_first("RMSNormBackward", c, out,
                        [x = c.inputs[0], weight = c.inputs[1], rstd = out[1]](const Grads& g) {
                          ops::RMSNormGrads grads = ops::rms_norm_backward(g[0], x, rstd, weight);
                          return Grads{grads.grad_x, grads.grad_weight};
                        });
  };
  // Inputs (x, cos, sin), attrs (inverse): the gradient rotates back by the opposite angle.
  f[OpId::rope] = [](C c, Outs out) {
    return record_first(
        "RopeBackward", c, std::move(out),
        [cos = c.inputs[1], sin = c.inputs[2], inverse = c.bool_attr(0)](const Grads& g) {
          return Grads{ops::rope(g[0], cos, sin, !inverse), Tensor(), Tensor()};
        });
  };
  // Inputs (weight, indices).
  f[OpId::embedding] = [](C c, Outs out) {
    return record_first(
        "EmbeddingBackward", c, std::move(out),
        // The weight for its layout only (a vocabulary-sharded table gets its
        // own rows); its gradient completes here, so holding it keeps nothing
        // longer than its other uses do.
        [indices = c.inputs[1], weight = c.inputs[0]](const Grads& g) {
          return Grads{ops::embedding_backward(g[0], indices, weight.size(0), weight), Tensor()};
        });
  };
  // Inputs (logits, targets), attrs (ignore_index, reduction, and a class shard's offset and
  // classes); outputs (loss, logsumexp).
  f[OpId::cross_entropy] = [](C c, Outs out) {
    LOOM_CHECK(c.attrs.size() <= 2 || c.int_attr(3) == 0,
               "cross_entropy: a class shard's part of the loss records no gradient (loss "
               "parallel computes it below autograd); call it under NoGradGuard, or on the whole "
               "classes");
    // When this backward is the node's last and nothing but the node holds the logits (the
    // model's caller let them go, as a training step does), their gradient is written over them:
    // the classifier's backward then needs no second logits-sized buffer (llm.c's).
    return record_first(
        "CrossEntropyBackward", c, out,
        [logits = c.inputs[0], targets = c.inputs[1], ignore_index = c.int_attr(0),
         reduction = static_cast<Reduction>(c.int_attr(1)), lse = out[1]](const Grads& g) mutable {
          const bool over_logits = autograd::releases_after_apply() && logits.sole_owner();
          const Tensor held = over_logits ? std::move(logits) : logits;
          return Grads{ops::cross_entropy_backward(g[0], held, targets, ignore_index, reduction,
                                                   lse, {}, over_logits),
                       Tensor()};
        });
  };
  // Inputs (q, k, v), attrs (is_causal, scale, causal_offset: absent means 0; enable_gqa; then
  // dropout's, tensor/attention_attrs.h); outputs (out, logsumexp). The backward op gets the
  // forward's masks: the same is_causal and offset, the same dropout (its seed redraws the
  // keep-mask), and the same head grouping.
  f[OpId::scaled_dot_product_attention] = [](C c, Outs out) {
    return record_first("ScaledDotProductAttentionBackward", c, out,
                        [q = c.inputs[0], k = c.inputs[1], v = c.inputs[2], y = out[0],
                         lse = out[1], is_causal = c.bool_attr(0), scale = c.double_attr(1),
                         causal_offset = c.attrs.size() > 2 ? c.int_attr(2) : int64_t{0},
                         dropout = ops::attention_dropout_of(c, ops::kAttentionDropoutAttrs),
                         enable_gqa = c.attrs.size() > 3 && c.bool_attr(3)](const Grads& g) {
                          ops::AttentionGrads grads = ops::scaled_dot_product_attention_backward(
                              g[0], q, k, v, y, lse, is_causal, scale, causal_offset,
                              /*delta_from_out=*/false, dropout, enable_gqa);
                          return Grads{grads.dq, grads.dk, grads.dv};
                        });
  };
  // Attrs (p, seed, training, then a region's: tensor/attention_attrs.h's dropout_region_of);
  // outputs (out, mask). No mask: x came back unchanged.
  f[OpId::dropout] = [](C c, Outs out) {
    if (!out[1].defined()) return out;
    return record_first("DropoutBackward", c, out,
                        [mask = out[1], p = c.double_attr(0)](const Grads& g) {
                          return Grads{ops::dropout_backward(g[0], mask, p)};
                        });
  };
}

}  // namespace loom::autograd
