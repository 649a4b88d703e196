#include "nn/layers.h"

#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"
#include "nn/batch_part.h"
#include "tensor/rng.h"

namespace loom::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed, double init_std)
    : Module("Embedding"),
      seed_(seed),
      init_std_(init_std),
      weight_(register_parameter("weight", ops::empty({num_embeddings, embedding_dim}))) {
  reset_parameters();
}

void Embedding::reset_parameters() { ops::normal_(weight_, seed_, 0.0, init_std_); }

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight_, indices); }

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"),
      normalized_shape_(normalized_shape),
      eps_(eps),
      weight_(elementwise_affine ? register_parameter("weight", ops::empty(normalized_shape))
                                 : absent_parameter()),
      bias_(elementwise_affine ? register_parameter("bias", ops::empty(normalized_shape))
                               : absent_parameter()) {
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight_.defined()) ops::fill_(weight_, 1.0);
  if (bias_.defined()) ops::fill_(bias_, 0.0);
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layer_norm(input, normalized_shape_, weight_, bias_, eps_);
}

Dropout::Dropout(double p, uint64_t seed) : Module("Dropout"), p_(p), seed_(seed) {
  LOOM_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got {}", p);
}

uint64_t Dropout::next_seed() {
  // Mix the call number into the seed (splitmix64 step) so successive calls differ.
  uint64_t z = seed_ + 0x9E3779B97F4A7C15ull * (++calls_);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Tensor Dropout::forward(const Tensor& input) {
  if (!is_training() || p_ == 0.0) return input;
  // Placed at this forward's rows of the whole batch and its tokens' positions in the whole
  // sequence (nn/batch_part.h); a distributed tensor's shards are placed within it by its
  // strategy.
  return ops::dropout(input, p_, next_seed(), /*training=*/true, activation_region(input.shape()))
      .out;
}

AttentionDropout Dropout::next_mask(const Shape& shape, const RngRegion& region) {
  if (!is_training() || p_ == 0.0) return {};
  return {.p = p_, .seed = next_seed(), .region = batch_region(shape, region)};
}

Tensor GELU::forward(const Tensor& input) { return gelu(input); }

}  // namespace loom::nn
