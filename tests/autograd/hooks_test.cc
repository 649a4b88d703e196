#include "autograd/hooks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "tests/autograd/test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using ::testing::ElementsAre;
using testing::expect_equal;
using ::testing::HasSubstr;

TEST(HooksTest, PostAccumulateHooksFireDuringBackwardInReadinessOrder) {
  // A three-layer chain x -> w0 -> w1 -> w2 -> loss. The last layer's gradient is ready
  // first; each hook must fire before the earlier layers' backward has run, which we observe
  // through a tensor hook on the activation that feeds the layer.
  Tensor w0 = testing::leaf({4, 4}, 1), w1 = testing::leaf({4, 4}, 2),
         w2 = testing::leaf({4, 4}, 3);
  Tensor x = ops::uniform({2, 4}, 4);
  std::vector<std::string> events;
  autograd::register_post_accumulate_grad_hook(w0, [&](const Tensor&) { events.push_back("w0"); });
  autograd::register_post_accumulate_grad_hook(w1, [&](const Tensor&) { events.push_back("w1"); });
  autograd::register_post_accumulate_grad_hook(w2, [&](const Tensor& leaf) {
    EXPECT_TRUE(leaf.grad().defined());
    events.push_back("w2");
  });
  Tensor h0 = tanh(matmul(x, w0));
  Tensor h1 = tanh(matmul(h0, w1));
  autograd::register_hook(h1, [&](const Tensor&) {
    events.push_back("h1");
    return Tensor();
  });
  autograd::register_hook(h0, [&](const Tensor&) {
    events.push_back("h0");
    return Tensor();
  });
  Tensor loss = sum(matmul(h1, w2));
  backward(loss);
  EXPECT_THAT(events, ElementsAre("w2", "h1", "w1", "h0", "w0"));
}

TEST(HooksTest, TensorHookCanRewriteGradient) {
  Tensor a = ops::from_vector({1, 2}, {2});
  a.set_requires_grad(true);
  Tensor b = a * 3.0;
  autograd::register_hook(b, [](const Tensor& g) { return ops::mul(g, 10.0); });
  backward(sum(b));
  expect_equal({.actual = a.grad(), .expected = {30, 30}});
}

TEST(HooksTest, LeafHookRewritesBeforeAccumulation) {
  Tensor a = ops::from_vector({1, 2}, {2});
  a.set_requires_grad(true);
  autograd::register_hook(a, [](const Tensor& g) { return ops::neg(g); });
  Tensor seen;
  autograd::register_post_accumulate_grad_hook(a, [&](const Tensor& leaf) { seen = leaf.grad(); });
  backward(sum(a * 2.0));
  expect_equal({.actual = a.grad(), .expected = {-2, -2}});
  ASSERT_TRUE(seen.defined());
  expect_equal({.actual = seen, .expected = {-2, -2}});
}

TEST(HooksTest, HookOnTensorWithoutGradThrows) {
  Tensor c = ops::ones({2});
  try {
    autograd::register_hook(c, [](const Tensor& g) { return g; });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("register_hook: the tensor does not require grad"));
  }
  Tensor a = testing::leaf({2}, 1);
  EXPECT_THROW(autograd::register_post_accumulate_grad_hook(a * 2.0, [](const Tensor&) {}), Error);
}

}  // namespace
}  // namespace loom
