#include "parallel/pipeline/split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"

namespace loom::pipeline {

std::vector<LayerRange> split_layers(int64_t num_layers, int num_stages) {
  LOOM_CHECK(num_stages >= 1, "split_layers: got {} stages; need at least 1", num_stages);
  LOOM_CHECK(num_layers >= num_stages,
             "split_layers: cannot split {} layers into {} stages; each stage needs at least one "
             "layer",
             num_layers, num_stages);
  std::vector<int64_t> sizes(num_stages, num_layers / num_stages);
  for (int64_t stage = 0; stage < num_layers % num_stages; ++stage) ++sizes[stage];
  return split_layers(num_layers, sizes);
}

std::vector<LayerRange> split_layers(int64_t num_layers,
                                     const std::vector<int64_t>& layers_per_stage) {
  LOOM_CHECK(!layers_per_stage.empty(),
             "split_layers: the split is empty; give one layer count "
             "per stage");
  std::vector<LayerRange> ranges;
  int64_t begin = 0;
  for (size_t stage = 0; stage < layers_per_stage.size(); ++stage) {
    LOOM_CHECK(layers_per_stage[stage] >= 1,
               "split_layers: the split [{}] gives stage {} {} layers; each stage needs at least "
               "one",
               fmt::join(layers_per_stage, ", "), stage, layers_per_stage[stage]);
    ranges.push_back({begin, begin + layers_per_stage[stage]});
    begin += layers_per_stage[stage];
  }
  LOOM_CHECK(begin == num_layers, "split_layers: the split [{}] has {} layers but the model has {}",
             fmt::join(layers_per_stage, ", "), begin, num_layers);
  return ranges;
}

std::shared_ptr<LayerSequence> LayerSequence::build(
    LayerRange range, const std::function<std::shared_ptr<nn::Module>(int64_t layer)>& make_layer) {
  auto sequence = std::make_shared<LayerSequence>(range);
  for (int64_t layer = range.begin; layer < range.end; ++layer) {
    auto module = make_layer(layer);
    LOOM_CHECK(module != nullptr, "LayerSequence::build: make_layer({}) returned null", layer);
    sequence->layers_.push_back(sequence->register_module(std::to_string(layer), module));
  }
  return sequence;
}

Tensor LayerSequence::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& layer : layers_) x = (*layer)(x);
  return x;
}

}  // namespace loom::pipeline
