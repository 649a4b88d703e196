// DDP against one rank: each rank trains on its own part of the batch; averaged gradients and
// the parameters after AdamW steps equal the single-rank run on the whole batch.
#include "parallel/ddp/ddp.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "nn/linear.h"
#include "optim/optimizer.h"
#include "parallel/tp/parallelize.h"
#include "tensor/ops.h"
#include "tests/comm/other_device_group.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using testing::expect_close;
using ::testing::HasSubstr;
using testing::Tolerance;

class Mlp : public nn::Module {
 public:
  explicit Mlp(bool with_unused = false) : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 32, nn::LinearOptions{.seed = 1}));
    fc2 =
        register_module("fc2", std::make_shared<nn::Linear>(32, 32, nn::LinearOptions{.seed = 3}));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(32, 4, nn::LinearOptions{.seed = 5}));
    if (with_unused)
      unused = register_module("unused",
                               std::make_shared<nn::Linear>(4, 4, nn::LinearOptions{.seed = 7}));
  }
  Tensor forward(const Tensor& x) override {
    hidden = tanh((*fc1)(x));
    return (*fc3)(tanh((*fc2)(hidden)));
  }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3, unused;
  Tensor hidden;
};

// Mean squared output: the mean over rows makes the dp average of per-rank losses equal the
// full-batch loss when every rank holds the same number of rows.
Tensor loss_of(const Tensor& out) { return mean(mul(out, out)); }

// f32 sums in another order (per-rank halves, then averaging): relative 1e-5,
// |actual - expected| <= 1e-5 * (|expected| + 1e-2).
constexpr Tolerance kTol{.rtol = 1e-5, .atol = 1e-7};

TEST(DDPTest, GradientsAndStepsMatchOneRankOnTheWholeBatch) {
  const Tensor batch = ops::uniform({8, 8}, 9, -1.0, 1.0);
  auto reference = std::make_shared<Mlp>();
  optim::AdamW ref_opt(reference->parameters(), {.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    backward(loss_of((*reference)(batch)));
    ref_opt.step();
  }
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>();
    // Small buckets so the three layers land in separate buckets.
    ddp::DistributedDataParallel ddp(model, pg.shared_from_this(),
                                     {.caps = {.first_bucket_bytes = 1, .bucket_bytes = 1}});
    EXPECT_GE(ddp.reducer().bucket_count(), 3u);
    optim::AdamW opt(model->parameters(), {.lr = 0.01});
    const Tensor mine = ops::narrow(batch, 0, 4 * pg.rank(), 4);
    for (int step = 0; step < 3; ++step) {
      ddp.zero_grad();
      backward(loss_of(ddp(mine)));
      opt.step();
    }
    for (const auto& [name, p] : model->named_parameters()) {
      expect_close(
          {.actual = p, .expected = reference->state_dict().at(name), .tol = kTol, .what = name});
    }
  });
}

TEST(DDPTest, FirstBucketAllReduceStartsBeforeBackwardReachesTheFirstLayer) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>();
    ddp::DistributedDataParallel ddp(model, pg.shared_from_this(),
                                     {.caps = {.first_bucket_bytes = 1, .bucket_bytes = 1}});
    const Tensor x = ops::uniform({4, 8}, 10 + pg.rank(), -1.0, 1.0);
    Tensor loss = loss_of(ddp(x));
    int64_t all_reduces_when_first_layer_reached = -1;
    // The gradient of fc1's output is computed after fc3's and fc2's parameters are ready.
    autograd::register_hook(model->hidden, [&](const Tensor&) {
      all_reduces_when_first_layer_reached = pg.counters().calls_of(CollectiveKind::kAllReduce);
      return Tensor();
    });
    const int64_t before = pg.counters().calls_of(CollectiveKind::kAllReduce);
    backward(loss);
    EXPECT_GE(all_reduces_when_first_layer_reached - before, 1)
        << "no bucket was launched during backward";
    EXPECT_EQ(ddp.reducer().buckets_launched_during_backward(),
              static_cast<int64_t>(ddp.reducer().bucket_count()));
  });
}

