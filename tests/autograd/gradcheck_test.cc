// Every differentiable op against central finite differences (autograd/gradcheck.h).
//
// Tolerances: inputs are f32 and eps = 1e-2, so central differences carry truncation error
// ~eps^2 * f''' (~1e-4 for these smooth functions on [-1, 1]) and rounding error
// ~ulp(output sum) / eps (~1e-5). atol 1e-3 + rtol 1e-2 sits an order of magnitude above both;
// a wrong backward formula misses it by far more.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "tests/autograd/test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::expect_equal;
using testing::leaf;
using testing::passes_gradcheck;

TEST(GradcheckTest, BinaryOpsWithBroadcasting) {
  // (3, 1, 4) op (2, 4): both operands broadcast.
  const auto a = leaf({3, 1, 4}, 1), b = leaf({2, 4}, 2, 0.5, 1.5);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return add(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return sub(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return mul(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return div(x[0], x[1]); }, {a, b}));
}

TEST(GradcheckTest, ScalarForms) {
  const auto a = leaf({2, 3}, 3);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return add(x[0], 2.5); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return sub(x[0], 2.5); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return rsub(x[0], 2.5); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return mul(x[0], -1.5); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return div(x[0], 4.0); }, {a}));
}

TEST(GradcheckTest, UnaryOps) {
  const auto a = leaf({2, 3}, 4);
  const auto positive = leaf({2, 3}, 5, 0.5, 2.0);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return neg(x[0]); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return exp(x[0]); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return tanh(x[0]); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return gelu(x[0]); }, {a}));
  // silu_mul's fused backward, with `up` broadcast over the rows.
  EXPECT_TRUE(
      passes_gradcheck([](const auto& x) { return silu_mul(x[0], x[1]); }, {a, leaf({3}, 8)}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return pow(x[0], 3.0); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return log(x[0]); }, {positive}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return sqrt(x[0]); }, {positive}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return rsqrt(x[0]); }, {positive}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return pow(x[0], -0.5); }, {positive}));
  // relu away from its kink at 0 (finite differences straddling 0 are meaningless).
  const auto away = ops::from_vector({-0.8f, -0.3f, 0.4f, 0.9f}, {4});
  Tensor r = away;
  r.set_requires_grad(true);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return relu(x[0]); }, {r}));
}

TEST(GradcheckTest, SelectionOps) {
  const auto a = leaf({3, 4}, 6), b = leaf({4}, 7);
  const Tensor cond = ops::from_vector({1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0}, {3, 4});
  EXPECT_TRUE(passes_gradcheck([cond](const auto& x) { return where(cond, x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(
      passes_gradcheck([cond](const auto& x) { return masked_fill(x[0], cond, -2.0); }, {a}));
}

TEST(GradcheckTest, ViewsOnNonContiguousInputs) {
  const auto a = leaf({4, 6}, 8);
  // Each function starts from a transposed (non-contiguous) view of its input.
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        return mul(reshape(transpose(x[0], 0, 1), {3, 8}), 2.0);
      },
      {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return exp(view(x[0], {2, 12})); }, {a}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        return tanh(permute(reshape(x[0], {2, 3, 4}), {2, 0, 1}));
      },
      {a}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) { return exp(narrow(transpose(x[0], 0, 1), 0, 1, 3)); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return exp(slice(x[0], 1, 1, 6, 2)); }, {a}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        return mul(expand(unsqueeze(x[0], 0), {3, 4, 6}), 1.5);
      },
      {a}));
  EXPECT_TRUE(
      passes_gradcheck([](const auto& x) { return exp(squeeze(unsqueeze(x[0], 1), 1)); }, {a}));
  EXPECT_TRUE(
      passes_gradcheck([](const auto& x) { return exp(contiguous(transpose(x[0], 0, 1))); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return tanh(clone(x[0])); }, {a}));
}

TEST(GradcheckTest, SplittingAndJoining) {
  const auto a = leaf({5, 3}, 9), b = leaf({2, 3}, 10);
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        auto pieces = chunk(x[0], 2, 0);  // uneven: 3 + 2 rows
        return add(mul(pieces[0], 2.0), sum(exp(pieces[1]), {0}, true));
      },
      {a}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        auto pieces = split(x[0], 2, 0);  // 2 + 2 + 1 rows
        return mul(pieces[2], sum(pieces[0]));
      },
      {a}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        const std::vector<Tensor> parts{x[0], exp(x[1])};
        return cat(parts, 0);
      },
      {a, b}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        const std::vector<Tensor> parts{x[0], mul(x[0], x[0])};
        return stack(parts, 1);
      },
      {b}));
}

