// Fully sharded data parallelism (parallel/fsdp) against one rank: the same MLP, the same seeds
// and the same global batch, trained 3 AdamW steps with gradient clipping on 1 rank and with
// every unit fully sharded over dp_shard = 2, 3 and 4 ranks (3 and 4 split the first dims
// unevenly: 13 rows over 4 ranks are 4, 4, 4, 1). Checked together: losses, the gathered
// parameters, the shards' placements, and the collectives of one step (one all-gather per unit
// in forward, one reduce-scatter per unit in backward, with the bytes the padded shapes imply).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "parallel/fsdp/flat_layout.h"
#include "parallel/fsdp/fully_shard.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/testing/errors.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using comm::CollectiveKind;
using loom::testing::error_of;
using loom::testing::expect_close;
using ::testing::HasSubstr;

// Two Linears with first dims 13 and 8 (uneven over 3 and 4 ranks) and a root parameter of its
// own, so the root is a unit with something to shard too.
class Mlp : public nn::Module {
 public:
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 13, nn::LinearOptions{.seed = 3}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(13, 8, nn::LinearOptions{.seed = 5}));
    scale_ = &register_parameter("scale", ops::uniform({8}, 7, 0.5, 1.5));
  }
  Tensor forward(const Tensor& x) override { return mul((*fc2)(gelu((*fc1)(x))), *scale_); }
  std::shared_ptr<nn::Linear> fc1, fc2;

 private:
  Tensor* scale_;
};

constexpr int kSteps = 3;
constexpr int64_t kBatch = 12;  // divides over 2, 3 and 4 ranks

Tensor batch_of(int step) { return ops::uniform({kBatch, 8}, 100 + step, -1.0, 1.0); }

// The loss of rows [first, first + count) of step's batch: the mean of y^2.
Tensor loss_of(nn::Module& model, int step, int64_t first, int64_t count) {
  const Tensor y = model(ops::narrow(batch_of(step), 0, first, count));
  return mean(mul(y, y));
}

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;
};

TrainingRun train_one_rank() {
  Mlp model;
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  TrainingRun run;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    Tensor loss = loss_of(model, step, 0, kBatch);
    backward(loss);
    optim::clip_grad_norm_(model.parameters(), 0.5);
    opt.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, p] : model.named_parameters()) run.params[name] = ops::to_vector(p);
  return run;
}

std::shared_ptr<const DeviceMesh> shard_mesh(comm::ProcessGroup& pg) {
  return std::make_shared<const DeviceMesh>(
      pg.shared_from_this(), std::vector<std::string>{"dp_shard"}, std::vector<int64_t>{pg.size()});
}

void shard_every_unit(Mlp& model, const std::shared_ptr<const DeviceMesh>& mesh,
                      fsdp::FSDPOptions options) {
  fsdp::fully_shard(*model.fc1, mesh, options, "fc1");
  fsdp::fully_shard(*model.fc2, mesh, options, "fc2");
  fsdp::fully_shard(model, mesh, options, "root");
}

TEST(FlatLayoutTest, ChunksAreTorchChunksPaddedToOneSegment) {
  const auto layout = fsdp::FlatLayout::make({{13, 8}, {13}, {8, 13}, {8}}, 4);
  ASSERT_EQ(layout.params.size(), 4u);
  EXPECT_EQ(layout.params[0].chunk_rows, 4);
  EXPECT_EQ(layout.params[0].rows_of(3), 1);  // 13 = 4 + 4 + 4 + 1
  EXPECT_EQ(layout.params[0].rows_of(0), 4);
  EXPECT_EQ(layout.params[1].offset, 4 * 8);
  EXPECT_EQ(layout.params[2].offset, 4 * 8 + 4);
  EXPECT_EQ(layout.params[3].offset, 4 * 8 + 4 + 2 * 13);
  EXPECT_EQ(layout.segment_numel, 4 * 8 + 4 + 2 * 13 + 2);
  EXPECT_EQ(layout.total_numel(), 4 * layout.segment_numel);
  // 2 rows over 4 ranks: 1, 1, 0, 0.
  const auto small = fsdp::FlatLayout::make({{2, 3}}, 4);
  EXPECT_EQ(small.params[0].rows_of(1), 1);
  EXPECT_EQ(small.params[0].rows_of(2), 0);
}

