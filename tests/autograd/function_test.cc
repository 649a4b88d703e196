#include "autograd/function.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "base/error.h"
#include "tests/autograd/test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::expect_equal;
using ::testing::HasSubstr;

// y = x^3 with a hand-written backward that saves its input.
class Cube : public autograd::Function {
 public:
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    EXPECT_FALSE(GradMode::is_enabled()) << "forward must run without recording";
    x_ = inputs[0];
    return {ops::mul(ops::mul(x_, x_), x_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    ++backward_calls;
    return {ops::mul(ops::mul(grads[0], ops::mul(x_, x_)), 3.0)};
  }
  std::string name() const override { return "Cube"; }
  int backward_calls = 0;

 private:
  Tensor x_;
};

TEST(FunctionTest, CustomFunctionForwardAndBackward) {
  Tensor x = ops::from_vector({1, 2, -1}, {3});
  x.set_requires_grad(true);
  auto cube = std::make_shared<Cube>();
  Tensor y = autograd::Function::apply(cube, {x})[0];
  expect_equal({.actual = y, .expected = {1, 8, -1}});
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "Cube");
  backward(sum(y));
  EXPECT_EQ(cube->backward_calls, 1);
  expect_equal({.actual = x.grad(), .expected = {3, 12, 3}});
}

TEST(FunctionTest, CustomFunctionPassesGradcheck) {
  Tensor x = testing::leaf({5}, 11);
  auto result = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return autograd::Function::apply(std::make_shared<Cube>(), in)[0];
      },
      {x});
  EXPECT_TRUE(result.ok) << result.message;
}

class WrongArity : public autograd::Function {
 public:
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {ops::clone(inputs[0])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {grads[0], grads[0]};
  }
  std::string name() const override { return "WrongArity"; }
};

TEST(FunctionTest, BackwardReturningWrongNumberOfGradientsThrows) {
  Tensor x = testing::leaf({2}, 12);
  Tensor y = autograd::Function::apply(std::make_shared<WrongArity>(), {x})[0];
  try {
    backward(sum(y));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("WrongArity::backward returned 2 gradients for 1 inputs"));
  }
}

TEST(FunctionTest, NoInputRequiringGradRecordsNothing) {
  Tensor x = ops::ones({2});
  Tensor y = autograd::Function::apply(std::make_shared<Cube>(), {x})[0];
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

}  // namespace
}  // namespace loom
