// What a user writing their own plan for a Llama-like (pre-norm, gated, bias-free) block hits,
// each against one rank: bias-free projections under Colwise/Rowwise, a plan that does not fit
// changing nothing, a plan on one named dim of a 2-D mesh, a sequence that does not divide tp,
// and a gated MLP whose two projections share one gathered input (one all-gather in forward,
// one reduce-scatter of the input's gradient in backward).
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
#include "parallel/tp/distribute_module.h"
#include "parallel/tp/layouts.h"
#include "parallel/tp/parallelize.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using testing::error_of;
using testing::expect_close;
using ::testing::HasSubstr;
using testing::Tolerance;

constexpr Tolerance kTol{.rtol = 1e-5, .atol = 1e-5};

// Llama's feed-forward: w2(silu(w1 x) * w3 x), every projection without bias, after a norm.
class GatedBlock : public nn::Module {
 public:
  GatedBlock() : Module("GatedBlock") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{8}));
    ffn = register_module("ffn", std::make_shared<FeedForward>());
  }
  Tensor forward(const Tensor& x) override { return add(x, (*ffn)((*norm)(x))); }

  class FeedForward : public nn::Module {
   public:
    FeedForward() : Module("FeedForward") {
      const auto linear = [](int64_t in, int64_t out, uint64_t seed) {
        return std::make_shared<nn::Linear>(in, out,
                                            nn::LinearOptions{.bias = false, .seed = seed});
      };
      w1 = register_module("w1", linear(8, 12, 21));
      w3 = register_module("w3", linear(8, 12, 23));
      w2 = register_module("w2", linear(12, 8, 25));
    }
    Tensor forward(const Tensor& x) override { return (*w2)(mul(silu((*w1)(x)), (*w3)(x))); }
    std::shared_ptr<nn::Linear> w1, w2, w3;
  };
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<FeedForward> ffn;
};

std::shared_ptr<const DeviceMesh> tp_mesh(comm::ProcessGroup& pg) {
  return std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"tp"},
                                            std::vector<int64_t>{pg.size()});
}

// The one-rank output and gradients for input x.
struct Reference {
  Tensor out;
  std::map<std::string, Tensor> grads;
};
Reference reference(const Tensor& x) {
  GatedBlock model;
  Reference r{model(x), {}};
  backward(sum(mul(r.out, r.out)));
  for (const auto& [name, p] : model.named_parameters()) r.grads[name] = p.grad();
  return r;
}

void expect_grads(nn::Module& model, const Reference& want, const std::string& what) {
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << what << " " << name;
    expect_close({.actual = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad(),
                  .expected = want.grads.at(name),
                  .tol = kTol,
                  .what = what + ": grad of " + name});
  }
}

TEST(TpUserPlansTest, BiasFreeProjectionsShardLikeOneRank) {
  const Tensor x = ops::uniform({2, 4, 8}, 5, -1.0, 1.0);
  const Reference want = reference(x);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    GatedBlock model;
    tp::parallelize_module(model, tp_mesh(pg),
                           {{"ffn.w1", std::make_shared<tp::ColwiseParallel>()},
                            {"ffn.w3", std::make_shared<tp::ColwiseParallel>()},
                            {"ffn.w2", std::make_shared<tp::RowwiseParallel>()}});
    EXPECT_FALSE(model.ffn->w1->has_parameter("bias"));
    EXPECT_EQ(dtensor_spec(model.ffn->w2->weight()).placements, (Placements{Shard(1)}));
    const Tensor out = model(x);
    expect_close({.actual = out, .expected = want.out, .tol = kTol, .what = "output"});
    backward(sum(mul(out, out)));
    expect_grads(model, want, "bias-free");
  });
}

