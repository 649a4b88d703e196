// AdamW on DTensor parameters: the fused kernel runs on the local shards when the gradient and
// the moments lie like the parameter, so a sharded step equals one rank's step on the whole
// tensor bit for bit (the update is element-wise); a gradient laid out otherwise (Partial)
// takes the composed DTensor ops and still matches to f32 rounding.
#include <gtest/gtest.h>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::optim {
namespace {

// Three AdamW steps of a (5, 3) parameter on one rank, plain tensors: the reference.
Tensor reference_after_steps(const Tensor& init, const std::vector<Tensor>& grads) {
  Tensor p = ops::clone(init);
  p.set_requires_grad(true);
  AdamW adam({p}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  for (const Tensor& g : grads) {
    p.set_grad(g);
    adam.step();
  }
  return p;
}

TEST(AdamWDTensorTest, ShardedStepEqualsOneRanksBitForBit) {
  const Tensor init = ops::uniform({5, 3}, 1, -1.0, 1.0);
  std::vector<Tensor> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(ops::uniform({5, 3}, 10 + s, -1.0, 1.0));
  const Tensor expected = reference_after_steps(init, grads);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    for (const Placement& placement : {Shard(0), Shard(1), Replicate()}) {
      Tensor p = distribute_tensor(ops::clone(init), mesh, {placement});  // uneven for Shard(0)
      p.set_requires_grad(true);
      AdamW adam({p}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
      for (const Tensor& g : grads) {
        p.set_grad(distribute_tensor(g, mesh, {placement}));
        adam.step();
      }
      EXPECT_EQ(ops::to_vector(full_tensor(p)), ops::to_vector(expected))
          << "placement " << placement.str() << " on rank " << pg.rank();
      EXPECT_EQ(dtensor_spec(p).placements, Placements{placement});
    }
  });
}

TEST(AdamWDTensorTest, PartialGradientTakesTheComposedOps) {
  const Tensor init = ops::uniform({4, 3}, 2, -1.0, 1.0);
  const Tensor grad = ops::uniform({4, 3}, 3, -1.0, 1.0);
  const Tensor expected = reference_after_steps(init, {grad});
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"dp"}, std::vector<int64_t>{2});
    Tensor p = distribute_tensor(ops::clone(init), mesh, {Replicate()});
    p.set_requires_grad(true);
    AdamW adam({p}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    // Each rank holds half of the gradient as a pending sum.
    p.set_grad(from_local(ops::mul(grad, 0.5), mesh, {Partial()}));
    adam.step();
    testing::expect_close({.actual = full_tensor(p),
                           .expected = expected,
                           .tol = {.atol = 1e-6},
                           .what = "AdamW with a Partial gradient"});
  });
}

}  // namespace
}  // namespace loom::optim
