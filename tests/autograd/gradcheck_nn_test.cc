// The differentiable nn ops against central finite differences (tolerances as in
// gradcheck_test.cc: f32, eps 1e-2, atol 1e-3 + rtol 1e-2).
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "tensor/rng.h"
#include "tests/autograd/test_util.h"

namespace loom {
namespace {

using testing::leaf;
using testing::passes_gradcheck;

TEST(GradcheckNnTest, SoftmaxAndLogSoftmax) {
  const auto a = leaf({3, 5}, 1, -2.0, 2.0);
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return softmax(x[0], -1); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return softmax(x[0], 0); }, {a}));
  EXPECT_TRUE(passes_gradcheck([](const auto& x) { return log_softmax(x[0], 1); }, {a}));
  EXPECT_TRUE(
      passes_gradcheck([](const auto& x) { return log_softmax(transpose(x[0], 0, 1), 1); }, {a}));
}

TEST(GradcheckNnTest, LayerNormWithAndWithoutAffine) {
  const auto x = leaf({2, 3, 6}, 2, -2.0, 2.0);
  const auto w = leaf({6}, 3, 0.5, 1.5), b = leaf({6}, 4);
  EXPECT_TRUE(passes_gradcheck([](const auto& in) { return layer_norm(in[0], {6}, in[1], in[2]); },
                               {x, w, b}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& in) {
        return layer_norm(in[0], {3, 6}, Tensor(), Tensor());
      },
      {x}));
}

TEST(GradcheckNnTest, EmbeddingWithRepeatedIndices) {
  const auto table = leaf({5, 3}, 5);
  const Tensor indices = ops::from_vector_i64({4, 0, 4, 2, 4, 1}, {2, 3});
  EXPECT_TRUE(passes_gradcheck(
      [indices](const auto& in) { return tanh(embedding(in[0], indices)); }, {table}));
}

TEST(GradcheckNnTest, CrossEntropyWithIgnoredTargets) {
  const auto logits = leaf({4, 6}, 6, -2.0, 2.0);
  const Tensor targets = ops::from_vector_i64({5, -100, 0, 3}, {4});
  EXPECT_TRUE(passes_gradcheck([targets](const auto& in) { return cross_entropy(in[0], targets); },
                               {logits}));
  EXPECT_TRUE(passes_gradcheck(
      [targets](const auto& in) { return cross_entropy(in[0], targets, -100, Reduction::kSum); },
      {logits}));
  EXPECT_TRUE(passes_gradcheck(
      [targets](const auto& in) { return cross_entropy(in[0], targets, -100, Reduction::kNone); },
      {logits}));
}

TEST(GradcheckNnTest, CausalAndFullAttention) {
  const auto q = leaf({2, 2, 5, 4}, 7), k = leaf({2, 2, 5, 4}, 8), v = leaf({2, 2, 5, 4}, 9);
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& in) { return scaled_dot_product_attention(in[0], in[1], in[2], true); },
      {q, k, v}));
  EXPECT_TRUE(passes_gradcheck(
      [](const auto& in) { return scaled_dot_product_attention(in[0], in[1], in[2], false, 0.3); },
      {q, k, v}));
}

TEST(GradcheckNnTest, CausalAttentionWithOffsets) {
  // Query i sees key j <= i + offset: bottom-right (tk - tq = 3), past the keys, and negative
  // offsets leaving rows 0..1 (and 0..4, all) without a key, whose outputs and gradients are 0.
  const auto q = leaf({2, 2, 4, 3}, 11), k = leaf({2, 2, 7, 3}, 12), v = leaf({2, 2, 7, 2}, 13);
  for (int64_t offset : {3, 1, 9, -2, -5}) {
    EXPECT_TRUE(passes_gradcheck(
        [offset](const auto& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], true, 0.0, offset);
        },
        {q, k, v}))
        << "causal_offset " << offset;
  }
}

TEST(GradcheckNnTest, DropoutScalesKeptElements) {
  const auto x = leaf({4, 8}, 10);
  EXPECT_TRUE(
      passes_gradcheck([](const auto& in) { return dropout(in[0], 0.25, /*seed=*/99); }, {x}));
}

// A region travels through autograd: the recorded call draws the mask of x's place (rows 3..5
// of a larger batch, or positions in runs), forward and backward. (Autograd once called the op
// again without it: under grad mode every shard drew the mask of a tensor at offset 0.)
TEST(GradcheckNnTest, DropoutKeepsItsRegion) {
  const RngRegion rows{{9, 4, 5}, {3, 0, 0}};
  const RngRegion chunks{{3, 16, 5}, {0, 0, 0}, /*runs_dim=*/1, {0, 2, 2, 2, 12, 2}};
  for (const RngRegion& region : {rows, chunks}) {
    const auto x = leaf({3, 4, 5}, 11);
    const std::vector<double> mask =
        ops::to_vector(ops::bernoulli_keep_mask({3, 4, 5}, 21, 0.5, region));
    backward(ops::sum(ops::dropout(x, 0.5, 21, /*training=*/true, region).out));
    std::vector<double> expected = mask;
    for (double& m : expected) m *= 2.0;  // 1 / (1 - p)
    EXPECT_EQ(ops::to_vector(x.grad()), expected);
    EXPECT_TRUE(passes_gradcheck(
        [&region](const auto& in) { return ops::dropout(in[0], 0.5, 21, true, region).out; }, {x}));
  }
}

}  // namespace
}  // namespace loom