// What a test checks of each step: the collectives its forward issued, and its backward's (with
// the gradients then in place).
struct StepChecks {
  std::function<void(const CommDebugMode&)> forward = [](const CommDebugMode&) {};
  std::function<void(const CommDebugMode&)> backward = [](const CommDebugMode&) {};
};

// kSteps clipped AdamW steps of a fully sharded `model`, this rank taking its share of each
// global batch among `data_ranks`; every rank returns the global losses and the gathered
// parameters.
TrainingRun train_sharded(Mlp& model, comm::ProcessGroup& pg, int64_t data_ranks,
                          const StepChecks& checks) {
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  const int64_t per_rank = kBatch / data_ranks;
  TrainingRun run;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      CommDebugMode comm;
      loss = loss_of(model, step, pg.rank() * per_rank, per_rank);
      checks.forward(comm);
    }
    // The shards are back in the slots after forward.
    for (const auto& [name, p] : model.named_parameters()) EXPECT_TRUE(is_dtensor(p)) << name;
    {
      CommDebugMode comm;
      backward(to(loss, kFloat32));
      checks.backward(comm);
    }
    optim::clip_grad_norm_(model.parameters(), 0.5);
    opt.step();
    Tensor global = ops::full({1}, loss.item<double>());
    pg.all_reduce(global, comm::ReduceOp::kAvg)->wait();
    run.losses.push_back(global.item<double>());
  }
  for (const auto& [name, p] : model.named_parameters()) {
    run.params[name] = ops::to_vector(full_tensor(p));
  }
  return run;
}

// Losses within `rtol` relative; parameters within `rtol` of their tensor's largest magnitude
// (AdamW normalizes tiny gradients to unit steps, so per-element relative is meaningless).
void expect_run_matches(const TrainingRun& actual, const TrainingRun& expected, double rtol,
                        const std::string& what) {
  expect_close({.actual = actual.losses,
                .expected = expected.losses,
                .tol = {.rtol = rtol},
                .what = what + " losses"});
  for (const auto& [name, values] : actual.params) {
    expect_close({.actual = values,
                  .expected = expected.params.at(name),
                  .tol = {.rtol = rtol, .relative_to = testing::RelativeTo::kLargest},
                  .what = what + " " + name});
  }
}

TEST(FullyShardTest, TrainsLikeOneRank) {
  const TrainingRun expected = train_one_rank();
  for (const auto& [world, reshard] :
       std::vector<std::pair<int, bool>>{{2, true}, {3, true}, {4, true}, {2, false}}) {
    const std::string what = fmt::format("dp_shard {}, reshard_after_forward {}", world, reshard);
    comm::testing::run_on_ranks(
        world, [&, world = world, reshard = reshard](comm::ProcessGroup& pg) {
          const auto mesh = shard_mesh(pg);
          Mlp model;
          shard_every_unit(model, mesh, {.reshard_after_forward = reshard});
          for (const auto& [name, p] : model.named_parameters()) {
            ASSERT_TRUE(is_dtensor(p)) << name;
            EXPECT_EQ(dtensor_spec(p).placements, (Placements{Shard(0)})) << name;
            EXPECT_TRUE(p.requires_grad()) << name;
          }
          const TrainingRun run = train_sharded(
              model, pg, world,
              {.forward =
                   [](const CommDebugMode& forward) {
                     // One all-gather per unit (fc1, fc2, root) in forward.
                     EXPECT_EQ(forward.count(CollectiveKind::kAllGather), 3) << forward.summary();
                     EXPECT_EQ(forward.total_count(), 3) << forward.summary();
                   },
               .backward =
                   [&](const CommDebugMode& back) {
                     // One reduce-scatter per unit, of the unit's padded flat buffer: fc1 holds
                     // 13 x 8 + 13 and fc2 8 x 13 + 8 elements, padded to ceil(rows / N) rows per
                     // rank; after a resharding forward, one all-gather per unit too, before its
                     // backward.
                     EXPECT_EQ(back.count(CollectiveKind::kReduceScatter), 3) << back.summary();
                     EXPECT_EQ(back.count(CollectiveKind::kAllGather), reshard ? 3 : 0)
                         << back.summary();
                     EXPECT_EQ(back.total_count(), reshard ? 6 : 3) << back.summary();
                     const int64_t c13 = (13 + world - 1) / world, c8 = (8 + world - 1) / world;
                     const int64_t padded = world * (c13 * 8 + c13 + c8 * 13 + c8 + c8);
                     EXPECT_EQ(back.bytes(CollectiveKind::kReduceScatter), padded * 4)
                         << back.summary();
                     for (const auto& [name, p] : model.named_parameters()) {
                       ASSERT_TRUE(p.grad().defined()) << name;
                       EXPECT_EQ(dtensor_spec(p.grad()).placements, (Placements{Shard(0)})) << name;
                     }
                   }});
          // f32 rounding of differently ordered sums: 1e-5.
          expect_run_matches(run, expected, 1e-5, what);
        });
  }
}

