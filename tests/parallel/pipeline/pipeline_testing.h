// The model the pipeline tests use: a stack of kLayers blocks (Linear(kWidth, kWidth) + GELU),
// each block's weights seeded by its layer index so any subset builds the same weights as the
// whole stack, and a mean-squared-error loss.
#pragma once

#include <memory>

#include "autograd/functions.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/pipeline/split.h"

namespace loom::pipeline::testing {

inline constexpr int64_t kLayers = 8;
inline constexpr int64_t kWidth = 16;

class Block : public nn::Module {
 public:
  explicit Block(int64_t layer) : Module("Block") {
    fc_ = register_module("fc", std::make_shared<nn::Linear>(
                                    kWidth, kWidth, nn::LinearOptions{.seed = 100 + static_cast<uint64_t>(layer)}));
    act_ = register_module("act", std::make_shared<nn::GELU>());
  }
  Tensor forward(const Tensor& x) override { return (*act_)((*fc_)(x)); }

 private:
  std::shared_ptr<nn::Linear> fc_;
  std::shared_ptr<nn::GELU> act_;
};

inline std::shared_ptr<LayerSequence> build_layers(LayerRange range) {
  return LayerSequence::build(range, [](int64_t layer) { return std::make_shared<Block>(layer); });
}

// Mean over every element, so the mean of equal-sized microbatch losses is the batch's loss.
inline Tensor mse_loss(const Tensor& output, const Tensor& target) {
  const Tensor diff = sub(output, target);
  return mean(mul(diff, diff));
}

}  // namespace loom::pipeline::testing
