#include "autograd/functions_nn.h"

#include "autograd/sequence_context.h"
#include "base/error.h"

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
                                    bool is_causal, double scale, int64_t causal_offset,
                                    const AttentionDropout& dropout, bool enable_gqa) {
  // Under a sequence context (context parallelism: a sharded sequence) attention spans every
  // rank's tokens; the context calls back here with none installed.
  if (SequenceContext* context = current_sequence_context(); context != nullptr) {
    LOOM_CHECK(causal_offset == 0,
               "scaled_dot_product_attention: a causal_offset ({}) under a sequence context: the "
               "context places this rank's queries itself",
               causal_offset);
    return context->attention(q, k, v, is_causal, scale, enable_gqa, dropout);
  }
  return ops::scaled_dot_product_attention(q, k, v, is_causal, scale, causal_offset, dropout,
                                           enable_gqa)
      .out;
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training) {
  return ops::dropout(x, p, seed, training).out;
}

}  // namespace loom
