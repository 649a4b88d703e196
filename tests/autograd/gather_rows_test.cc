// gather_rows (autograd/gather_rows.h): rows by a host index, -1 reading zeros, against
// ops::embedding forward and its scatter-add backward (which it replaces in the mixture of
// experts), by finite differences, and in bf16 without an f32 intermediate.
#include "autograd/gather_rows.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::expect_close;

Tensor leaf(const std::vector<float>& values, const Shape& shape, DType dtype = kFloat32) {
  Tensor t = ops::from_vector(values, shape, dtype);
  t.set_requires_grad(true);
  return t;
}

TEST(GatherRows, ForwardAndBackwardMatchEmbeddingWithAZeroRow) {
  // Rows 0..3 of width 2; row 1 read three times, row 3 never, -1 twice.
  const std::vector<int64_t> index = {1, -1, 0, 1, 2, 1, -1, 0};
  const Tensor x = leaf({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  const Tensor y = gather_rows(x, index, {4, 2});
  ASSERT_EQ(shape_str(y.shape()), "(4, 2, 2)");
  const Tensor g =
      ops::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {4, 2, 2});
  backward(y, g);
  // The reference: embedding over x with a zero row appended (index -1 -> row 4).
  std::vector<int64_t> padded = index;
  for (int64_t& i : padded) i = i < 0 ? 4 : i;
  const Tensor table = ops::cat(
      std::vector<Tensor>{ops::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}), ops::zeros({1, 2})},
      0);
  const Tensor idx = ops::from_vector_i64(padded, {4, 2});
  expect_close({.actual = y, .expected = ops::embedding(table, idx), .what = "forward"});
  const Tensor want = ops::narrow(ops::embedding_backward(g, idx, 5), 0, 0, 4);
  expect_close({.actual = x.grad(), .expected = want, .what = "backward (scatter-add of rows)"});
  // Row 3 was never read: a zero gradient; row 1 the sum of its three positions' rows.
  EXPECT_EQ(ops::to_vector(ops::narrow(x.grad(), 0, 3, 1)), (std::vector<double>{0, 0}));
  EXPECT_EQ(ops::to_vector(ops::narrow(x.grad(), 0, 1, 1)),
            (std::vector<double>{1 + 7 + 11, 2 + 8 + 12}));
}

TEST(GatherRows, GradientByFiniteDifferences) {
  const std::vector<int64_t> index = {2, 0, 2, -1, 1, 2};
  const Tensor x = leaf({0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f}, {3, 2});
  const auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return gather_rows(in[0], index, {3, 2});
      },
      {x}, {.eps = 1e-2, .atol = 1e-4, .rtol = 1e-3});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(GatherRows, Bf16GradientsStayBf16) {
  const Tensor x = leaf({1, 2, 3, 4, 5, 6}, {3, 2}, kBFloat16);
  const Tensor y = gather_rows(x, std::vector<int64_t>{0, 0, 2}, {3});
  EXPECT_EQ(y.dtype(), kBFloat16);
  backward(ops::sum(y), Tensor());
  EXPECT_EQ(x.grad().dtype(), kBFloat16);
  EXPECT_EQ(ops::to_vector(x.grad()), (std::vector<double>{2, 2, 0, 0, 1, 1}));
}

TEST(GatherRows, NoRowReadGivesZeroGradients) {
  const Tensor x = leaf({1, 2, 3, 4}, {2, 2});
  const Tensor y = gather_rows(x, std::vector<int64_t>{-1, -1}, {2});
  EXPECT_EQ(ops::to_vector(y), (std::vector<double>{0, 0, 0, 0}));
  backward(ops::sum(y), Tensor());
  EXPECT_EQ(ops::to_vector(x.grad()), (std::vector<double>{0, 0, 0, 0}));
}

TEST(GatherRows, BadIndexNamesItsPositionAndTheRange) {
  const Tensor x = ops::zeros({3, 2});
  EXPECT_THAT(testing::error_of([&] {
                gather_rows(x, std::vector<int64_t>{0, 3}, {2});
              }),
              ::testing::HasSubstr("index 3 at position 1 is outside [-1, 3)"));
  EXPECT_THAT(testing::error_of([&] { gather_rows(x, std::vector<int64_t>{0}, {2}); }),
              ::testing::HasSubstr("1 indices for index shape (2,)"));
  EXPECT_THAT(
      testing::error_of([&] { gather_rows(ops::zeros({3}), std::vector<int64_t>{0}, {1}); }),
      ::testing::HasSubstr("expected x of shape (rows, D); got (3,)"));
}

}  // namespace
}  // namespace loom
