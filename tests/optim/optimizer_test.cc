#include "optim/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "base/error.h"
#include "tensor/device.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom::optim {
namespace {

using testing::expect_close;

Tensor param(std::vector<float> values) {
  Tensor p = ops::from_vector(values, {static_cast<int64_t>(values.size())});
  p.set_requires_grad(true);
  return p;
}

// f32 updates compared with the same recurrence in f64.
constexpr double kTol = 1e-6;

TEST(SGDTest, MomentumAndWeightDecayFollowTorchRecurrence) {
  Tensor p = param({1.0f, -2.0f});
  SGD sgd({p}, SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  double ref[2] = {1.0, -2.0}, buf[2] = {0, 0};
  const double grads[3][2] = {{0.5, -1.0}, {0.25, 0.75}, {-1.0, 2.0}};
  for (int step = 0; step < 3; ++step) {
    p.set_grad(ops::from_vector(
        {static_cast<float>(grads[step][0]), static_cast<float>(grads[step][1])}, {2}));
    sgd.step();
    for (int i = 0; i < 2; ++i) {
      const double g = grads[step][i] + 0.01 * ref[i];
      buf[i] = step == 0 ? g : 0.9 * buf[i] + g;
      ref[i] -= 0.1 * buf[i];
    }
    expect_close({.actual = p,
                  .expected = {ref[0], ref[1]},
                  .tol = {.atol = kTol},
                  .what = "step " + std::to_string(step)});
  }
}

TEST(AdamWTest, MatchesReferenceRecurrence) {
  Tensor p = param({0.5f, -0.25f});
  AdamW adam({p}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  double ref[2] = {0.5, -0.25}, m[2] = {0, 0}, v[2] = {0, 0};
  const double grads[3][2] = {{0.1, -0.2}, {0.3, 0.0}, {-0.5, 0.4}};
  for (int step = 1; step <= 3; ++step) {
    p.set_grad(ops::from_vector(
        {static_cast<float>(grads[step - 1][0]), static_cast<float>(grads[step - 1][1])}, {2}));
    adam.step();
    for (int i = 0; i < 2; ++i) {
      const double g = grads[step - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.9, step));
      const double v_hat = v[i] / (1 - std::pow(0.999, step));
      ref[i] = ref[i] * (1 - 0.01 * 0.1) - 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
    expect_close({.actual = p,
                  .expected = {ref[0], ref[1]},
                  .tol = {.atol = kTol},
                  .what = "step " + std::to_string(step)});
  }
}

TEST(AdamWTest, StepCountIsPerParameter) {
  // b gets its first gradient at the second step: its update must equal a first step's.
  Tensor a = param({1.0f}), b = param({1.0f});
  AdamW adam({a, b}, AdamWOptions{.lr = 0.1, .weight_decay = 0.0});
  a.set_grad(ops::from_vector({0.5f}, {1}));
  adam.step();
  a.set_grad(ops::from_vector({0.5f}, {1}));
  b.set_grad(ops::from_vector({0.5f}, {1}));
  adam.step();
  // First Adam step moves by lr * m_hat / (sqrt(v_hat) + eps) = lr * sign(g) (almost exactly).
  EXPECT_NEAR(ops::to_vector(b)[0], 1.0 - 0.1, 1e-6);
}

// Parameters the fused pass takes and ones it does not (a transposed gradient) in one step: each
// gets the update it gets alone.
TEST(AdamWTest, FusedAndComposedParametersInOneStepEachGetTheirOwnUpdate) {
  const AdamWOptions options{.lr = 0.01, .weight_decay = 0.1};
  const auto matrix = [] {
    Tensor m = ops::from_vector({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
    m.set_requires_grad(true);
    return m;
  };
  Tensor a = param({0.5f, -0.25f, 1.0f, 2.0f}), b = matrix();
  Tensor a_alone = param({0.5f, -0.25f, 1.0f, 2.0f}), b_alone = matrix();
  AdamW together({a, b}, options), first({a_alone}, options), second({b_alone}, options);
  for (int step = 0; step < 3; ++step) {
    const Tensor ga = ops::from_vector({0.1f, -0.2f, 0.3f * step, 0.0f}, {4});
    const Tensor gb = ops::from_vector({0.5f, -1.0f, 0.25f, 0.125f * step}, {2, 2});
    a.set_grad(ga);
    b.set_grad(ops::transpose(ops::contiguous(ops::transpose(gb, 0, 1)), 0, 1));  // a view
    ASSERT_FALSE(b.grad().is_contiguous());
    a_alone.set_grad(ga);
    b_alone.set_grad(gb);
    together.step();
    first.step();
    second.step();
    expect_close({.actual = a, .expected = a_alone, .tol = {.atol = kTol}, .what = "fused"});
    expect_close({.actual = b, .expected = b_alone, .tol = {.atol = kTol}, .what = "composed"});
  }
}

// Traced for a GPU (the meta device following CUDA's kernels), AdamW's step is the fused kernel
// in place: the first step allocates only the two moments, later steps nothing.
TEST(AdamWTest, TracedForAGpuTheStepAllocatesOnlyTheMoments) {
  const MetaTargetGuard follow(Device::cuda());
  Tensor p = ops::empty({64, 32}, kFloat32, Device::meta());
  p.set_requires_grad(true);
  AdamW adam({p}, AdamWOptions{});
  p.set_grad(ops::empty({64, 32}, kFloat32, Device::meta()));
  MemoryTracker tracker;
  ScopedMemoryTracker scope(tracker);
  adam.step();
  EXPECT_EQ(tracker.stats().allocated_bytes, 2 * 64 * 32 * 4);
  adam.step();
  EXPECT_EQ(tracker.stats().allocated_bytes, 2 * 64 * 32 * 4);
}

TEST(OptimizerTest, SkipsParametersWithoutGradAndRejectsNonLeaves) {
  Tensor p = param({1.0f});
  SGD sgd({p}, SGDOptions{.lr = 1.0});
  sgd.step();
  EXPECT_EQ(ops::to_vector(p), std::vector<double>{1.0});
  EXPECT_THROW(SGD({ops::ones({2})}, SGDOptions{}), Error);
}

}  // namespace
}  // namespace loom::optim