TEST(DDPTest, ABackwardThatThrowsLeavesTheNextStepCorrect) {
  // The backward throws after fc3's and fc2's buckets were launched, so finalize() never runs;
  // zero_grad() must order those all-reduces and reset the iteration, and the next step must
  // equal one rank's (not fail with "received its gradient twice").
  const Tensor batch = ops::uniform({8, 8}, 12, -1.0, 1.0);
  auto reference = std::make_shared<Mlp>();
  backward(loss_of((*reference)(batch)));
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>();
    ddp::DistributedDataParallel ddp(model, pg.shared_from_this(),
                                     {.caps = {.first_bucket_bytes = 1, .bucket_bytes = 1}});
    const Tensor mine = ops::narrow(batch, 0, 4 * pg.rank(), 4);
    Tensor loss = loss_of(ddp(mine));
    autograd::register_hook(model->hidden, [](const Tensor&) -> Tensor {
      LOOM_FAIL("deliberate failure in backward");
    });
    EXPECT_THROW(backward(loss), Error);
    EXPECT_GE(ddp.reducer().buckets_launched_during_backward(), 1)
        << "the failure must come after a launch";
    ddp.zero_grad();
    backward(loss_of(ddp(mine)));
    std::map<std::string, Tensor> expected;
    for (const auto& [name, p] : reference->named_parameters()) expected[name] = p.grad();
    for (const auto& [name, p] : model->named_parameters()) {
      expect_close(
          {.actual = p.grad(), .expected = expected.at(name), .tol = kTol, .what = name + " grad"});
    }
  });
}

TEST(DDPTest, NoSyncAccumulatesWithoutCommunication) {
  const Tensor batch = ops::uniform({8, 8}, 11, -1.0, 1.0);
  auto reference = std::make_shared<Mlp>();
  // Reference: two micro-batches of the full batch, gradients summed.
  backward(loss_of((*reference)(ops::narrow(batch, 0, 0, 4))));
  backward(loss_of((*reference)(ops::narrow(batch, 0, 4, 4))));
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>();
    ddp::DistributedDataParallel ddp(model, pg.shared_from_this());
    // Rank r sees rows {r*2, r*2+1} of each micro-batch.
    const Tensor first = ops::narrow(batch, 0, 2 * pg.rank(), 2),
                 second = ops::narrow(batch, 0, 4 + 2 * pg.rank(), 2);
    {
      auto guard = ddp.no_sync();
      CommDebugMode comm;
      backward(loss_of(ddp(first)));
      EXPECT_EQ(comm.total_count(), 0) << comm.summary();
    }
    backward(loss_of(ddp(second)));
    for (const auto& [name, p] : model->named_parameters()) {
      expect_close({.actual = p.grad(),
                    .expected = reference->state_dict().at(name).grad(),
                    .tol = kTol,
                    .what = "grad of " + name});
    }
  });
}

TEST(DDPTest, UnusedParametersAreNamedOrAccepted) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    {
      auto model = std::make_shared<Mlp>(/*with_unused=*/true);
      ddp::DistributedDataParallel ddp(model, pg.shared_from_this());
      try {
        backward(loss_of(ddp(ops::ones({2, 8}))));
        FAIL() << "expected an error";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(),
                    HasSubstr("parameters [unused.weight, unused.bias] received no gradient"));
      }
    }
    auto model = std::make_shared<Mlp>(/*with_unused=*/true);
    ddp::DistributedDataParallel ddp(model, pg.shared_from_this(),
                                     {.find_unused_parameters = true});
    backward(loss_of(ddp(ops::ones({2, 8}))));
    EXPECT_EQ(ops::to_vector(model->unused->weight().grad()), std::vector<double>(16, 0.0));
  });
}

