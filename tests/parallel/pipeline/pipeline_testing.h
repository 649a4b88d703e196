// What the pipeline tests share: the model (a stack of kLayers blocks, Linear(kWidth, kWidth) +
// GELU, each block's weights seeded by its layer index so any subset builds the same weights as
// the whole stack), a mean-squared-error loss, the one-rank reference step, and a check that a
// pipelined step matches it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/split.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::pipeline::testing {

inline constexpr int64_t kLayers = 8;
inline constexpr int64_t kWidth = 16;

class Block : public nn::Module {
 public:
  explicit Block(int64_t layer) : Module("Block") {
    fc_ = register_module(
        "fc", std::make_shared<nn::Linear>(
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

// The whole stack on one rank: one forward and backward on the whole batch.
struct Reference {
  double loss;
  nn::StateDict grads;  // by parameter name ("3.fc.weight": LayerSequence keeps layer indices)
};

inline Reference reference_step(const Tensor& inputs, const Tensor& targets) {
  auto model = build_layers({0, kLayers});
  const Tensor loss = mse_loss((*model)(inputs), targets);
  backward(loss);
  Reference ref{loss.item<double>(), {}};
  for (const auto& [name, p] : model->named_parameters()) ref.grads[name] = p.grad();
  return ref;
}

// This rank's stages of `schedule`, the layers split evenly over its stages; `make_stage` wraps
// a stage's module (default: a PipelineStage on `pg`).
using StageFactory =
    std::function<std::shared_ptr<PipelineStage>(std::shared_ptr<nn::Module> module, int stage)>;
inline std::vector<std::shared_ptr<PipelineStage>> build_stages(const Schedule& schedule,
                                                                int pp_rank,
                                                                const StageFactory& make_stage) {
  const auto ranges = split_layers(kLayers, schedule.num_stages);
  std::vector<std::shared_ptr<PipelineStage>> stages;
  for (int s : schedule.stages_of_rank(pp_rank))
    stages.push_back(make_stage(build_layers(ranges[s]), s));
  return stages;
}

// Runs one step (gradients zeroed first; the inputs given to the first stage's rank and the
// targets to the last's only) and checks the loss and this rank's gradients against `ref`:
// f32 sums in another order (per microbatch, then accumulated), so 1e-5 relative (to each
// gradient's largest magnitude).
inline void expect_step_matches(PipelineExecutor& executor,
                                const std::vector<std::shared_ptr<PipelineStage>>& stages,
                                int pp_rank, const Tensor& inputs, const Tensor& targets,
                                const Reference& ref) {
  const Schedule& schedule = executor.schedule();
  for (const auto& stage : stages) stage->module().zero_grad();
  const bool first = schedule.rank_of_stage(0) == pp_rank;
  const bool last = schedule.rank_of_stage(schedule.num_stages - 1) == pp_rank;
  const double loss = executor.step(first ? inputs : Tensor(), last ? targets : Tensor());
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::abs(ref.loss));
  for (const auto& stage : stages) {
    for (const auto& [name, param] : stage->module().named_parameters()) {
      ASSERT_TRUE(param.grad().defined()) << name;
      loom::testing::expect_close(
          {.actual = param.grad(),
           .expected = ref.grads.at(name),
           .tol = {.rtol = 1e-5, .relative_to = loom::testing::RelativeTo::kLargest},
           .what = "grad of " + name});
    }
  }
}

}  // namespace loom::pipeline::testing
