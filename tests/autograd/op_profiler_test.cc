// The op timer on real ops (base/profiler.h through tensor/dispatch.h): each op is one call under
// its name, whether it runs plainly or autograd records it first (the recorded op and the op it
// runs below autograd count once), ops nested in another op are its children, backward is one
// "autograd::backward" scope holding its ops, and the values are the same with the timer on.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "base/profiler.h"
#include "tensor/ops.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

const profiler::Entry* find(const std::vector<profiler::Entry>& all, const std::string& name) {
  for (const auto& e : all) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

class OpProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override { profiler::reset(); }
  void TearDown() override {
    profiler::disable();
    profiler::reset();
  }
};

TEST_F(OpProfilerTest, PlainOpsCountOncePerCallAndOnlyWhileEnabled) {
  const Tensor a = ops::ones({64, 64}), b = ops::ones({64, 64});
  ops::add(a, b);
  EXPECT_TRUE(profiler::entries().empty()) << "disabled: nothing recorded";
  profiler::enable();
  for (int i = 0; i < 3; ++i) ops::add(a, b);
  ops::matmul(a, b);
  profiler::disable();
  ops::add(a, b);
  const auto all = profiler::entries();
  ASSERT_NE(find(all, "add"), nullptr);
  EXPECT_EQ(find(all, "add")->calls, 3);
  ASSERT_NE(find(all, "matmul"), nullptr);
  EXPECT_EQ(find(all, "matmul")->calls, 1);
}

TEST_F(OpProfilerTest, RecordedOpsCountOnceAndBackwardIsOneScope) {
  const Tensor x = ops::full({8, 16}, 0.5f).set_requires_grad(true);
  const Tensor w = ops::full({16, 4}, 0.25f).set_requires_grad(true);
  profiler::enable();
  const Tensor loss = ops::sum(ops::matmul(x, w));
  backward(loss);
  profiler::disable();
  const auto all = profiler::entries();
  const profiler::Entry* backward_scope = find(all, "autograd::backward");
  ASSERT_NE(backward_scope, nullptr);
  EXPECT_EQ(backward_scope->calls, 1);
  EXPECT_LT(backward_scope->self_s, backward_scope->total_s)
      << "the gradient ops inside backward are its children";
  ASSERT_NE(find(all, "sum"), nullptr);
  EXPECT_EQ(find(all, "sum")->calls, 1) << "recorded, then run below autograd: one call";
  // matmul: once in forward, then the formula's two products in backward.
  ASSERT_NE(find(all, "matmul"), nullptr);
  EXPECT_GE(find(all, "matmul")->calls, 3);
  // The timer changes no value.
  testing::expect_close({.actual = x.grad(), .expected = ops::full({8, 16}, 1.0f)});
  testing::expect_close({.actual = loss, .expected = ops::full({}, 8 * 4 * 16 * 0.125f)});
}

TEST_F(OpProfilerTest, ByShapeSplitsAnOpByItsInputs) {
  const Tensor a = ops::ones({64, 64}), b = ops::ones({64, 64}), c = ops::ones({8});
  profiler::enable({.by_shape = true});
  ops::add(a, b);
  ops::add(a, b);
  ops::add(c, c);
  ops::add(ops::transpose(a, 0, 1), b);
  profiler::disable();
  const auto all = profiler::entries();
  ASSERT_NE(find(all, "add f32(64, 64) f32(64, 64)"), nullptr);
  EXPECT_EQ(find(all, "add f32(64, 64) f32(64, 64)")->calls, 2);
  ASSERT_NE(find(all, "add f32(8,) f32(8,)"), nullptr);
  EXPECT_EQ(find(all, "add f32(8,) f32(8,)")->calls, 1);
  ASSERT_NE(find(all, "add f32(64, 64)* f32(64, 64)"), nullptr) << "* marks a strided input";
  EXPECT_EQ(find(all, "add"), nullptr);
}

}  // namespace
}  // namespace loom
