// y = x W^T + b, with W (out_features, in_features) as in torch.nn.Linear and GPT-2's tensors.
#pragma once

#include "nn/module.h"

namespace loom::nn {

struct LinearOptions {
  bool bias = true;
  // Initialization seed (counter-based RNG: the same seed gives the same weights on every
  // rank and for every shard). W and b ~ U(-1/sqrt(in), 1/sqrt(in)), PyTorch's default.
  uint64_t seed = 0;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  // (..., in_features) -> (..., out_features)
  Tensor forward(const Tensor& input) override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

  // W and b ~ U(-1/sqrt(in), 1/sqrt(in)) from the options' seed.
  void reset_parameters() override;

 private:
  int64_t in_features_;
  int64_t out_features_;
  uint64_t seed_;
  const Tensor& weight_;  // (out_features, in_features)
  const Tensor& bias_;    // (out_features,), undefined without bias
};

}  // namespace loom::nn
