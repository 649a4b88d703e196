// apply_mixed_precision: bf16 compute over f32 master weights. Against the same MLP in f32:
// outputs and gradients agree to bf16 precision (2^-8 = 0.4% per rounding; 3e-2 of each
// tensor's scale after two layers), gradients and parameters stay f32, and the slots hold the
// masters again after forward — also after a forward that threw.
#include "nn/mixed_precision.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "nn/linear.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/testing/tensor_checks.h"

namespace loom::nn {
namespace {

using testing::expect_close;
using ::testing::HasSubstr;
using testing::RelativeTo;
using testing::Tolerance;

class Mlp : public Module {
 public:
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<Linear>(16, 32, LinearOptions{.seed = 1}));
    fc2 = register_module("fc2", std::make_shared<Linear>(32, 8, LinearOptions{.seed = 2}));
  }
  Tensor forward(const Tensor& x) override {
    LOOM_CHECK(x.size(-1) == 16, "Mlp: expected 16 features, got {}", x.size(-1));
    return (*fc2)(gelu((*fc1)(x)));
  }
  std::shared_ptr<Linear> fc1, fc2;
};

// bf16 keeps 8 bits: 3e-2 of each tensor's largest magnitude.
constexpr Tolerance kBf16Tol{.rtol = 3e-2, .relative_to = RelativeTo::kLargest};

TEST(MixedPrecisionTest, Bf16ComputeMatchesF32WithinBf16Precision) {
  const Tensor x = ops::normal({4, 16}, 7);
  Mlp reference, mixed;
  apply_mixed_precision(mixed);
  const Tensor want = reference(x);
  const Tensor got = mixed(x);
  EXPECT_EQ(got.dtype(), DType::kFloat32);
  expect_close({.actual = got, .expected = want, .tol = kBf16Tol, .what = "output"});
  backward(sum(want));
  backward(sum(got));
  std::map<std::string, Tensor> reference_grads;
  for (const auto& [name, p] : reference.named_parameters()) reference_grads[name] = p.grad();
  for (const auto& [name, p] : mixed.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::kFloat32) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::kFloat32) << name;
    expect_close({.actual = p.grad(),
                  .expected = reference_grads.at(name),
                  .tol = kBf16Tol,
                  .what = "grad of " + name});
  }
}

TEST(MixedPrecisionTest, ComputesInBf16) {
  // A hook inside the tree sees the bf16 casts, and the result differs from f32 (the check
  // above could not tell a no-op policy apart otherwise).
  Mlp mixed, reference;
  apply_mixed_precision(mixed);
  DType seen = DType::kFloat32;
  mixed.fc1->register_forward_pre_hook([&](Module& m, const Tensor& input) {
    seen = m.parameter("weight").dtype();
    return input;
  });
  const Tensor x = ops::normal({4, 16}, 7);
  const auto got = ops::to_vector(mixed(x)), want = ops::to_vector(reference(x));
  EXPECT_EQ(seen, DType::kBFloat16);
  EXPECT_NE(got, want);
}

// A layer's bf16 cast goes as soon as backward has passed it (its gradient is complete and no
// other graph holds it), not when backward ends: a model's casts would otherwise all be alive
// beside its growing f32 gradients (found by `loom plan`: 2.7 GB per rank on a 24-layer 22B
// model at tp 8).
TEST(MixedPrecisionTest, ACastIsFreedOnceBackwardHasPassedIt) {
  Mlp mixed;
  apply_mixed_precision(mixed);
  std::weak_ptr<Storage> fc1_cast, fc2_cast;
  bool fc2_freed = false, fc1_alive = false;
  mixed.fc1->register_forward_pre_hook([&](Module& m, const Tensor& input) {
    fc1_cast = m.parameter("weight").storage();
    return input;
  });
  mixed.fc2->register_forward_pre_hook([&](Module& m, const Tensor& input) {
    fc2_cast = m.parameter("weight").storage();
    return input;
  });
  // Just before fc1's backward: fc2's backward has run.
  mixed.fc1->register_forward_hook([&](Module&, const Tensor&, const Tensor& output) {
    autograd::register_hook(output, [&](const Tensor&) {
      fc2_freed = fc2_cast.expired();
      fc1_alive = !fc1_cast.expired();
      return Tensor();
    });
    return Tensor();
  });
  backward(sum(mixed(ops::normal({4, 16}, 7))));
  EXPECT_TRUE(fc2_freed) << "fc2's bf16 weight outlived its backward";
  EXPECT_TRUE(fc1_alive) << "fc1's bf16 weight went before its backward";
  EXPECT_TRUE(fc1_cast.expired());  // and after the backward, none is kept
}

