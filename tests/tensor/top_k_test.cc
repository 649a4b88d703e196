// ops::top_k_indices on the CPU (the CUDA kernel against it: cuda_elementwise_test's
// TopKIndicesAreTheCpus): each row's k largest, largest first, ties to the lower index, against
// a sort of (value, index) pairs written here; a NaN row all -1; shapes, the meta device, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/ops_top_k.h"

namespace loom {
namespace {

using ::testing::HasSubstr;

// The k largest of each row by a full stable sort on value, descending: equal values keep
// their index order, so the lower index comes first.
std::vector<double> by_sorting(const std::vector<double>& values, int64_t rows, int64_t n,
                               int64_t k) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return values[r * n + a] > values[r * n + b]; });
    out.insert(out.end(), order.begin(), order.begin() + k);
  }
  return out;
}

TEST(TopKIndices, MatchesSortingWithTiesToTheLowerIndex) {
  // 8 levels over 37 columns: every row has many ties.
  const Tensor x = ops::to(ops::to(ops::mul(ops::uniform({4, 5, 37}, 3), 8.0), kInt64), kFloat32);
  const std::vector<double> values = ops::to_vector(x);
  for (int64_t k : {int64_t{1}, int64_t{3}, int64_t{36}, int64_t{37}}) {
    const Tensor got = ops::top_k_indices(x, k);
    EXPECT_EQ(got.shape(), (Shape{4, 5, k}));
    EXPECT_EQ(got.dtype(), kInt64);
    EXPECT_EQ(ops::to_vector(got), by_sorting(values, 20, 37, k)) << "k " << k;
  }
  // bf16 and a strided view: the same indices as its contiguous f32 copy.
  const Tensor view = ops::transpose(ops::to(x, kBFloat16), 1, 2);  // (4, 37, 5)
  EXPECT_EQ(ops::to_vector(ops::top_k_indices(view, 2)),
            ops::to_vector(ops::top_k_indices(ops::contiguous(ops::to(view, kFloat32)), 2)));
}

TEST(TopKIndices, ARowWithANanIsAllMinusOneAndInfinitiesOrder) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = ops::from_vector({1, 2, 3, std::nanf(""), 0, 0, -inf, inf, 5}, {3, 3});
  EXPECT_EQ(ops::to_vector(ops::top_k_indices(x, 2)), (std::vector<double>{2, 1, -1, -1, 1, 2}));
}

TEST(TopKIndices, MetaGivesTheShapeAndErrorsNameTheCall) {
  const Tensor meta = Tensor::empty({6, 4}, kFloat32, Device::meta());
  const Tensor got = ops::top_k_indices(meta, 3);
  EXPECT_EQ(got.shape(), (Shape{6, 3}));
  EXPECT_TRUE(got.device().is_meta());
  const Tensor x = ops::zeros({2, 4});
  EXPECT_THAT([&] { ops::top_k_indices(x, 5); },
              ::testing::ThrowsMessage<Error>(HasSubstr("k=5 and shape (2, 4)")));
  EXPECT_THAT([&] { ops::top_k_indices(x, 0); },
              ::testing::ThrowsMessage<Error>(HasSubstr("k must be in [1, n]")));
  EXPECT_THAT([&] { ops::top_k_indices(ops::to(x, kInt64), 1); },
              ::testing::ThrowsMessage<Error>(HasSubstr("expected a floating input, got i64")));
}

}  // namespace
}  // namespace loom