TEST(GradcheckTest, Reductions) {
  const auto a = leaf({2, 3, 4}, 11);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return sum(x[0]); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return sum(x[0], {0, 2}); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return sum(x[0], {-1}, true); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return mean(x[0], {1}); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return mean(x[0]); }, {a}));
  // max needs values at least 2 * eps apart, or a perturbation flips the argmax and the
  // numeric derivative is meaningless: a permutation of 0.1-spaced values.
  std::vector<float> spaced(24);
  for (int i = 0; i < 24; ++i) spaced[i] = static_cast<float>((i * 7) % 24) * 0.1f - 1.2f;
  Tensor distinct = ops::from_vector(spaced, {2, 3, 4});
  distinct.set_requires_grad(true);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return max(x[0], 1).first; }, {distinct}));
  EXPECT_TRUE(
      passes_gradcheck([](const auto& x) { return max(x[0], -1, true).first; }, {distinct}));
}

// unbind: one node for every slice; slices that get no gradient count as zeros.
TEST(GradcheckTest, Unbind) {
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        const auto parts = unbind(x[0], 1);
        return add(mul(parts[0], parts[2]), parts[0]);  // parts[1] unused
      },
      {leaf({2, 3, 4}, 50)}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) {
        const auto parts = unbind(x[0], -1);
        return add(parts[0], mul(parts[1], 3.0));
      },
      {leaf({3, 2}, 51)}));
  const Tensor t = ops::zeros({2, 3});
  const auto parts = unbind(t, 0);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].shape(), (Shape{3}));
  EXPECT_THROW(unbind(t, 2), loom::Error);
}

TEST(GradcheckTest, Matmul) {
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return matmul(x[0], x[1]); },
                               {leaf({3, 4}, 12), leaf({4, 5}, 13)}));
  // Transposed operands reach the GEMM as flags; their gradients must still land right.
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) { return matmul(transpose(x[0], 0, 1), transpose(x[1], 0, 1)); },
      {leaf({4, 3}, 14), leaf({5, 4}, 15)}));
  // Batched with a broadcast batch dim.
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return matmul(x[0], x[1]); },
                               {leaf({2, 1, 3, 4}, 16), leaf({5, 4, 2}, 17)}));
  // A 2-D weight shared over two batch dims (its gradient is one GEMM over the flattened rows),
  // also with a transposed weight and a non-contiguous batched operand.
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return matmul(x[0], x[1]); },
                               {leaf({2, 3, 2, 4}, 24), leaf({4, 3}, 25)}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& x) { return matmul(transpose(x[0], 1, 2), transpose(x[1], 0, 1)); },
      {leaf({2, 5, 3, 4}, 26), leaf({3, 4}, 27)}));
  // 1-D operands.
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return matmul(x[0], x[1]); },
                               {leaf({4}, 18), leaf({4, 3}, 19)}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return matmul(x[0], x[1]); },
                               {leaf({3, 4}, 20), leaf({4}, 21)}));
  // Only one operand requiring grad.
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return matmul(x[0], x[1]); },
                               {leaf({3, 4}, 22), ops::uniform({4, 2}, 23)}));
}

TEST(GradcheckTest, Linear) {
  // One node for input @ weight^T + bias: all three gradients, batch dims flattened into rows.
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return linear(x[0], x[1], x[2]); },
                               {leaf({2, 3, 4}, 40), leaf({5, 4}, 41), leaf({5}, 42)}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return linear(x[0], x[1]); },
                               {leaf({3, 4}, 43), leaf({2, 4}, 44)}));
  // Only the weight requires grad; a transposed (non-contiguous) input.
  EXPECT_TRUE(
      passes_gradcheck([](const auto& x) { return linear(transpose(x[1], 0, 1), x[0], x[2]); },
                       {leaf({2, 4}, 45), ops::uniform({4, 3}, 46), ops::uniform({2}, 47)}));
}

TEST(GradcheckTest, DtypeConversionPassesGradientBackInOriginalDtype) {
  // Finite differences through bf16 rounding are meaningless, so check the formula directly:
  // to(bf16) backward converts the gradient back to f32.
  Tensor a = leaf({3}, 24);
  Tensor y = to(a, kBFloat16);
  EXPECT_EQ(y.dtype(), kBFloat16);
  backward(sum(to(y, kFloat32)));
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().dtype(), kFloat32);
  expect_equal({.actual = a.grad(), .expected = {1, 1, 1}});
}

}  // namespace
}  // namespace loom