// HSDP on 4 ranks, (dp_replicate 2, dp_shard 2): each shard's replicas average their reduced
// shards, one all-reduce per unit beside the reduce-scatter.
TEST(FullyShardTest, HsdpTrainsLikeOneRank) {
  const TrainingRun expected = train_one_rank();
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"dp_replicate", "dp_shard"},
        std::vector<int64_t>{2, 2});
    Mlp model;
    shard_every_unit(model, mesh, {});
    for (const auto& [name, p] : model.named_parameters()) {
      EXPECT_EQ(dtensor_spec(p).placements, (Placements{Replicate(), Shard(0)})) << name;
    }
    const TrainingRun run =
        train_sharded(model, pg, 4, {.backward = [](const CommDebugMode& back) {
                        EXPECT_EQ(back.count(CollectiveKind::kReduceScatter), 3) << back.summary();
                        EXPECT_EQ(back.count(CollectiveKind::kAllReduce), 3) << back.summary();
                        EXPECT_EQ(back.count(CollectiveKind::kAllGather), 3) << back.summary();
                      }});
    expect_run_matches(run, expected, 1e-5, "HSDP");
  });
}

// bf16 compute and all-gathers over f32 masters, f32 reduce-scatters: the run follows the f32
// one to bf16 precision (8 bits of mantissa: ~1e-2 relative after the roundings of 3 steps), and
// the collectives carry the dtypes the policy names.
TEST(FullyShardTest, MixedPrecisionPolicyFollowsF32ToBf16Precision) {
  const TrainingRun expected = train_one_rank();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = shard_mesh(pg);
    Mlp model;
    shard_every_unit(model, mesh,
                     {.mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32}});
    for (const auto& [name, p] : model.named_parameters()) EXPECT_EQ(p.dtype(), kFloat32) << name;
    // Per rank (the counters count what a rank sends): its padded segment of every unit in
    // bf16, in forward and again in backward after resharding; the whole padded buffer in f32.
    const int64_t c13 = 7, c8 = 4;  // rows per rank over 2
    const int64_t segment = c13 * 8 + c13 + c8 * 13 + c8 + c8;
    const TrainingRun run = train_sharded(
        model, pg, 2,
        {.forward =
             [&](const CommDebugMode& forward) {
               EXPECT_EQ(forward.bytes(CollectiveKind::kAllGather), segment * 2)
                   << forward.summary();
             },
         .backward =
             [&](const CommDebugMode& back) {
               EXPECT_EQ(back.bytes(CollectiveKind::kAllGather), segment * 2) << back.summary();
               EXPECT_EQ(back.bytes(CollectiveKind::kReduceScatter), 2 * segment * 4)
                   << back.summary();
               for (const auto& [name, p] : model.named_parameters()) {
                 EXPECT_EQ(p.grad().dtype(), kFloat32) << name;
               }
             }});
    expect_run_matches(run, expected, 2e-2, "bf16");
  });
}

