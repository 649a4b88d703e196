// The op-dispatch extension point (tensor/dispatch.h): ops on tensors that carry a
// TensorExtension reach the handler registered for its kind, as an OpCall (name, inputs,
// attributes), and never the kernel; call_op runs the plain op by name.
//
// The test extension mimics DTensor: the extended tensor is a "wrapper" whose own buffer holds
// only NaN, and whose shape differs from the "local" tensor the extension holds. The handler
// records the call and answers with call_op on the unwrapped (local) tensors. So a result that
// equals the local computation and is the very handle the handler returned proves the kernel
// was skipped.
#include "tensor/dispatch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/op_table.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom {
namespace {

using testing::error_of;

constexpr int kTestKind = 9001;

class TestExtension : public TensorExtension {
 public:
  explicit TestExtension(Tensor local, int kind = kTestKind)
      : local_(std::move(local)), kind_(kind) {}
  int kind() const override { return kind_; }
  const Tensor& local() const { return local_; }

 private:
  Tensor local_;
  int kind_;
};

// A wrapper tensor of shape (2 * local rows, ...) full of NaN, carrying `local`.
Tensor wrap(const Tensor& local, int kind = kTestKind) {
  Shape shape = local.shape();
  if (!shape.empty()) shape[0] *= 2;
  Tensor wrapper = ops::full(shape, NAN, local.dtype());
  wrapper.impl()->extension = std::make_shared<TestExtension>(local, kind);
  return wrapper;
}

Tensor unwrap(const Tensor& t) {
  if (!t.defined() || !t.extension()) return t;
  return static_cast<const TestExtension&>(*t.extension()).local();
}

struct Recorded {
  std::string op;
  size_t num_inputs = 0;
  std::vector<bool> extended;  // per input
  std::vector<OpAttr> attrs;
  std::vector<Tensor> outputs;
};

class DispatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    register_dispatch_handler(kTestKind, [this](const OpCall& call) {
      Recorded r;
      r.op = std::string(call.op);
      r.num_inputs = call.inputs.size();
      for (const Tensor& t : call.inputs)
        r.extended.push_back(t.defined() && t.extension() != nullptr);
      r.attrs = call.attrs;
      OpCall local(call.id, {}, call.attrs);
      for (const Tensor& t : call.inputs) local.inputs.push_back(unwrap(t));
      r.outputs = call_op(local);
      calls_.push_back(r);
      return r.outputs;
    });
  }
  void TearDown() override { register_dispatch_handler(kTestKind, nullptr); }

  const Recorded& last() const { return calls_.back(); }

  std::vector<Recorded> calls_;
};

TEST_F(DispatchTest, AddReachesTheHandler) {
  const Tensor a = ops::from_vector({1.f, 2.f, 3.f}, {3});
  const Tensor b = ops::from_vector({10.f, 20.f, 30.f}, {3});
  const Tensor out = ops::add(wrap(a), b);
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(last().op, "add");
  EXPECT_EQ(last().num_inputs, 2u);
  EXPECT_EQ(last().extended, (std::vector<bool>{true, false}));
  EXPECT_TRUE(last().attrs.empty());
  EXPECT_TRUE(out.is_same(last().outputs[0]));
  EXPECT_EQ(ops::to_vector(out), (std::vector<double>{11, 22, 33}));  // local values, no NaN
  // The extension on the second input is found too.
  const Tensor out2 = ops::mul(a, wrap(b));
  EXPECT_EQ(last().op, "mul");
  EXPECT_EQ(last().extended, (std::vector<bool>{false, true}));
  EXPECT_EQ(ops::to_vector(out2), (std::vector<double>{10, 40, 90}));
}

TEST_F(DispatchTest, ScalarFormsCarryTheScalarAsAnAttribute) {
  const Tensor a = ops::from_vector({1.f, 2.f}, {2});
  const Tensor out = ops::mul(wrap(a), 2.5);
  EXPECT_EQ(last().op, "mul_scalar");
  EXPECT_EQ(last().num_inputs, 1u);
  ASSERT_EQ(last().attrs.size(), 1u);
  EXPECT_EQ(std::get<double>(last().attrs[0]), 2.5);
  EXPECT_EQ(ops::to_vector(out), (std::vector<double>{2.5, 5}));
  ops::rsub(wrap(a), 1.0);
  EXPECT_EQ(last().op, "rsub_scalar");
  ops::pow(wrap(a), 3.0);
  EXPECT_EQ(last().op, "pow");
  EXPECT_EQ(std::get<double>(last().attrs[0]), 3.0);
}

