// Every op of tensor/op_list.h, called with inputs that require grad through call_op (which runs
// the op's one function, the one loom::ops::X and loom::X both name):
//   - a kDifferentiable op records: its first output has a grad_fn and the gradient it gives
//     every input that requires grad passes gradcheck against central differences;
//   - a kNoGrad op's outputs do not require grad and carry no grad_fn.
// The samples must cover the whole list: an op added to tensor/op_list.h without one fails
// EverySampleExists, naming it. This is the test that fails if any op would silently drop a
// gradient, whichever spelling a module's forward uses.
//
// Tolerances are gradcheck's defaults (f32, eps 1e-2, atol 1e-3 + rtol 1e-2; see
// gradcheck_test.cc), except to_dtype, whose bf16 round trip is exact only on a grid of 1/8
// (inputs and eps are chosen on it).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autograd_dispatch.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/gradcheck.h"
#include "tensor/dispatch.h"
#include "tensor/grad_mode.h"
#include "tests/autograd/test_util.h"

namespace loom {
namespace {

using testing::leaf;

struct Sample {
  std::vector<Tensor> inputs;  // leaves that require grad where the op is differentiable in them
  std::vector<OpAttr> attrs;
  autograd::GradcheckOptions options{};
  std::string skip;  // non-empty: why this machine cannot run the op (the reason is printed)
};

Tensor plain(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  return ops::uniform(shape, seed, low, high);
}

// Values away from 0 (for abs and relu, whose derivative jumps there).
Tensor away_from_zero() {
  Tensor t = ops::from_vector({-0.9f, -0.4f, 0.3f, 0.8f, -0.6f, 0.5f}, {2, 3});
  t.set_requires_grad(true);
  return t;
}

Tensor indices(std::vector<int64_t> values, const Shape& shape) {
  return ops::from_vector_i64(std::move(values), shape);
}

std::vector<int64_t> ints(std::initializer_list<int64_t> v) { return v; }

// One call per op with small inputs; nullopt when the list grew an op this file does not know.
std::optional<Sample> sample_for(OpId op) {
  const Tensor x23 = leaf({2, 3}, 11);
  const Tensor positive = leaf({2, 3}, 12, 0.5, 2.0);
  switch (op) {
    case OpId::view:
      return Sample{{x23}, {ints({3, 2})}};
    case OpId::reshape:
      return Sample{{x23}, {ints({6})}};
    case OpId::transpose:
      return Sample{{x23}, {int64_t{0}, int64_t{1}}};
    case OpId::permute:
      return Sample{{leaf({2, 3, 4}, 13)}, {ints({2, 0, 1})}};
    case OpId::narrow:
      return Sample{{leaf({4, 3}, 14)}, {int64_t{0}, int64_t{1}, int64_t{2}}};
    case OpId::slice:
      return Sample{{leaf({5, 3}, 15)}, {int64_t{0}, int64_t{0}, int64_t{5}, int64_t{2}}};
    case OpId::expand:
      return Sample{{leaf({3, 1}, 16)}, {ints({2, 3, 4})}};
    case OpId::unsqueeze:
      return Sample{{x23}, {int64_t{1}}};
    case OpId::squeeze:
      return Sample{{leaf({2, 1, 3}, 17)}, {int64_t{1}}};
    case OpId::copy_:
      return Sample{{plain({2, 3}, 18), x23}, {}};
    case OpId::clone:
      return Sample{{x23}, {}};
    case OpId::to_dtype: {
      // k/8 in [-1, 1]: exact in bf16, and so are x +- eps with eps = 1/8.
      Tensor grid = ops::div(ops::sub(ops::arange(6, kFloat32), 3.0), 8.0);
      grid.set_requires_grad(true);
      return Sample{{ops::reshape(grid, {2, 3})}, {kBFloat16}, {.eps = 0.125}};
    }
    case OpId::to_device:
      return Sample{{x23},
                    {int64_t{static_cast<int64_t>(DeviceType::kCUDA)}, int64_t{0}},
                    {},
                    "a copy between devices needs a GPU (cuda_*_test runs it on one)"};
    case OpId::cat:
      return Sample{{x23, leaf({1, 3}, 19)}, {int64_t{0}}};
    case OpId::match_layout:
      return Sample{{x23, plain({2, 3}, 20)}, {}};
    case OpId::zeros_like:
    case OpId::ones_like:
      return Sample{{x23}, {}};
    case OpId::fill_:
      return Sample{{leaf({2, 3}, 21)}, {0.5}};  // in place, below autograd
    case OpId::add:
    case OpId::sub:
    case OpId::mul:
      return Sample{{leaf({3, 1, 4}, 22), leaf({2, 4}, 23)}, {}};
    case OpId::div:
      return Sample{{leaf({3, 1, 4}, 22), leaf({2, 4}, 24, 0.5, 1.5)}, {}};
    case OpId::maximum:
      return Sample{{leaf({3, 1, 4}, 22), leaf({2, 4}, 25)}, {}};
    case OpId::eq:
    case OpId::gt:
      return Sample{{x23, leaf({2, 3}, 26)}, {}};
    case OpId::add_scalar:
    case OpId::sub_scalar:
    case OpId::rsub_scalar:
    case OpId::mul_scalar:
    case OpId::div_scalar:
      return Sample{{x23}, {-1.5}};
    case OpId::neg:
    case OpId::exp:
    case OpId::tanh:
    case OpId::sigmoid:
    case OpId::silu:
    case OpId::gelu:
      return Sample{{x23}, {}};
    case OpId::abs:
    case OpId::relu:
      return Sample{{away_from_zero()}, {}};
    case OpId::log:
    case OpId::sqrt:
    case OpId::rsqrt:
      return Sample{{positive}, {}};
    case OpId::pow:
      return Sample{{positive}, {-0.5}};
    case OpId::gelu_backward:
    case OpId::silu_backward:
    case OpId::silu_mul:
      return Sample{{x23, leaf({2, 3}, 27)}, {}};
    case OpId::silu_mul_backward:
      return Sample{{x23, leaf({2, 3}, 27), leaf({3}, 64)}, {}};
    case OpId::where:
      return Sample{{ops::from_vector({1, 0, 0, 1, 0, 1}, {2, 3}), x23, leaf({3}, 28)}, {}};
    case OpId::masked_fill:
      return Sample{{x23, ops::from_vector({1, 0, 0, 1, 0, 1}, {2, 3})}, {-2.0}};
    case OpId::add_:
      return Sample{{plain({2, 3}, 29), x23}, {}};
    case OpId::mul_scalar_:
      return Sample{{leaf({2, 3}, 63)}, {0.5}};
    case OpId::sum:
      return Sample{{leaf({2, 3, 4}, 30)}, {ints({1}), false}};
    case OpId::mean:
      return Sample{{leaf({2, 3, 4}, 31)}, {ints({0, 2}), true}};
    case OpId::max_dim:
      return Sample{{x23}, {int64_t{1}, false}};
    case OpId::max_dim_backward:
      return Sample{{leaf({2}, 32), indices({0, 2}, {2})}, {ints({2, 3}), int64_t{1}, false}};
    case OpId::matmul:
      return Sample{{leaf({2, 2, 3}, 33), leaf({3, 4}, 34)}, {}};
    case OpId::linear:
      return Sample{{leaf({2, 2, 3}, 35), leaf({4, 3}, 36), leaf({4}, 37)}, {}};
    case OpId::slice_backward:
      return Sample{{x23}, {ints({5, 3}), int64_t{0}, int64_t{1}, int64_t{5}, int64_t{2}}};
    case OpId::softmax:
    case OpId::log_softmax:
      return Sample{{leaf({3, 5}, 38, -2.0, 2.0)}, {int64_t{1}}};
    case OpId::softmax_backward:
    case OpId::log_softmax_backward:
      return Sample{{x23, ops::softmax(plain({2, 3}, 39), 1)}, {int64_t{1}}};
    case OpId::layer_norm:
      return Sample{{leaf({2, 4}, 40, -2.0, 2.0), leaf({4}, 41, 0.5, 1.5), leaf({4}, 42)},
                    {ints({4}), 1e-5}};
    case OpId::layer_norm_backward: {
      const Tensor x = leaf({2, 4}, 43), w = leaf({4}, 44);
      const ops::LayerNormResult r = ops::layer_norm(ops::alias(x), {4}, ops::alias(w), {}, 1e-5);
      return Sample{{leaf({2, 4}, 45), x, r.mean, r.rstd, w}, {ints({4})}};
    }
    case OpId::rms_norm:
      return Sample{{leaf({2, 4}, 47, -2.0, 2.0), leaf({4}, 48, 0.5, 1.5)}, {1e-5}};
    case OpId::rms_norm_backward: {
      const Tensor x = leaf({2, 4}, 49), w = leaf({4}, 50);
      const ops::RMSNormResult r = ops::rms_norm(ops::alias(x), ops::alias(w), 1e-5);
      return Sample{{leaf({2, 4}, 51), x, r.rstd, w}, {}};
    }
    case OpId::rope:
      return Sample{{leaf({2, 3, 2, 4}, 52), plain({3, 2}, 53), plain({3, 2}, 54)}, {true}};
    case OpId::embedding:
      return Sample{{leaf({5, 3}, 46), indices({4, 0, 4, 2}, {2, 2})}, {}};
    case OpId::embedding_backward:
      return Sample{{leaf({2, 3}, 47), indices({4, 0}, {2})}, {int64_t{5}}};
    case OpId::cross_entropy:
      return Sample{{leaf({4, 6}, 48, -2.0, 2.0), indices({5, -100, 0, 3}, {4})},
                    {int64_t{-100}, static_cast<int64_t>(Reduction::kMean)}};
    case OpId::cross_entropy_backward:
      return Sample{{leaf({}, 49), leaf({4, 6}, 50), indices({5, 1, 0, 3}, {4}), Tensor()},
                    {int64_t{-100}, static_cast<int64_t>(Reduction::kMean)}};
    case OpId::scaled_dot_product_attention:
      return Sample{{leaf({1, 3, 4}, 51), leaf({1, 3, 4}, 52), leaf({1, 3, 4}, 53)}, {true, 0.0}};
    case OpId::scaled_dot_product_attention_backward: {
      const Tensor q = leaf({1, 3, 4}, 54);
      const ops::AttentionResult r =
          ops::scaled_dot_product_attention(ops::alias(q), ops::alias(q), ops::alias(q), true);
      return Sample{{leaf({1, 3, 4}, 55), q, q, q, r.out, r.logsumexp}, {true, 0.0}};
    }
    case OpId::dropout:
      return Sample{{leaf({4, 5}, 56)}, {0.5, int64_t{77}, true}};
    case OpId::dropout_backward:
      return Sample{{x23, ops::dropout(plain({2, 3}, 57), 0.5, 78).mask}, {0.5}};
  }
  return std::nullopt;
}

TEST(EveryOpRecordsTest, EverySampleExists) {
  for (const OpInfo& info : all_ops()) {
    EXPECT_TRUE(sample_for(info.id).has_value())
        << info.name << " (tensor/op_list.h) has no sample in every_op_records_test.cc";
  }
}

TEST(EveryOpRecordsTest, DifferentiableOpsRecordAndPassGradcheck) {
  for (const OpInfo& info : all_ops()) {
    if (info.grad != OpGrad::kDifferentiable) continue;
    SCOPED_TRACE(std::string(info.name));
    const std::optional<Sample> sample = sample_for(info.id);
    ASSERT_TRUE(sample.has_value());
    if (!sample->skip.empty()) {
      std::printf("[  SKIPPED ] %s: %s\n", std::string(info.name).c_str(), sample->skip.c_str());
      continue;
    }
    EXPECT_TRUE(autograd::has_formula(info.id));
    const OpId id = info.id;
    const std::vector<OpAttr> attrs = sample->attrs;
    const auto run = [id, attrs](const std::vector<Tensor>& in) {
      return call_op(OpCall(id, in, attrs))[0];
    };
    const Tensor out = run(sample->inputs);
    ASSERT_NE(out.grad_fn(), nullptr) << "the op did not record";
    EXPECT_TRUE(out.requires_grad());
    const auto result = autograd::gradcheck(
        [&](const std::vector<Tensor>& in) { return ops::to(run(in), kFloat32); }, sample->inputs,
        sample->options);
    EXPECT_TRUE(result.ok) << result.message << " (max abs error " << result.max_abs_error << ")";
  }
}

TEST(EveryOpRecordsTest, NoGradOpsNeverHandBackATensorThatRequiresGrad) {
  for (const OpInfo& info : all_ops()) {
    if (info.grad != OpGrad::kNoGrad) continue;
    SCOPED_TRACE(std::string(info.name));
    const std::optional<Sample> sample = sample_for(info.id);
    ASSERT_TRUE(sample.has_value());
    EXPECT_FALSE(autograd::has_formula(info.id));
    bool any_requires_grad = false;
    for (const Tensor& t : sample->inputs) any_requires_grad |= t.requires_grad();
    EXPECT_TRUE(any_requires_grad) << "the sample should give the op an input that requires grad";
    const std::vector<Tensor> outputs = call_op(OpCall(info.id, sample->inputs, sample->attrs));
    for (const Tensor& out : outputs) {
      if (!out.defined()) continue;
      bool is_an_input = false;  // match_layout of a plain tensor is the tensor itself
      for (const Tensor& t : sample->inputs) is_an_input |= out.is_same(t);
      if (is_an_input) continue;
      EXPECT_FALSE(out.requires_grad());
      EXPECT_EQ(out.grad_fn(), nullptr);
    }
  }
}

// A module's forward may use either spelling: loom::ops::X is loom::X, so the gradients are the
// same tensors bit for bit.
TEST(EveryOpRecordsTest, EitherSpellingGivesTheSameGradients) {
  const Tensor x = plain({4, 3}, 60);
  const auto grads_of = [&](bool plain_spelling) {
    Tensor w = leaf({5, 3}, 61), b = leaf({5}, 62);
    const Tensor h = plain_spelling ? ops::gelu(ops::linear(x, w, b)) : gelu(linear(x, w, b));
    const Tensor loss = plain_spelling ? ops::sum(ops::mul(h, h)) : sum(h * h);
    backward(loss);
    return std::vector<std::vector<double>>{ops::to_vector(w.grad()), ops::to_vector(b.grad())};
  };
  EXPECT_EQ(grads_of(true), grads_of(false));
}

// Below autograd (what autograd's dispatch sets while it computes an op) nothing records, while
// grad mode itself stays on.
TEST(EveryOpRecordsTest, NothingRecordsBelowAutograd) {
  const Tensor a = leaf({2, 3}, 63);
  BelowAutogradGuard below;
  EXPECT_TRUE(GradMode::is_enabled());
  const Tensor out = ops::exp(ops::mul(a, 2.0));
  EXPECT_EQ(out.grad_fn(), nullptr);
  EXPECT_FALSE(out.requires_grad());
}

}  // namespace
}  // namespace loom