// Gradient accumulation over two microbatches: the first backward runs without gradient sync
// (no reduce-scatter: the whole gradients wait), the second reduces their sum, one
// reduce-scatter per unit per step; the run matches one rank's.
TEST(FullyShardTest, GradientSyncOffDefersTheReduceScatterToTheLastMicrobatch) {
  const TrainingRun expected = train_one_rank();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    Mlp model;
    shard_every_unit(model, shard_mesh(pg), {});
    optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
    const int64_t per_rank = kBatch / 2, micro = per_rank / 2;
    TrainingRun run;
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < 2; ++m) {
        const bool last = m == 1;
        Tensor loss = div(loss_of(model, step, pg.rank() * per_rank + m * micro, micro), 2.0);
        fsdp::set_requires_gradient_sync(model, last);
        CommDebugMode comm;
        backward(loss);
        EXPECT_EQ(comm.count(CollectiveKind::kReduceScatter), last ? 3 : 0) << comm.summary();
        loss_sum += loss.item<double>();
      }
      optim::clip_grad_norm_(model.parameters(), 0.5);
      opt.step();
      Tensor global = ops::full({1}, loss_sum);
      pg.all_reduce(global, comm::ReduceOp::kAvg)->wait();
      run.losses.push_back(global.item<double>());
    }
    for (const auto& [name, p] : model.named_parameters()) {
      run.params[name] = ops::to_vector(full_tensor(p));
    }
    expect_run_matches(run, expected, 1e-5, "two microbatches");
    nn::Linear plain(2, 2);
    EXPECT_THAT(error_of([&] { fsdp::set_requires_gradient_sync(plain, false); }),
                HasSubstr("set_requires_gradient_sync(Linear): neither the module nor any "
                          "submodule is fully sharded"));
  });
}

// GPT-2's vocabulary, 50257 rows, over 2 (25129 + 25128) and 4 (12565 x 3 + 12562) shards: an
// embedding unit and a head unit train like one rank.
class TokenModel : public nn::Module {
 public:
  TokenModel() : Module("TokenModel") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(50257, 4, /*seed=*/11, 0.02));
    head = register_module("head",
                           std::make_shared<nn::Linear>(4, 50257, nn::LinearOptions{.seed = 13}));
  }
  Tensor forward(const Tensor& ids) override { return (*head)((*wte)(ids)); }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> head;
};

TEST(FullyShardTest, VocabularyOf50257SplitsUnevenly) {
  const auto ids_of = [](int step) {
    return ops::from_vector_i64({3, 50256, 25128 + step, 25129, 12565, 12564 - step, 777, 50000},
                                {8});
  };
  const auto loss_of_rows = [&](TokenModel& model, int step, int64_t first, int64_t count) {
    const Tensor y = model(ops::narrow(ids_of(step), 0, first, count));
    return mean(mul(y, y));
  };
  // Every rank's run: the global losses (averaged over `pg`, when given) and parameters.
  const auto train = [&](TokenModel& model, comm::ProcessGroup* pg) {
    const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
    optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
    TrainingRun run;
    for (int step = 0; step < kSteps; ++step) {
      opt.zero_grad();
      const Tensor loss = loss_of_rows(model, step, rank * 8 / world, 8 / world);
      backward(loss);
      optim::clip_grad_norm_(model.parameters(), 0.5);
      opt.step();
      Tensor global = ops::full({1}, loss.item<double>());
      if (pg) pg->all_reduce(global, comm::ReduceOp::kAvg)->wait();
      run.losses.push_back(global.item<double>());
    }
    for (const auto& [name, p] : model.named_parameters()) {
      run.params[name] = ops::to_vector(is_dtensor(p) ? full_tensor(p) : p);
    }
    return run;
  };
  TokenModel reference;
  const TrainingRun expected = train(reference, nullptr);
  for (int world : {2, 4}) {
    comm::testing::run_on_ranks(world, [&, world](comm::ProcessGroup& pg) {
      const auto mesh = shard_mesh(pg);
      TokenModel model;
      fsdp::fully_shard(*model.wte, mesh, {}, "wte");
      fsdp::fully_shard(*model.head, mesh, {}, "head");
      const int64_t rows = dtensor_spec(model.wte->weight()).local_shape()[0];
      const int64_t chunk = (50257 + world - 1) / world;
      EXPECT_EQ(rows, pg.rank() + 1 < world ? chunk : 50257 - chunk * (world - 1));
      const TrainingRun run = train(model, &pg);
      expect_run_matches(run, expected, 1e-5, fmt::format("vocabulary 50257 over {}", world));
    });
  }
}