// distribute_module (torch's): the user's partition function shards the feed-forward by hand
// (w1, w3 by rows, w2 by columns) and every other parameter is replicated; the input and output
// functions lay out the block's input and output. Output and gradients equal one rank's.
TEST(TpUserPlansTest, DistributeModuleWithOwnPartitionAndInputOutputFunctions) {
  const Tensor x = ops::uniform({2, 4, 8}, 5, -1.0, 1.0);
  const Reference want = reference(x);
  comm::testing::run_on_ranks(3, [&](comm::ProcessGroup& pg) {
    GatedBlock model;
    std::vector<std::string> visited;
    tp::distribute_module(
        model, tp_mesh(pg),
        [&](const std::string& name, nn::Module& module,
            const std::shared_ptr<const DeviceMesh>& mesh) {
          visited.push_back(name);
          if (name == "ffn.w1" || name == "ffn.w3") {
            tp::distribute_parameter(module, name, "weight", mesh, Shard(0));
          } else if (name == "ffn.w2") {
            tp::distribute_parameter(module, name, "weight", mesh, Shard(1));
          }
        },
        [](nn::Module&, const Tensor& input, const std::shared_ptr<const DeviceMesh>& mesh) {
          return distribute_tensor(input, mesh, {Replicate()});
        },
        [](nn::Module&, const Tensor& output, const std::shared_ptr<const DeviceMesh>&) {
          return full_tensor(output);
        });
    EXPECT_EQ(visited, (std::vector<std::string>{"", "norm", "ffn", "ffn.w1", "ffn.w3", "ffn.w2"}));
    EXPECT_EQ(dtensor_spec(model.ffn->w2->weight()).placements, (Placements{Shard(1)}));
    EXPECT_EQ(dtensor_spec(model.norm->parameter("weight")).placements, (Placements{Replicate()}));
    const Tensor out = model(x);
    EXPECT_FALSE(is_dtensor(out));
    expect_close({.actual = out, .expected = want.out, .tol = kTol, .what = "output"});
    backward(sum(mul(out, out)));
    expect_grads(model, want, "distribute_module");
  });
}

// With no partition function every parameter is replicated, and one two modules share stays one.
TEST(TpUserPlansTest, DistributeModuleReplicatesAndKeepsTiedParameters) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    GatedBlock model;
    model.ffn->w3->set_parameter("weight", model.ffn->w1->weight());  // tied
    tp::distribute_module(model, tp_mesh(pg));
    for (const auto& [name, p] : model.named_parameters()) {
      ASSERT_TRUE(is_dtensor(p)) << name;
      EXPECT_EQ(dtensor_spec(p).placements, (Placements{Replicate()})) << name;
      EXPECT_TRUE(p.requires_grad()) << name;
    }
    EXPECT_EQ(model.ffn->w3->weight().impl(), model.ffn->w1->weight().impl());
  });
}

TEST(TpUserPlansTest, APlanThatDoesNotFitChangesNothing) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    GatedBlock model;
    // The last entry does not fit (a norm is not a Linear): nothing is parallelized.
    EXPECT_THAT(error_of([&] {
                  tp::parallelize_module(model, tp_mesh(pg),
                                         {{"ffn.w1", std::make_shared<tp::ColwiseParallel>()},
                                          {"ffn.w2", std::make_shared<tp::RowwiseParallel>()},
                                          {"norm", std::make_shared<tp::ColwiseParallel>()}});
                }),
                HasSubstr("ColwiseParallel applies to Linear and Embedding modules, but 'norm' is "
                          "a LayerNorm"));
    for (const auto& [name, p] : model.named_parameters()) {
      EXPECT_FALSE(is_dtensor(p)) << name << " was changed by a plan that failed";
    }
    // Nor does an entry that matches nothing.
    EXPECT_THAT(error_of([&] {
                  tp::parallelize_module(model, tp_mesh(pg),
                                         {{"ffn.w1", std::make_shared<tp::ColwiseParallel>()},
                                          {"ffn.w4", std::make_shared<tp::ColwiseParallel>()}});
                }),
                HasSubstr("plan entry 'ffn.w4' (ColwiseParallel) matches no submodule"));
    EXPECT_FALSE(is_dtensor(model.ffn->w1->weight()));
  });
}

