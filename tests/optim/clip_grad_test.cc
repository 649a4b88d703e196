#include "optim/clip_grad.h"

#include <gtest/gtest.h>

#include <cmath>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::optim {
namespace {

Tensor with_grad(const Tensor& value, const Tensor& grad) {
  Tensor p = value;
  p.set_requires_grad(true);
  p.set_grad(grad);
  return p;
}

TEST(ClipGradTest, PlainGradientsScaleToMaxNorm) {
  Tensor a = with_grad(ops::zeros({2}), ops::from_vector({3, 4}, {2}));
  Tensor b = with_grad(ops::zeros({1}), ops::from_vector({12}, {1}));
  const double norm = clip_grad_norm_({a, b}, 6.5);
  EXPECT_NEAR(norm, 13.0, 1e-6);  // sqrt(9 + 16 + 144)
  // Scaled by 6.5 / 13 = 0.5 (less the 1e-6 guard).
  EXPECT_NEAR(ops::to_vector(a.grad())[1], 2.0, 1e-5);
  EXPECT_NEAR(ops::to_vector(b.grad())[0], 6.0, 1e-5);
  // Below the limit nothing changes.
  EXPECT_NEAR(clip_grad_norm_({a, b}, 100.0), 6.5, 1e-5);
  EXPECT_NEAR(ops::to_vector(b.grad())[0], 6.0, 1e-5);
}

TEST(ClipGradTest, ShardedAndReplicatedGradientsGiveTheSingleRankNorm) {
  // Single-rank reference: grads g1 (5, 3) and g2 (4,).
  const Tensor g1 = ops::uniform({5, 3}, 1, -1.0, 1.0), g2 = ops::uniform({4}, 2, -1.0, 1.0);
  double expected = 0;
  for (double v : ops::to_vector(g1)) expected += v * v;
  for (double v : ops::to_vector(g2)) expected += v * v;
  expected = std::sqrt(expected);
  comm::testing::run_on_ranks(3, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{3});
    // g1 sharded unevenly (rows 2, 2, 1), g2 replicated as a DTensor.
    Tensor p1 = with_grad(distribute_tensor(ops::zeros({5, 3}), mesh, {Shard(0)}),
                          distribute_tensor(g1, mesh, {Shard(0)}));
    Tensor p2 = with_grad(distribute_tensor(ops::zeros({4}), mesh, {Replicate()}),
                          distribute_tensor(g2, mesh, {Replicate()}));
    const double norm = clip_grad_norm_({p1, p2}, 0.5 * expected);
    EXPECT_NEAR(norm, expected, 1e-5 * expected);
    // After clipping, the full gradient is half the original.
    testing::expect_close({.actual = full_tensor(p1.grad()),
                           .expected = ops::mul(g1, 0.5),
                           .tol = {.atol = 1e-5},
                           .what = "clipped gradient"});
  });
}

}  // namespace
}  // namespace loom::optim
