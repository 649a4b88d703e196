// Splitting a stack of layers into pipeline stages, and the stage module that runs a range of
// them. Generic over any layers that map Tensor -> Tensor; a model with a different first or
// last stage (GPT: embeddings first; ln_f, head and loss last) builds its own stage modules
// from the same ranges.
//
//   auto ranges = split_layers(8, 4);                 // [0,2) [2,4) [4,6) [6,8)
//   auto module = LayerSequence::build(ranges[stage], [](int64_t layer) { return make_block(layer);
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace loom::pipeline {

// Layers [begin, end) of the whole model.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const LayerRange&) const = default;
};

// An even split of num_layers layers into num_stages stages (p * v for interleaving), in order:
// every stage gets num_layers / num_stages layers and the first num_layers % num_stages stages
// one more. Throws when a stage would get no layer.
std::vector<LayerRange> split_layers(int64_t num_layers, int num_stages);
// An explicit split: stage i gets layers_per_stage[i] layers (each at least 1, summing to
// num_layers). Throws naming the split and the model's layer count otherwise.
std::vector<LayerRange> split_layers(int64_t num_layers,
                                     const std::vector<int64_t>& layers_per_stage);

// The layers of one stage, run in order. Each is registered under its index in the whole model
// ("4", "5", ...), so a stage's parameter names are those of the same layers in an
// nn::ModuleList of all layers ("4.weight"), and stage state dicts merge into the full model's.
class LayerSequence : public nn::Module {
 public:
  // Builds only the layers in `range` (a stage never holds other stages' parameters).
  static std::shared_ptr<LayerSequence> build(
      LayerRange range,
      const std::function<std::shared_ptr<nn::Module>(int64_t layer)>& make_layer);

  explicit LayerSequence(LayerRange range) : Module("LayerSequence"), range_(range) {}
  Tensor forward(const Tensor& input) override;
  LayerRange range() const { return range_; }

 private:
  LayerRange range_;
  std::vector<std::shared_ptr<nn::Module>> layers_;
};

}  // namespace loom::pipeline