TEST(TpUserPlansTest, PlanOnOneNamedDimOfATwoDimMesh) {
  const Tensor x = ops::uniform({2, 4, 8}, 5, -1.0, 1.0);
  const Reference want = reference(x);
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    const DeviceMesh mesh(pg.shared_from_this(), {"dp", "tp"}, {2, 2});
    GatedBlock model;
    tp::parallelize_module(model, mesh, "tp",
                           {{"ffn.w1", std::make_shared<tp::ColwiseParallel>()},
                            {"ffn.w3", std::make_shared<tp::ColwiseParallel>()},
                            {"ffn.w2", std::make_shared<tp::RowwiseParallel>()}});
    EXPECT_EQ(dtensor_spec(model.ffn->w1->weight()).mesh->dim_names(),
              std::vector<std::string>{"tp"});
    expect_close({.actual = model(x), .expected = want.out, .tol = kTol, .what = "output"});
  });
}

// Sequence parallelism with a gated block and a shared input. The block's input arrives as a
// sequence shard; the norm runs on it; PrepareModuleInput on the feed-forward gathers the
// sequence once (Shard(1) -> Replicate) and both w1 and w3 take that Replicate input as it is;
// w2's output is reduce-scattered back to sequence shards. Backward mirrors it: one all-gather of
// the output's gradient, one reduce-scatter of the shared input's gradient (w1's and w3's
// Partial contributions add up first). `seq` tokens over 2 ranks: 6 (even) and 5 (3 + 2).
void expect_shared_input_plan(int64_t seq) {
  const Tensor x = ops::uniform({2, seq, 8}, 5, -1.0, 1.0);
  const Reference want = reference(x);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = tp_mesh(pg);
    GatedBlock model;
    tp::parallelize_module(
        model, mesh,
        {{"norm", std::make_shared<tp::SequenceParallel>()},
         {"ffn", std::make_shared<tp::PrepareModuleInput>(
                     tp::PrepareInputOptions{Shard(1), Replicate(), false})},
         {"ffn.w1", std::make_shared<tp::ColwiseParallel>()},
         {"ffn.w3", std::make_shared<tp::ColwiseParallel>()},
         {"ffn.w2", std::make_shared<tp::RowwiseParallel>(tp::LayoutOptions{
                        .output_layouts = Shard(1), .use_local_output = false})}});
    // The block's input as a sequence-sharded DTensor (torch.chunk's split: 5 -> 3 + 2).
    const Tensor input = distribute_tensor(x, mesh, {Shard(1)});
    Tensor out;
    {
      CommDebugMode comm;
      out = model(input);
      EXPECT_EQ(comm.count(CollectiveKind::kAllGather), 1) << comm.summary();
      EXPECT_EQ(comm.count(CollectiveKind::kReduceScatter), 1) << comm.summary();
      EXPECT_EQ(comm.total_count(), 2) << comm.summary();
    }
    ASSERT_TRUE(is_dtensor(out));
    EXPECT_EQ(dtensor_spec(out).placements, (Placements{Shard(1)}));
    expect_close({.actual = full_tensor(out),
                  .expected = want.out,
                  .tol = kTol,
                  .what = "output, " + std::to_string(seq) + " tokens"});
    Tensor loss = sum(mul(out, out));
    {
      CommDebugMode comm;
      backward(loss);
      // One all-gather (w2's output gradient) and one reduce-scatter (the shared input's
      // gradient) for the activations; the norm's replicated weight and bias gradients are
      // all-reduced (their Partial sums over the sequence shards).
      EXPECT_EQ(comm.count(CollectiveKind::kReduceScatter), 1) << comm.summary();
      EXPECT_EQ(comm.count(CollectiveKind::kAllGather), 1) << comm.summary();
    }
    expect_grads(model, want, "shared input, " + std::to_string(seq) + " tokens");
  });
}

TEST(TpUserPlansTest, GatedBlockSharesOneGatheredInput) { expect_shared_input_plan(6); }

TEST(TpUserPlansTest, SequenceThatDoesNotDivideTpShardsUnevenly) { expect_shared_input_plan(5); }

}  // namespace
}  // namespace loom
