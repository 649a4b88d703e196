// Split backward (autograd::backward_input, WeightBackward): B then W give bitwise the gradients
// one backward gives, for a two-layer computation with a stage input (a leaf), its weights and a
// weight behind a weight; B computes the input's gradient and no weight's; W runs once, fires
// the weights' hooks and queued callbacks; a graph freed before W, W twice and an input that does
// not require grad are named errors.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "tensor/flop_counter.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

struct Net {
  Tensor x, w1, w2, scale;
  Tensor loss() const {
    // y = relu(x w1^T) w2^T * scale: the input x reaches the loss through w1 and w2's products,
    // and `scale` (a weight behind nothing but the loss) only through the last product.
    const Tensor h = relu(matmul(x, transpose(w1, 0, 1)));
    return sum(mul(matmul(h, transpose(w2, 0, 1)), scale));
  }
};

Net make() {
  Net n{ops::normal({4, 6}, 1), ops::normal({5, 6}, 2), ops::normal({3, 5}, 3),
        ops::normal({3}, 4)};
  for (Tensor* t : {&n.x, &n.w1, &n.w2, &n.scale}) t->set_requires_grad(true);
  return n;
}

TEST(SplitBackwardTest, BThenWEqualsOneBackwardBitwise) {
  const Net whole = make();
  backward(whole.loss());
  const Net split = make();
  autograd::WeightBackward w = autograd::backward_input({split.loss()}, {Tensor()}, {split.x});
  // B: the input's gradient, and no weight's yet.
  testing::expect_bitwise_equal(
      {.actual = split.x.grad(), .expected = whole.x.grad(), .what = "dx after B"});
  for (const Tensor* t : {&split.w1, &split.w2, &split.scale}) {
    EXPECT_FALSE(t->grad().defined()) << "a weight's gradient before W";
  }
  EXPECT_FALSE(w.done());
  w.run();
  EXPECT_TRUE(w.done());
  testing::expect_bitwise_equal(
      {.actual = split.w1.grad(), .expected = whole.w1.grad(), .what = "dw1"});
  testing::expect_bitwise_equal(
      {.actual = split.w2.grad(), .expected = whole.w2.grad(), .what = "dw2"});
  testing::expect_bitwise_equal(
      {.actual = split.scale.grad(), .expected = whole.scale.grad(), .what = "dscale"});
}

// B computes only the products toward the input (each matmul's dX); W the weights' (dW): the
// work W defers is what a zero-bubble schedule moves into the bubbles.
TEST(SplitBackwardTest, BComputesTheInputSideOfEachProductAndWTheWeightSide) {
  const Net n = make();
  const Tensor loss = n.loss();
  int64_t b_flops = 0, w_flops = 0;
  autograd::WeightBackward w;
  {
    FlopCounter flops;
    w = autograd::backward_input({loss}, {Tensor()}, {n.x});
    b_flops = flops.total();
  }
  {
    FlopCounter flops;
    w.run();
    w_flops = flops.total();
  }
  // x (4, 6) w1 (5, 6) -> h (4, 5); w2 (3, 5) -> (4, 3). B: dh = g w2 (4x3x5), dx = dh w1
  // (4x5x6); W: dw2 = g^T h (3x4x5), dw1 = dh^T x (5x4x6). 2 FLOPs a multiply-add.
  EXPECT_EQ(b_flops, 2 * (4 * 3 * 5 + 4 * 5 * 6));
  EXPECT_EQ(w_flops, 2 * (3 * 4 * 5 + 5 * 4 * 6));
}

TEST(SplitBackwardTest, WFiresTheWeightsHooksAndItsCallbacksOnce) {
  const Net n = make();
  int hooks = 0, callbacks = 0;
  for (const Tensor* t : {&n.w1, &n.w2, &n.scale}) {
    autograd::register_post_accumulate_grad_hook(*t, [&](const Tensor&) {
      ++hooks;
      autograd::queue_backward_callback([&] { ++callbacks; });
    });
  }
  autograd::WeightBackward w = autograd::backward_input({n.loss()}, {Tensor()}, {n.x});
  EXPECT_EQ(hooks, 0);
  w.run();
  EXPECT_EQ(hooks, 3);
  EXPECT_EQ(callbacks, 3);
  try {
    w.run();
    ADD_FAILURE() << "W ran twice";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already ran; it runs once"), std::string::npos);
  }
  EXPECT_EQ(hooks, 3);
}

TEST(SplitBackwardTest, AGraphFreedBeforeWAndAnInputWithoutGradAreNamed) {
  // A weight through an op that saves its input (w * w: W's node keeps w), also reached from a
  // second root: a full backward of that root frees the node W needs.
  Tensor x = ops::normal({4, 6}, 1), w = ops::normal({5, 6}, 2);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor w_sq = mul(w, w);
  const Tensor loss = sum(matmul(x, transpose(w_sq, 0, 1)));
  const Tensor other = sum(w_sq);
  autograd::WeightBackward deferred = autograd::backward_input({loss}, {Tensor()}, {x});
  backward(other);  // runs and frees w * w's node
  try {
    deferred.run();
    ADD_FAILURE() << "W ran on a freed graph";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("freed before W ran"), std::string::npos) << e.what();
  }
  const Net k = make();
  const Tensor inner = mul(k.x, 2.0);  // not a leaf
  try {
    autograd::backward_input({sum(inner)}, {Tensor()}, {inner});
    ADD_FAILURE() << "a non-leaf input was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a leaf"), std::string::npos) << e.what();
  }
  const Net m = make();
  Tensor constant = ops::normal({4, 6}, 9);  // does not require grad
  try {
    autograd::backward_input({m.loss()}, {Tensor()}, {constant});
    ADD_FAILURE() << "an input without grad was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom
