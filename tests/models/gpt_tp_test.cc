// GPT under tensor parallelism against one rank: same seeds, same batch; losses and every
// parameter's gradient agree, and the forward issues exactly two all-reduces per block.
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

namespace loom::models {
namespace {

using ::testing::HasSubstr;

Tensor tokens(const Shape& shape, uint64_t seed) {
  std::vector<int64_t> ids;
  for (double v : ops::to_vector(ops::uniform(shape, seed, 0.0, 256.0))) ids.push_back(static_cast<int64_t>(v));
  return ops::from_vector_i64(ids, shape);
}

// Sharded GEMMs and all-reduces sum in another order than one rank: f32 rounding, relative
// 1e-5 of the values (the equivalence tolerance).
void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const auto a = ops::to_vector(actual), e = ops::to_vector(expected);
  ASSERT_EQ(a.size(), e.size()) << what;
  double scale = 0;
  for (double v : e) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], e[i], 1e-5 * scale + 1e-7) << what << " at " << i;
}

TEST(GPTTensorParallelTest, LossAndGradientsMatchOneRank) {
  const GPTConfig config = GPTConfig::preset("tiny");
  const Tensor x = tokens({2, 16}, 3), y = tokens({2, 16}, 4);
  GPT reference(config, 7);
  Tensor ref_loss = reference.loss(x, y);
  backward(ref_loss);
  const auto ref_state = reference.state_dict();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"tp"},
                                                   std::vector<int64_t>{2});
    GPT model(config, 7);
    parallelize_gpt(model, mesh);
    Tensor loss;
    {
      CommDebugMode comm;
      loss = model.loss(x, y);
      EXPECT_EQ(comm.count(comm::CollectiveKind::kAllReduce), 2 * config.n_layer) << comm.summary();
      EXPECT_EQ(comm.total_count(), 2 * config.n_layer) << comm.summary();
    }
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5 * std::abs(ref_loss.item<double>()));
    backward(loss);
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      const Tensor grad = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad();
      expect_close(grad, ref_state.at(name).grad(), "grad of " + name);
    }
  });
}

TEST(GPTTensorParallelTest, HeadsMustSplitEvenly) {
  comm::testing::run_on_ranks(3, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"tp"},
                                                   std::vector<int64_t>{3});
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