constexpr int kUnits = 6;
constexpr int64_t kWidth = 128;  // 64 KiB of whole f32 weights per unit
class Stack : public nn::Module {
 public:
  Stack() : Module("Stack") {
    for (int i = 0; i < kUnits; ++i) {
      layers.push_back(
          register_module("l" + std::to_string(i),
                          std::make_shared<nn::Linear>(
                              kWidth, kWidth, nn::LinearOptions{.bias = false, .seed = 10u + i})));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (const auto& layer : layers) h = tanh((*layer)(h));
    return h;
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

// A unit's whole parameters go as soon as its gradients are all in (FSDP2's reshard after
// backward), not when the backward's graph goes at its end (issue 32): with every unit keeping
// its parameters gathered after forward, what is left when the gradient reaches the input is the
// sharded gradients and the one reduce-scatter in flight, never the whole parameters.
TEST(FullyShardTest, WholeParametersAreFreedOnceAUnitsGradientsAreIn) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    MemoryTracker tracker;  // outlives the gradients it counts
    Stack model;
    const auto mesh = shard_mesh(pg);
    const fsdp::FSDPOptions keep_gathered{.reshard_after_forward = false, .prefetch = false};
    for (const auto& layer : model.layers) fsdp::fully_shard(*layer, mesh, keep_gathered);
    fsdp::fully_shard(model, mesh, keep_gathered);  // the group: one reduce-scatter in flight
    Tensor x = ops::uniform({4, kWidth}, 3, -1.0, 1.0);
    x.set_requires_grad(true);
    int64_t after_forward = 0;
    int64_t at_input = 0;
    {
      ScopedMemoryTracker scope(tracker);
      const Tensor y = model(x);
      after_forward = tracker.stats().current_bytes;
      autograd::register_hook(x, [&](const Tensor&) {
        at_input = tracker.stats().current_bytes;
        return Tensor();
      });
      backward(sum(y));
    }
    const int64_t unit_bytes = kWidth * kWidth * 4;
    EXPECT_GE(after_forward, kUnits * unit_bytes) << "rank " << pg.rank();  // all gathered
    // Every unit's sharded gradient, one reduce-scatter's whole send and shard receive buffers,
    // and a quarter unit for the activations; the whole parameters would add 6 units.
    const int64_t bound = kUnits * unit_bytes / 2 + unit_bytes * 3 / 2 + unit_bytes / 4;
    EXPECT_LT(at_input, bound) << "rank " << pg.rank();
  });
}

TEST(FullyShardTest, ErrorsNameTheUnitAndTheParameter) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    const auto mesh = shard_mesh(pg);
    Mlp model;
    fsdp::fully_shard(*model.fc1, mesh, {}, "fc1");
    EXPECT_EQ(error_of([&] { fsdp::fully_shard(*model.fc1, mesh, {}, "fc1"); }),
              "fully_shard(fc1): the module is already fully sharded");
    EXPECT_TRUE(fsdp::is_fully_sharded(*model.fc1));
    EXPECT_FALSE(fsdp::is_fully_sharded(*model.fc2));
    const auto cube = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"pp", "dp_replicate", "dp_shard"},
        std::vector<int64_t>{1, 1, 2});
    EXPECT_THAT(error_of([&] { fsdp::fully_shard(*model.fc2, cube, {}, "fc2"); }),
                HasSubstr("fully_shard(fc2): needs a 1-D mesh (dp_shard"));
    // A module outside fc1 that shares fc1's weight through a slot of its own.
    nn::Linear other(8, 13, nn::LinearOptions{.seed = 9});
    other.set_parameter("weight", model.fc1->parameter("weight"));
    EXPECT_THAT(error_of([&] { fsdp::fully_shard(other, mesh, {}, "other"); }),
                HasSubstr("fully_shard(other): parameter 'weight' is already in FSDP unit "
                          "'fc1'"));
    // One flat buffer per unit, so one dtype.
    model.fc2->set_parameter("bias", ops::to(model.fc2->parameter("bias"), kBFloat16));
    EXPECT_EQ(error_of([&] { fsdp::fully_shard(*model.fc2, mesh, {}, "fc2"); }),
              "fully_shard(fc2): parameter 'bias' is bf16 but 'weight' is f32; a unit's "
              "parameters share one flat buffer and so one dtype");
  });
}

}  // namespace
}  // namespace loom
