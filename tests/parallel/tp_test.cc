// Tensor parallelism against one rank: the same MLP, same seeds, same input, on tp = 2 and 3
// (3 splits the hidden width 16 unevenly: 6, 6, 4).
#include "parallel/tp/parallelize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/ops.h"

namespace loom {
namespace {

using ::testing::HasSubstr;
using comm::CollectiveKind;

class Mlp : public nn::Module {
 public:
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16, nn::LinearOptions{.seed = 11}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 8, nn::LinearOptions{.seed = 13}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(gelu((*fc1)(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// Sharded matmuls sum in a different order than the full one: allow f32 rounding (1e-5
// relative on values of order 1).
constexpr double kTol = 1e-5;

void expect_near(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const auto a = ops::to_vector(actual), e = ops::to_vector(expected);
  ASSERT_EQ(a.size(), e.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], e[i], kTol * (1 + std::abs(e[i]))) << what << " at " << i;
}

TEST(TensorParallelTest, ColwiseThenRowwiseMlpMatchesOneRank) {
  const Tensor x = ops::uniform({4, 8}, 5, -1.0, 1.0);
  Mlp reference;
  Tensor ref_out = reference(x);
  backward(sum(mul(ref_out, ref_out)));
  for (int world : {2, 3}) {
    comm::testing::run_on_ranks(world, [&](comm::ProcessGroup& pg) {
      auto mesh = std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"tp"},
                                                     std::vector<int64_t>{pg.size()});
      Mlp model;
      tp::parallelize_module(model, mesh,
                             {{"fc1", std::make_shared<tp::ColwiseParallel>()}, {"fc2", std::make_shared<tp::RowwiseParallel>()}});
      EXPECT_EQ(dtensor_spec(model.fc1->weight()).placements, (Placements{Shard(0)}));
      EXPECT_EQ(dtensor_spec(model.fc2->weight()).placements, (Placements{Shard(1)}));
      Tensor out;
      {
        CommDebugMode comm;
        out = model(x);
        // Megatron's MLP: one all-reduce in forward (the row-parallel output).
        EXPECT_EQ(comm.count(CollectiveKind::kAllReduce), 1) << comm.summary();
        EXPECT_EQ(comm.total_count(), 1) << comm.summary();
      }
      EXPECT_FALSE(is_dtensor(out)) << "use_local_output returns plain tensors";
      expect_near(out, ref_out, "output");
      backward(sum(mul(out, out)));
      for (const auto& [name, p] : model.named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        EXPECT_EQ(dtensor_spec(p.grad()).placements, dtensor_spec(p).placements) << name;
        expect_near(full_tensor(p.grad()), reference.state_dict().at(name).grad(), "grad of " + name);
      }
    });
  }
}

TEST(TensorParallelTest, ColwiseInputShardedOnRowsMatchesOneRank) {
  // input_layouts = Shard(0): each rank passes its own rows; the hook gathers them.
  const Tensor x = ops::uniform({4, 8}, 5, -1.0, 1.0);
  Mlp reference;
  const Tensor ref_out = reference(x);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"tp"},
                                                   std::vector<int64_t>{pg.size()});
    Mlp model;
    tp::parallelize_module(model, mesh,
                           {{"fc1", std::make_shared<tp::ColwiseParallel>(tp::LayoutOptions{.input_layouts = Shard(0)})},
                            {"fc2", std::make_shared<tp::RowwiseParallel>()}});
    expect_near(model(ops::narrow(x, 0, 2 * pg.rank(), 2)), ref_out, "output");
  });
}

TEST(TensorParallelTest, PlanErrorsNameTheEntryAndModule) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"tp"},
                                                   std::vector<int64_t>{2});
    Mlp model;
    try {
      tp::parallelize_module(model, mesh, {{"fc3", std::make_shared<tp::ColwiseParallel>()}});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("plan entry 'fc3' (ColwiseParallel) matches no submodule of Mlp"));
    }
    class WithNorm : public nn::Module {
     public:
      WithNorm() : Module("WithNorm") { register_module("ln", std::make_shared<nn::LayerNorm>(Shape{4})); }
    } with_norm;
    try {
      tp::parallelize_module(with_norm, mesh, {{"ln", std::make_shared<tp::RowwiseParallel>()}});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("RowwiseParallel applies to Linear modules, but 'ln' is a LayerNorm"));
    }
  });
}

TEST(TensorParallelTest, FqnPatternsMatchLikeFnmatch) {
  EXPECT_TRUE(tp::fqn_matches("h.*.attn.c_attn", "h.0.attn.c_attn"));
  EXPECT_TRUE(tp::fqn_matches("h.*.attn.c_attn", "h.11.attn.c_attn"));
  EXPECT_FALSE(tp::fqn_matches("h.*.attn.c_attn", "h.0.attn.c_proj"));
  EXPECT_TRUE(tp::fqn_matches("*c_fc", "h.3.mlp.c_fc"));
}

}  // namespace
}  // namespace loom
