#include "nn/layers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "nn/linear.h"
#include "tests/testing/tensor_checks.h"

namespace loom::nn {
namespace {

using testing::expect_close;
using ::testing::HasSubstr;

// Tolerance for f32 results compared with an f64 reference over a handful of terms.
constexpr double kTol = 1e-5;

TEST(LinearTest, ForwardAndGradientsMatchManualComputation) {
  Linear linear(3, 2, LinearOptions{.seed = 5});
  const auto w = ops::to_vector(linear.weight());
  const auto b = ops::to_vector(linear.bias());
  // Initialization bound: U(-1/sqrt(3), 1/sqrt(3)).
  for (double v : w) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(3.0));
  Tensor x = ops::from_vector({1, 2, 3, -1, 0, 4}, {2, 3});
  Tensor y = linear(x);
  ASSERT_EQ(y.shape(), (Shape{2, 2}));
  const auto xv = ops::to_vector(x);
  std::vector<double> expected;
  for (int n = 0; n < 2; ++n) {
    for (int o = 0; o < 2; ++o) {
      expected.push_back(b[o]);
      for (int i = 0; i < 3; ++i) expected.back() += xv[n * 3 + i] * w[o * 3 + i];
    }
  }
  expect_close({.actual = y, .expected = expected, .tol = {.atol = kTol}});
  backward(sum(y));
  // d sum(y) / dW[o, i] = sum_n x[n, i]; d / db[o] = N.
  EXPECT_EQ(ops::to_vector(linear.weight().grad()), (std::vector<double>{0, 2, 7, 0, 2, 7}));
  EXPECT_EQ(ops::to_vector(linear.bias().grad()), (std::vector<double>{2, 2}));
}

TEST(LinearTest, SameSeedSameWeights) {
  Linear a(4, 3, LinearOptions{.seed = 9}), b(4, 3, LinearOptions{.seed = 9}),
      c(4, 3, LinearOptions{.seed = 10});
  EXPECT_EQ(ops::to_vector(a.weight()), ops::to_vector(b.weight()));
  EXPECT_NE(ops::to_vector(a.weight()), ops::to_vector(c.weight()));
}

TEST(LinearTest, WrongInputWidthNamesShapes) {
  Linear linear(3, 2);
  try {
    linear(ops::zeros({4, 5}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr(
            "Linear: input of shape (4, 5) does not end in in_features=3 (weight shape (2, 3))"));
  }
}

TEST(EmbeddingTest, LooksUpRowsAndAccumulatesGradients) {
  Embedding emb(5, 2, /*seed=*/3);
  Tensor idx = ops::from_vector_i64({1, 4, 1}, {3});
  Tensor out = emb(idx);
  const auto table = ops::to_vector(emb.weight());
  const auto rows = ops::to_vector(out);
  EXPECT_EQ(rows[0], table[2]);
  EXPECT_EQ(rows[3], table[9]);
  backward(sum(out));
  EXPECT_EQ(ops::to_vector(emb.weight().grad()),
            (std::vector<double>{0, 0, 2, 2, 0, 0, 0, 0, 1, 1}));
}

TEST(LayerNormTest, NormalizesLastDim) {
  LayerNorm ln(Shape{4});
  Tensor y = ln(ops::from_vector({1, 2, 3, 4}, {1, 4}));
  // mean 2.5, biased variance 1.25.
  const double rstd = 1.0 / std::sqrt(1.25 + 1e-5);
  expect_close({.actual = y,
                .expected = {-1.5 * rstd, -0.5 * rstd, 0.5 * rstd, 1.5 * rstd},
                .tol = {.atol = kTol}});
}

TEST(DropoutTest, EvalIsIdentityAndTrainIsReproducible) {
  Dropout a(0.5, 42), b(0.5, 42);
  Tensor x = ops::ones({1000});
  Tensor ya = a(x), yb = b(x);
  EXPECT_EQ(ops::to_vector(ya), ops::to_vector(yb));
  // Kept elements are scaled by 1 / (1 - p) = 2; the kept fraction is near 1/2.
  double kept = 0;
  for (double v : ops::to_vector(ya)) {
    EXPECT_TRUE(v == 0.0 || v == 2.0);
    kept += v != 0.0;
  }
  EXPECT_NEAR(kept / 1000.0, 0.5, 0.06);  // ~4 sigma for n = 1000
  // A second call draws a different mask.
  EXPECT_NE(ops::to_vector(a(x)), ops::to_vector(ya));
  a.eval();
  EXPECT_TRUE(a(x).is_same(x));
  EXPECT_THROW(Dropout(1.5), Error);
}

TEST(GeluTest, MatchesTanhApproximation) {
  GELU gelu_module;
  auto ref = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  expect_close({.actual = gelu_module(ops::from_vector({-1, 0, 2}, {3})),
                .expected = {ref(-1), 0.0, ref(2)},
                .tol = {.atol = kTol}});
}

}  // namespace
}  // namespace loom::nn