TEST(DDPTest, LocallyUnusedParameterAfterOptimizerZeroGradCountsAsZero) {
  // Step 1 uses every parameter on both ranks; the optimizer then sets .grad to none. Step 2
  // uses `unused` on rank 0 only: rank 1 must contribute zeros (not its stale step-1 gradient),
  // and both ranks must end with the same averaged gradient.
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(/*with_unused=*/true);
    ddp::DistributedDataParallel ddp(model, pg.shared_from_this(),
                                     {.find_unused_parameters = true});
    optim::SGD opt(model->parameters(), {.lr = 0.0});
    const Tensor x = ops::ones({2, 8});
    const Tensor u = ops::ones({2, 4});
    backward(add(loss_of(ddp(x)), loss_of((*model->unused)(u))));
    opt.zero_grad();
    Tensor loss = loss_of(ddp(x));
    if (pg.rank() == 0) loss = add(loss, loss_of((*model->unused)(u)));
    backward(loss);
    // Rank 0's own gradient of `unused.bias` alone, halved by the average.
    auto reference = std::make_shared<Mlp>(/*with_unused=*/true);
    backward(loss_of((*reference->unused)(u)));
    const Tensor expected = ops::mul(reference->unused->bias().grad(), 0.5);
    ASSERT_TRUE(model->unused->bias().grad().defined()) << "rank " << pg.rank();
    expect_close({.actual = model->unused->bias().grad(),
                  .expected = expected,
                  .tol = kTol,
                  .what = "unused.bias grad"});
  });
}

TEST(DDPTest, DifferentModelsAcrossRanksFailAtConstruction) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto model = std::make_shared<Mlp>(/*with_unused=*/pg.rank() == 1);
    try {
      ddp::DistributedDataParallel ddp(model, pg.shared_from_this());
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("has 6"));
      EXPECT_THAT(e.what(), HasSubstr("every rank must build the same model"));
      EXPECT_THAT(e.what(), HasSubstr("has 8"));
    }
  });
}

TEST(DDPTest, ParametersOffTheGroupsDeviceAreNamedAtConstruction) {
  // A CPU model on a group whose tensors live on cuda:0 (as a model left on the CPU under NCCL).
  auto model = std::make_shared<Mlp>();
  try {
    ddp::DistributedDataParallel ddp(model, std::make_shared<comm::test::OtherDeviceGroup>());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(
        e.what(),
        HasSubstr("DistributedDataParallel: parameter 'fc1.weight' is on cpu but group "
                  "'elsewhere' (fake) works on cuda:0; move the model there first (Module::to)"));
  }
}

TEST(DDPTest, TwoDimensionalDataAndTensorParallelMatchesOneRank) {
  // dp2 x tp2 on 4 ranks: fc1 column-parallel, fc2 row-parallel over "tp"; DDP over "dp".
  class TwoLayer : public nn::Module {
   public:
    TwoLayer() : Module("TwoLayer") {
      fc1 = register_module("fc1",
                            std::make_shared<nn::Linear>(8, 16, nn::LinearOptions{.seed = 21}));
      fc2 = register_module("fc2",
                            std::make_shared<nn::Linear>(16, 8, nn::LinearOptions{.seed = 23}));
    }
    Tensor forward(const Tensor& x) override { return (*fc2)(tanh((*fc1)(x))); }
    std::shared_ptr<nn::Linear> fc1, fc2;
  };
  const Tensor batch = ops::uniform({8, 8}, 12, -1.0, 1.0);
  auto reference = std::make_shared<TwoLayer>();
  backward(loss_of((*reference)(batch)));
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"dp", "tp"}, std::vector<int64_t>{2, 2});
    auto model = std::make_shared<TwoLayer>();
    tp::parallelize_module(*model, std::make_shared<const DeviceMesh>((*mesh)["tp"]),
                           {{"fc1", std::make_shared<tp::ColwiseParallel>()},
                            {"fc2", std::make_shared<tp::RowwiseParallel>()}});
    ddp::DistributedDataParallel ddp(model, mesh->group("dp"));
    const Tensor mine = ops::narrow(batch, 0, 4 * mesh->coordinate(0), 4);
    backward(loss_of(ddp(mine)));
    for (const auto& [name, p] : model->named_parameters()) {
      const Tensor grad = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad();
      expect_close({.actual = grad,
                    .expected = reference->state_dict().at(name).grad(),
                    .tol = kTol,
                    .what = "grad of " + name});
    }
  });
}

}  // namespace
}  // namespace loom
