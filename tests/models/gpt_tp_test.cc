// GPT under tensor parallelism against one rank: same seeds, same batch; losses and every
// parameter's gradient agree, for both plans (with and without sequence parallelism), an odd
// vocabulary and dropout (residual and attention); the forward issues exactly the collectives the
// plan documents.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "models/gpt/gpt.h"
#include "models/gpt/plans.h"
#include "tensor/ops.h"
#include "tests/models/random_tokens.h"
#include "tests/testing/collectives.h"
#include "tests/testing/tensor_checks.h"

namespace loom::models {
namespace {

using ::testing::HasSubstr;

using loom::testing::Collectives;
using loom::testing::expect_close;
using loom::testing::expect_collectives;
using loom::testing::RelativeTo;
using loom::testing::Tolerance;
using testing::random_tokens;

// Sharded GEMMs and all-reduces sum in another order than one rank: f32 rounding, relative
// 1e-5 of the values (the equivalence tolerance): 1e-5 of each tensor's largest
// magnitude, plus 1e-7.
constexpr Tolerance kTol{.rtol = 1e-5, .atol = 1e-7, .relative_to = RelativeTo::kLargest};

struct PlanCase {
  std::string name;
  GPTPlanOptions plan;
  int64_t vocab_size;
  double dropout;
  double attn_dropout = 0.0;
};

// Collectives of one forward and one backward, per the plan's documentation
// (models/gpt/plans.h), with L blocks: the counts are part of the plan's contract, so a change
// that adds a collective fails.
Collectives expected_forward(const GPTPlanOptions& plan, int64_t layers) {
  constexpr int64_t kLossAllReduces = 3;  // logsumexps' max, exponentials' sum, target terms
  if (!plan.sequence_parallel) return {1 + 2 * layers + kLossAllReduces, 0, 0};
  // Embedding reduce-scatter; per block 2 all-gathers + 2 reduce-scatters; the head's gather.
  return {kLossAllReduces, 2 * layers + 1, 2 * layers + 1};
}
Collectives expected_backward(const GPTPlanOptions& plan, int64_t layers) {
  // The Partial input gradients of the column-parallel layers (2 per block) and of the head.
  if (!plan.sequence_parallel) return {2 * layers + 1, 0, 0};
  // Each collective of the forward has its adjoint (gather <-> reduce-scatter; the embedding's
  // reduce-scatter becomes a gather, as does the cut of the position embeddings), and the
  // replicated weight and bias of each of the 2L + 1 norms get their Partial gradients
  // all-reduced. Gathering each block's two inputs again for backward (Megatron's, the default)
  // adds 2 all-gathers per block.
  const int64_t regathers = plan.regather_in_backward ? 2 * layers : 0;
  return {2 * (2 * layers + 1), 2 * layers + 2 + regathers, 2 * layers + 1};
}

class GPTTensorParallelTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(GPTTensorParallelTest, LossAndGradientsMatchOneRank) {
  const PlanCase& c = GetParam();
  GPTConfig config = GPTConfig::preset("tiny");
  config.vocab_size = c.vocab_size;
  config.dropout = c.dropout;
  config.attn_dropout = c.attn_dropout;
  const Tensor x = random_tokens({2, 16}, 3, c.vocab_size),
               y = random_tokens({2, 16}, 4, c.vocab_size);
  GPT reference(config, 7);
  Tensor ref_loss = reference.loss(x, y);
  backward(ref_loss);
  const auto ref_state = reference.state_dict();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    GPT model(config, 7);
    parallelize_gpt(model, mesh, c.plan);
    Tensor loss;
    {
      CommDebugMode comm;
      loss = model.loss(x, y);
      expect_collectives(comm, expected_forward(c.plan, config.n_layer), "forward");
    }
    EXPECT_FALSE(is_dtensor(loss));
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(),
                1e-5 * std::abs(ref_loss.item<double>()));
    {
      CommDebugMode comm;
      backward(loss);
      expect_collectives(comm, expected_backward(c.plan, config.n_layer), "backward");
    }
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      if (is_dtensor(p)) {
        EXPECT_EQ(dtensor_spec(p.grad()).placements, dtensor_spec(p).placements)
            << "grad of " << name;
      }
      const Tensor grad = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad();
      expect_close({.actual = grad,
                    .expected = ref_state.at(name).grad(),
                    .tol = kTol,
                    .what = "grad of " + name});
    }
    // The embedding is vocab-parallel: each rank holds its range of rows (uneven for odd V).
    const Tensor& wte = model.wte->weight();
    ASSERT_TRUE(is_dtensor(wte));
    EXPECT_EQ(local_shard(wte).size(0), (c.vocab_size + 1 - pg.rank()) / 2);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Plans, GPTTensorParallelTest,
    ::testing::Values(
        PlanCase{"replicated_stream", {.sequence_parallel = false}, 256, 0.0},
        PlanCase{"sequence_parallel", {.sequence_parallel = true}, 256, 0.0},
        PlanCase{"sequence_parallel_keeping_gathered_inputs",
                 {.sequence_parallel = true, .regather_in_backward = false},
                 256,
                 0.0},
        // GPT-2's vocabulary (50257) is odd: the embedding's rows split unevenly.
        PlanCase{"odd_vocab", {.sequence_parallel = false}, 67, 0.0},
        PlanCase{"sequence_parallel_odd_vocab", {.sequence_parallel = true}, 67, 0.0},
        // Dropout masks are drawn per global element, so shards drop what one rank does; the
        // attention's, drawn in the kernel, place a rank's heads by its rows of c_attn.
        PlanCase{"dropout", {.sequence_parallel = false}, 67, 0.1, 0.1},
        PlanCase{"sequence_parallel_dropout", {.sequence_parallel = true}, 67, 0.1, 0.1}),
    [](const auto& info) { return info.param.name; });

TEST(GPTTensorParallelErrors, HeadsMustSplitEvenly) {
  comm::testing::run_on_ranks(3, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{3});
    GPT model(GPTConfig::preset("tiny"));
    try {
      parallelize_gpt(model, mesh);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("n_head=4 is not divisible by the tp mesh size 3"));
    }
  });
}

}  // namespace
}  // namespace loom::models