TEST_F(DispatchTest, MatmulReachesTheHandler) {
  const Tensor a = ops::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2});
  const Tensor b = ops::from_vector({1.f, 0.f, 0.f, 1.f}, {2, 2});
  // The wrapper is (4, 2): a kernel run on it would give a (4, 2) NaN result.
  const Tensor out = ops::matmul(wrap(a), b);
  EXPECT_EQ(last().op, "matmul");
  EXPECT_EQ(last().num_inputs, 2u);
  EXPECT_TRUE(last().attrs.empty());
  EXPECT_TRUE(out.is_same(last().outputs[0]));
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  EXPECT_EQ(ops::to_vector(out), (std::vector<double>{1, 2, 3, 4}));
}

TEST_F(DispatchTest, SumCarriesDimsAndKeepdim) {
  const Tensor x = ops::reshape(ops::arange(6, kFloat32), {2, 3});
  const Tensor out = ops::sum(wrap(x), {1, -2}, true);
  EXPECT_EQ(last().op, "sum");
  EXPECT_EQ(last().num_inputs, 1u);
  ASSERT_EQ(last().attrs.size(), 2u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(last().attrs[0]), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(std::get<bool>(last().attrs[1]), true);
  EXPECT_EQ(out.shape(), (Shape{1, 1}));
  EXPECT_EQ(out.item<double>(), 15);
  ops::mean(wrap(x), {0});
  EXPECT_EQ(last().op, "mean");
  EXPECT_EQ(std::get<bool>(last().attrs[1]), false);
  // max(dim) returns two outputs.
  auto [values, indices] = ops::max(wrap(x), 1, false);
  EXPECT_EQ(last().op, "max_dim");
  EXPECT_EQ(std::get<int64_t>(last().attrs[0]), 1);
  EXPECT_EQ(ops::to_vector(values), (std::vector<double>{2, 5}));
  EXPECT_EQ(ops::to_vector(indices), (std::vector<double>{2, 2}));
}

TEST_F(DispatchTest, ViewsCarryTheirShapeAndDims) {
  const Tensor x = ops::reshape(ops::arange(6, kFloat32), {2, 3});
  const Tensor v = ops::view(wrap(x), {3, 2});
  EXPECT_EQ(last().op, "view");
  EXPECT_EQ(last().num_inputs, 1u);
  ASSERT_EQ(last().attrs.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(last().attrs[0]), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(v.shape(), (Shape{3, 2}));  // the wrapper is (4, 3): the kernel could not give (3, 2)
  EXPECT_EQ(v.storage(), x.storage());
  ops::transpose(wrap(x), 0, -1);
  EXPECT_EQ(last().op, "transpose");
  EXPECT_EQ(std::get<int64_t>(last().attrs[0]), 0);
  EXPECT_EQ(std::get<int64_t>(last().attrs[1]), -1);
  ops::narrow(wrap(x), 1, 1, 2);
  EXPECT_EQ(last().op, "narrow");
  EXPECT_EQ(last().attrs.size(), 3u);
  ops::slice(wrap(x), 1, 0, 3, 2);
  EXPECT_EQ(last().op, "slice");
  EXPECT_EQ(std::get<int64_t>(last().attrs[3]), 2);
  ops::permute(wrap(x), {1, 0});
  EXPECT_EQ(last().op, "permute");
  ops::expand(wrap(ops::zeros({1, 3})), {5, 3});
  EXPECT_EQ(last().op, "expand");
  EXPECT_EQ(std::get<std::vector<int64_t>>(last().attrs[0]), (std::vector<int64_t>{5, 3}));
  ops::unsqueeze(wrap(x), 0);
  EXPECT_EQ(last().op, "unsqueeze");
  ops::squeeze(wrap(x), 0);
  EXPECT_EQ(last().op, "squeeze");
  ops::reshape(wrap(x), {6});
  EXPECT_EQ(last().op, "reshape");
  // Composite views go through the primitive ones: split -> narrow per piece.
  const size_t before = calls_.size();
  const auto pieces = ops::chunk(wrap(x), 2, 1);
  EXPECT_EQ(calls_.size() - before, pieces.size());
  EXPECT_EQ(last().op, "narrow");
}

TEST_F(DispatchTest, CatPassesEveryInputAndTheDim) {
  const Tensor a = ops::zeros({2, 2});
  const Tensor b = ops::ones({2, 3});
  const Tensor out = ops::cat(std::vector<Tensor>{a, wrap(b), a}, 1);
  EXPECT_EQ(last().op, "cat");
  EXPECT_EQ(last().num_inputs, 3u);
  EXPECT_EQ(last().extended, (std::vector<bool>{false, true, false}));
  ASSERT_EQ(last().attrs.size(), 1u);
  EXPECT_EQ(std::get<int64_t>(last().attrs[0]), 1);
  EXPECT_EQ(out.shape(), (Shape{2, 7}));
  EXPECT_TRUE(out.is_same(last().outputs[0]));
}

TEST_F(DispatchTest, CopiesConversionsAndInPlaceOps) {
  const Tensor x = ops::from_vector({1.5f, -2.f}, {2});
  const Tensor c = ops::clone(wrap(x));
  EXPECT_EQ(last().op, "clone");
  EXPECT_EQ(ops::to_vector(c), (std::vector<double>{1.5, -2}));
  // contiguous() of an extended tensor is never the tensor itself: the handler decides.
  ops::contiguous(wrap(x));
  EXPECT_EQ(last().op, "clone");
  const Tensor h = ops::to(wrap(x), kFloat16);
  EXPECT_EQ(last().op, "to_dtype");
  EXPECT_EQ(std::get<DType>(last().attrs[0]), kFloat16);
  EXPECT_EQ(h.dtype(), kFloat16);
  // Even a same-dtype conversion asks the handler.
  ops::to(wrap(x), kFloat32);
  EXPECT_EQ(last().op, "to_dtype");

  Tensor local = ops::zeros({2});
  const Tensor dst = wrap(local);
  ops::copy_(dst, x);
  EXPECT_EQ(last().op, "copy_");
  EXPECT_EQ(last().num_inputs, 2u);
  EXPECT_TRUE(last().outputs.empty());
  EXPECT_EQ(ops::to_vector(local), (std::vector<double>{1.5, -2}));
  ops::fill_(dst, 4.0);
  EXPECT_EQ(last().op, "fill_");
  EXPECT_EQ(ops::to_vector(local), (std::vector<double>{4, 4}));
  ops::add_(dst, x);
  EXPECT_EQ(last().op, "add_");
  EXPECT_EQ(ops::to_vector(local), (std::vector<double>{5.5, 2}));
  // The wrapper's own buffer was never written.
  for (double v : ops::to_vector(ops::alias(dst))) EXPECT_TRUE(std::isnan(v));
}

TEST_F(DispatchTest, UnaryAndSelectionOps) {
  const Tensor x = ops::from_vector({-1.f, 2.f}, {2});
  const Tensor mask = ops::from_vector({1.f, 0.f}, {2});
  struct Case {
    const char* name;
    std::function<Tensor()> run;
  };
  const std::vector<Case> cases = {
      {"neg", [&] { return ops::neg(wrap(x)); }},
      {"exp", [&] { return ops::exp(wrap(x)); }},
      {"relu", [&] { return ops::relu(wrap(x)); }},
      {"gelu", [&] { return ops::gelu(wrap(x)); }},
      {"gelu_backward", [&] { return ops::gelu_backward(x, wrap(x)); }},
      {"silu_backward", [&] { return ops::silu_backward(x, wrap(x)); }},
      {"silu_mul", [&] { return ops::silu_mul(x, wrap(x)); }},
      {"silu_mul_backward", [&] { return ops::silu_mul_backward(x, x, wrap(x)).grad_gate; }},
      {"where", [&] { return ops::where(wrap(mask), x, x); }},
      {"masked_fill", [&] { return ops::masked_fill(x, wrap(mask), 0.0); }},
      {"eq", [&] { return ops::eq(wrap(x), x); }},
      {"gt", [&] { return ops::gt(x, wrap(x)); }},
      {"maximum", [&] { return ops::maximum(wrap(x), x); }},
      {"div", [&] { return ops::div(wrap(x), x); }},
  };
  for (const Case& c : cases) {
    const size_t before = calls_.size();
    const Tensor out = c.run();
    ASSERT_EQ(calls_.size(), before + 1) << c.name;
    EXPECT_EQ(last().op, c.name);
    EXPECT_TRUE(out.is_same(last().outputs[0])) << c.name;
    EXPECT_EQ(out.shape(), Shape{2}) << c.name;
  }
  EXPECT_EQ(ops::to_vector(ops::masked_fill(x, wrap(mask), 0.0)), (std::vector<double>{0, 2}));
}

TEST(DispatchErrorTest, MissingHandlerNamesTheOpAndKind) {
  const Tensor t = wrap(ops::zeros({2}), /*kind=*/4242);
  EXPECT_EQ(error_of([&] { ops::add(t, t); }),
            "add: an input carries a tensor extension of kind 4242 but no dispatch handler is "
            "registered for it");
  EXPECT_EQ(error_of([&] {
              ops::matmul(ops::zeros({2, 2}), wrap(ops::zeros({2, 2}), 4242));
            }),
            "matmul: an input carries a tensor extension of kind 4242 but no dispatch handler is "
            "registered for it");
  EXPECT_EQ(error_of([&] { ops::sum(t); }),
            "sum: an input carries a tensor extension of kind 4242 but no dispatch handler is "
            "registered for it");
}

TEST(DispatchErrorTest, UnregisteringRemovesTheHandler) {
  int calls = 0;
  register_dispatch_handler(777, [&](const OpCall& call) {
    ++calls;
    return std::vector<Tensor>{ops::zeros({1})};
  });
  const Tensor t = wrap(ops::zeros({2}), 777);
  ops::neg(t);
  EXPECT_EQ(calls, 1);
  register_dispatch_handler(777, nullptr);
  EXPECT_EQ(error_of([&] { ops::neg(t); }),
            "neg: an input carries a tensor extension of kind 777 but no dispatch handler is "
            "registered for it");
  EXPECT_EQ(calls, 1);
}

TEST(DispatchErrorTest, PlainTensorsNeverDispatch) {
  const Tensor a = ops::ones({2});
  EXPECT_FALSE(dispatch_op(OpId::add, {a, a}).has_value());
  EXPECT_FALSE(dispatch_op(OpId::add, {Tensor(), a}).has_value());  // undefined inputs skipped
  const std::vector<Tensor> many{a, a, a};
  EXPECT_FALSE(dispatch_op(OpId::cat, std::span<const Tensor>(many), {int64_t{0}}).has_value());
}

TEST(CallOpTest, RunsThePlainOpById) {
  const Tensor a = ops::from_vector({1.f, 2.f}, {2});
  const Tensor b = ops::from_vector({3.f, 5.f}, {2});
  auto out = call_op(OpCall(OpId::sub, {a, b}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ops::to_vector(out[0]), (std::vector<double>{-2, -3}));
  out = call_op(OpCall(OpId::sum, {ops::reshape(ops::arange(6, kFloat32), {2, 3})},
                       {std::vector<int64_t>{0}, false}));
  EXPECT_EQ(ops::to_vector(out[0]), (std::vector<double>{3, 5, 7}));
  out = call_op(OpCall(OpId::max_dim, {b}, {int64_t{0}, false}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].item<float>(), 5.0f);
  EXPECT_EQ(out[1].item<int64_t>(), 1);
  out = call_op(OpCall(OpId::to_dtype, {a}, {kBFloat16}));
  EXPECT_EQ(out[0].dtype(), kBFloat16);
}

TEST(OpListTest, NamesAreUniqueAndFoundAgain) {
  std::vector<std::string> names;
  for (const OpInfo& info : all_ops()) {
    EXPECT_EQ(op_name(info.id), info.name);
    EXPECT_EQ(find_op(info.name), info.id) << info.name;
    names.emplace_back(info.name);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
  EXPECT_EQ(names.size(), kNumOps);
  EXPECT_FALSE(find_op("frobnicate").has_value());
}

// call_op has an entry for every op of the list (the table checks itself when first built).
TEST(OpListTest, CallOpKnowsEveryOp) {
  OpTable table;
  register_core_ops(table);
  register_nn_ops(table);
  const auto missing = table.missing([](const OpInfo&) { return true; });
  EXPECT_FALSE(missing.has_value()) << op_name(*missing) << " has no call_op entry";
}

// The OpCall a handler sees names the op that was called (the scalar forms are ops of their own).
TEST_F(DispatchTest, HandlersSeeTheOpThatWasCalled) {
  const Tensor x = ops::from_vector({1.f, 4.f}, {2});
  const Tensor w = wrap(x);
  ops::abs(w);
  ops::log(w);
  ops::tanh(w);
  ops::sqrt(w);
  ops::rsqrt(w);
  ops::add(w, 1.0);
  ops::sub(w, 1.0);
  ops::div(w, 2.0);
  ops::sub(w, x);
  std::vector<std::string> seen;
  for (const Recorded& r : calls_) seen.push_back(r.op);
  EXPECT_EQ(seen, (std::vector<std::string>{"abs", "log", "tanh", "sqrt", "rsqrt", "add_scalar",
                                            "sub_scalar", "div_scalar", "sub"}));
}

}  // namespace
}  // namespace loom