// Forwards whose graphs are all alive (a pipeline's microbatches in flight) share one cast of
// each weight rather than holding one each until their backward, and each still hands its
// gradient to the master. linear's node saves the weight itself, not a view of it, so the
// cast's storage gains no reference from it (found by `loom plan`: a 22B model at tp 8, pp 4
// held 108 MiB of bf16 weights per layer and microbatch in flight).
TEST(MixedPrecisionTest, ForwardsInFlightShareOneCast) {
  Mlp mixed, reference;
  apply_mixed_precision(mixed);
  std::vector<const TensorImpl*> casts;
  std::vector<std::weak_ptr<Storage>> storages;
  mixed.fc1->register_forward_pre_hook([&](Module& m, const Tensor& input) {
    casts.push_back(m.parameter("weight").impl());
    storages.push_back(m.parameter("weight").storage());
    return input;
  });
  const Tensor x1 = ops::normal({4, 16}, 7), x2 = ops::normal({4, 16}, 8);
  const Tensor loss1 = sum(mixed(x1));
  const Tensor loss2 = sum(mixed(x2));  // loss1's graph is alive
  ASSERT_EQ(casts.size(), 2u);
  EXPECT_EQ(casts[0], casts[1]) << "the second forward cast fc1's weight again";
  backward(loss1);
  EXPECT_FALSE(storages[0].expired()) << "the cast went while the second graph holds it";
  backward(loss2);
  EXPECT_TRUE(storages[0].expired()) << "the cast outlived both backwards";
  // Both microbatches' gradients reached the master: the f32 model's, to bf16 precision.
  backward(sum(reference(x1)));
  backward(sum(reference(x2)));
  expect_close({.actual = mixed.fc1->parameter("weight").grad(),
                .expected = reference.fc1->parameter("weight").grad(),
                .tol = kBf16Tol,
                .what = "fc1's accumulated gradient"});
}

TEST(MixedPrecisionTest, MastersAreBackAfterForwardEvenWhenItThrows) {
  Mlp mixed;
  const Tensor master = mixed.fc1->parameter("weight");
  apply_mixed_precision(mixed);
  mixed(ops::normal({2, 16}, 1));
  EXPECT_EQ(mixed.fc1->parameter("weight").impl(), master.impl());
  EXPECT_THAT(
      [&] {
        mixed(ops::normal({2, 5}, 1));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("16 features")));
  // The failed forward left the casts in the slots; the next forward puts the masters back.
  mixed(ops::normal({2, 16}, 1));
  EXPECT_EQ(mixed.fc1->parameter("weight").impl(), master.impl());
  EXPECT_EQ(mixed.fc2->parameter("weight").dtype(), DType::kFloat32);
}

TEST(MixedPrecisionTest, RejectsNonF32Masters) {
  Mlp mixed;
  mixed.fc2->set_parameter("bias", ops::to(mixed.fc2->parameter("bias"), DType::kBFloat16));
  EXPECT_THAT([&] { apply_mixed_precision(mixed); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("parameter 'fc2.bias' is bf16; the master weights must be f32")));
}

}  // namespace
}  // namespace loom::nn
