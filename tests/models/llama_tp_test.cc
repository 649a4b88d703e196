// The Llama TP plan against one rank: loss and every gradient (gathered) of llama-tiny
// (vocabulary 257: uneven over tp; 2 kv heads over tp 2) under tp2 with and without sequence
// parallelism, within f32 rounding (1e-5); and a tp that does not divide the kv heads named
// before anything changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/llama/plans.h"
#include "tensor/ops.h"
#include "tests/models/random_tokens.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using loom::testing::expect_close;

struct Result {
  double loss;
  std::map<std::string, Tensor> grads;
};

Tensor ids() { return testing::random_tokens({2, 8}, 11, 257); }
Tensor targets() { return testing::random_tokens({2, 8}, 13, 257); }

Result one_rank() {
  Llama model(LlamaConfig::preset("llama-tiny"), 5);
  Tensor loss = model.loss(ids(), targets());
  backward(loss);
  Result r{loss.item<double>(), {}};
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad();
  return r;
}

class LlamaTpTest : public ::testing::TestWithParam<bool> {};

TEST_P(LlamaTpTest, LossAndGradientsMatchOneRank) {
  const bool sequence_parallel = GetParam();
  const Result want = one_rank();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    Llama model(LlamaConfig::preset("llama-tiny"), 5);
    parallelize_llama(model, mesh, {.sequence_parallel = sequence_parallel});
    EXPECT_EQ(dtensor_spec(model.layers[0]->attention->wk->weight()).placements,
              (Placements{Shard(0)}));
    Tensor loss = model.loss(ids(), targets());
    const double value = is_dtensor(loss) ? full_tensor(loss).item<double>() : loss.item<double>();
    EXPECT_NEAR(value, want.loss, 1e-5 * want.loss);
    backward(loss);
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      expect_close({.actual = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad(),
                    .expected = want.grads.at(name),
                    .tol = {.rtol = 1e-5, .relative_to = loom::testing::RelativeTo::kLargest},
                    .what = "grad of " + name});
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Plans, LlamaTpTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? "sequence_parallel" : "plain";
});

TEST(LlamaTpPlanTest, KvHeadsThatDoNotSplitAreNamed) {
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{4});
    Llama model(LlamaConfig::preset("llama-tiny"), 5);
    EXPECT_THAT(loom::testing::error_of([&] { parallelize_llama(model, mesh); }),
                ::testing::HasSubstr("tp 4 must divide n_heads 4 and n_kv_heads 2"));
    EXPECT_FALSE(is_dtensor(model.layers[0]->attention->wq->weight()));
  });
}

}  // namespace
}  // namespace loom::models
