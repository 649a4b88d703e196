// The small standard layers: Embedding, LayerNorm, Dropout, GELU (torch.nn names).
#pragma once

#include "nn/module.h"
#include "tensor/ops_nn.h"

namespace loom::nn {

// Lookup table (num_embeddings, embedding_dim), initialized N(0, std) from `seed`.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed = 0,
            double init_std = 1.0);
  // indices (any shape, i64/i32) -> (*indices.shape, embedding_dim)
  Tensor forward(const Tensor& indices) override;
  const Tensor& weight() const { return weight_; }
  // weight ~ N(0, init_std) from the seed.
  void reset_parameters() override;

 private:
  uint64_t seed_;
  double init_std_;
  const Tensor& weight_;
};

// Normalizes over the trailing `normalized_shape` dims; weight ones, bias zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  void reset_parameters() override;  // weight ones, bias zeros

 private:
  Shape normalized_shape_;
  double eps_;
  const Tensor& weight_;
  const Tensor& bias_;
};

// Zeroes elements with probability p in training mode and scales the rest by 1/(1-p). Each
// call draws a fresh mask from (seed, call number), so runs are reproducible.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, uint64_t seed = 0);
  Tensor forward(const Tensor& input) override;
  // For an op that draws its mask itself (attention's probabilities: AttentionDropout, with
  // HF GPT-2's `attn_dropout` module as the place its p and RNG state live): this call's p and
  // seed, drawn as forward draws them (one call counted), or p = 0 outside training. The mask
  // is of `shape` (the probabilities, batch first), or the piece `region` places in this
  // forward's; its region places it in the whole batch's (nn/batch_part.h).
  AttentionDropout next_mask(const Shape& shape, const RngRegion& region = {});
  // How many masks it has drawn: its RNG state (each call's mask is a function of the seed and
  // this count), saved and restored by checkpoints so a resumed run draws the same masks.
  uint64_t calls() const { return calls_; }
  void set_calls(uint64_t calls) { calls_ = calls; }

 private:
  double p_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  uint64_t next_seed();
};

// GPT-2's tanh-approximated GELU.
class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& input) override;
};

}  // namespace loom::nn
