// GPT with bf16 compute over f32 master weights (nn/mixed_precision.h).
//
// Against the f32 model on one rank: the loss and every gradient agree to bf16 precision, and
// every gradient is f32. Against the mixed-precision model on one rank: tensor parallelism with
// sequence parallelism (tp2) and a 2-stage pipeline (pp2, 1F1B, 2 microbatches) give the same
// loss and gradients to the same bf16 tolerance.
//
// Tolerances: bf16 keeps 8 significant bits (a gradient near 0.13 is a multiple of 2^-10).
// Sharded GEMMs, reductions over other splits and microbatching round intermediate values at
// other points, so gradients differ by one or two bf16 steps of the largest values: 2e-2 of each
// tensor's largest magnitude (about 2.5 steps); losses (f32 cross entropy of bf16 logits) 2e-3
// relative. (In f32 the same layouts agree to 1e-5: gpt_tp_test, gpt_pipeline_test; here the
// dtype, not the parallelism, sets the bound.)
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/gpt/gpt.h"
#include "models/gpt/pipeline.h"
#include "models/gpt/plans.h"
#include "nn/mixed_precision.h"
#include "parallel/data_parallel.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/models/random_tokens.h"
#include "tests/testing/tensor_checks.h"
#include "train/parallel_dims.h"

namespace loom::models {
namespace {

GPTConfig config() {
  return GPTConfig{.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 37};
}
constexpr int64_t kBatch = 4, kSeqLen = 8;
constexpr double kLossTolerance = 2e-3, kGradTolerance = 2e-2;

Tensor tokens(uint64_t seed) {
  return testing::random_tokens({kBatch, kSeqLen}, seed, config().vocab_size);
}

struct Result {
  double loss;
  std::map<std::string, Tensor> grads;
};

Result one_rank(bool mixed) {
  GPT model(config(), 3);
  if (mixed) nn::apply_mixed_precision(model);
  Tensor loss = model.loss(tokens(1), tokens(2));
  backward(loss);
  Result out{loss.item<double>(), {}};
  for (const auto& [name, p] : model.named_parameters()) out.grads[name] = p.grad();
  return out;
}

void expect_matches(const Result& want, double loss,
                    const std::vector<std::pair<std::string, Tensor>>& params,
                    const std::string& what) {
  EXPECT_NEAR(loss, want.loss, kLossTolerance * want.loss) << what;
  ASSERT_FALSE(params.empty()) << what;
  for (const auto& [name, p] : params) {
    ASSERT_TRUE(p.grad().defined()) << what << ": " << name;
    const Tensor grad = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad();
    EXPECT_EQ(grad.dtype(), DType::kFloat32) << what << ": " << name;
    EXPECT_EQ(p.dtype(), DType::kFloat32) << what << ": master " << name;
    loom::testing::expect_close(
        {.actual = grad,
         .expected = want.grads.at(name),
         .tol = {.rtol = kGradTolerance, .relative_to = loom::testing::RelativeTo::kLargest},
         .what = what + ": grad of " + name});
  }
}

const Result& mixed_reference() {
  static const Result r = one_rank(/*mixed=*/true);
  return r;
}

TEST(GPTMixedPrecision, OneRankMatchesF32ToBf16Precision) {
  GPT model(config(), 3);
  nn::apply_mixed_precision(model);
  Tensor loss = model.loss(tokens(1), tokens(2));
  backward(loss);
  expect_matches(one_rank(/*mixed=*/false), loss.item<double>(), model.named_parameters(),
                 "bf16 vs f32");
  // And it really computed in bf16: not the f32 loss to f32 precision.
  EXPECT_NE(loss.item<double>(), one_rank(/*mixed=*/false).loss);
}

TEST(GPTMixedPrecision, TensorAndSequenceParallelMatchOneRank) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    GPT model(config(), 3);
    parallelize_gpt(model, mesh, {.sequence_parallel = true});
    nn::apply_mixed_precision(model);
    Tensor loss = model.loss(tokens(1), tokens(2));
    backward(loss);
    const double value = is_dtensor(loss) ? full_tensor(loss).item<double>() : loss.item<double>();
    expect_matches(mixed_reference(), value, model.named_parameters(), "tp2+SP bf16");
  });
}

// Microbatches in flight under tp2 + SP (as a pipeline stage keeps them) share one bf16 cast of
// each weight shard, and their gradients are those of running them one after another. linear's
// node saves the DTensor weight itself, so only the cast's handles tell that a graph holds it
// (`loom plan`: a 22B model at tp 8, pp 4 held 108 MiB of bf16 weights per layer and
// microbatch in flight when the check counted storage references alone).
TEST(GPTMixedPrecision, TensorParallelMicrobatchesInFlightShareTheCasts) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
    const auto build = [&] {
      auto model = std::make_unique<GPT>(config(), 3);
      parallelize_gpt(*model, mesh, {.sequence_parallel = true});
      nn::apply_mixed_precision(*model);
      return model;
    };
    auto in_flight = build();
    std::vector<const TensorImpl*> casts;
    std::vector<std::weak_ptr<TensorImpl>> alive;
    for (const auto& [name, module] : in_flight->named_modules()) {
      if (name.ends_with("c_fc")) {
        module->register_forward_pre_hook([&](nn::Module& m, const Tensor& input) {
          casts.push_back(m.parameter("weight").impl());
          alive.push_back(m.parameter("weight").impl_ptr());
          return input;
        });
      }
    }
    const Tensor loss1 = in_flight->loss(tokens(1), tokens(2));
    const Tensor loss2 = in_flight->loss(tokens(3), tokens(4));  // loss1's graph is alive
    ASSERT_EQ(casts.size(), 2 * static_cast<size_t>(config().n_layer));
    for (int64_t layer = 0; layer < config().n_layer; ++layer) {
      EXPECT_EQ(casts[layer], casts[layer + config().n_layer])
          << "layer " << layer << ": the second microbatch cast c_fc's weight again";
    }
    backward(loss1);
    backward(loss2);
    for (size_t i = 0; i < alive.size(); ++i) {
      EXPECT_TRUE(alive[i].expired()) << "cast " << i << " outlived both backwards";
    }
    auto one_by_one = build();
    backward(one_by_one->loss(tokens(1), tokens(2)));
    backward(one_by_one->loss(tokens(3), tokens(4)));
    const auto want = one_by_one->named_parameters();
    const auto got = in_flight->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    const auto whole = [](const Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; };
    for (size_t i = 0; i < got.size(); ++i) {
      loom::testing::expect_close({.actual = whole(got[i].second.grad()),
                                   .expected = whole(want[i].second.grad()),
                                   .tol = loom::testing::kExact,
                                   .what = "grad of " + got[i].first});
    }
  });
}

TEST(GPTMixedPrecision, PipelineMatchesOneRank) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    const auto meshes =
        train::ParallelDims::meshes(train::ParallelDims{.pp = 2}.build_mesh(pg.shared_from_this()));
    GPTPipeline model(config(), 3, meshes, {.microbatches = 2}, {}, nn::MixedPrecisionPolicy{});
    model.zero_grad();
    const double loss =
        model.step(pg.rank() == 0 ? tokens(1) : Tensor(), pg.rank() == 1 ? tokens(2) : Tensor());
    expect_matches(mixed_reference(), loss, model.named_parameters(), "pp2 bf16");
  });
}

// FSDP's own policy (parallel/data_parallel.h maps the job's bf16 onto it): bf16 all-gathers
// and compute over f32 sharded masters, f32 reduce-scatters. Each of 2 ranks takes half the
// batch; the mean loss and the gathered gradients follow the bf16 model on one rank, and the
// gradients stay f32 shards.
TEST(GPTMixedPrecision, FullyShardedMatchesOneRank) {
  comm::testing::run_on_ranks(2, [](comm::ProcessGroup& pg) {
    const auto meshes = train::ParallelDims::meshes(
        train::ParallelDims{.dp_shard = 2}.build_mesh(pg.shared_from_this()));
    auto model = std::make_shared<GPT>(config(), 3);
    parallel::DataParallel data_parallel(model, gpt_blocks(*model), meshes,
                                         nn::MixedPrecisionPolicy{});
    ASSERT_TRUE(data_parallel.fully_sharded());
    const int64_t half = kBatch / 2;
    Tensor loss = model->loss(ops::narrow(tokens(1), 0, pg.rank() * half, half),
                              ops::narrow(tokens(2), 0, pg.rank() * half, half));
    EXPECT_EQ(loss.dtype(), DType::kFloat32);  // the root's output_dtype
    data_parallel.backward(/*last=*/true, [&] { backward(loss); });
    Tensor mean = ops::full({1}, loss.item<double>());
    pg.all_reduce(mean, comm::ReduceOp::kAvg)->wait();
    for (const auto& [name, p] : model->named_parameters()) {
      EXPECT_TRUE(is_dtensor(p)) << name;
    }
    expect_matches(mixed_reference(), mean.item<double>(), model->named_parameters(),
                   "dp_shard2 bf16");
  });
}

// The job's policy keeps the logits bf16 (train/job_checks.cc, output_dtype = param_dtype): the
// loss reads them as they are and computes in f32, their gradient is rounded to bf16 once, and
// pipeline stages send bf16 activations. Since bf16 -> f32 -> bf16 is exact, every layout's loss
// and gradients equal those of the f32-logits policy bit for bit: one rank, tp2 + SP (loss
// parallel over vocabulary-sharded logits), pp2 and dp_shard2.
enum class Layout { kOneRank, kTensorParallel, kPipeline, kFullySharded };

Result run(Layout layout, DType output_dtype, comm::ProcessGroup* pg) {
  const nn::MixedPrecisionPolicy policy{.param_dtype = kBFloat16, .output_dtype = output_dtype};
  const int rank = pg ? pg->rank() : 0;
  Result out;
  std::vector<std::pair<std::string, Tensor>> params;
  if (layout == Layout::kPipeline) {
    const auto meshes = train::ParallelDims::meshes(
        train::ParallelDims{.pp = 2}.build_mesh(pg->shared_from_this()));
    GPTPipeline model(config(), 3, meshes, {.microbatches = 2}, {}, policy);
    model.zero_grad();
    out.loss = model.step(rank == 0 ? tokens(1) : Tensor(), rank == 1 ? tokens(2) : Tensor());
    params = model.named_parameters();
  } else {
    auto model = std::make_shared<GPT>(config(), 3);
    std::unique_ptr<parallel::DataParallel> data_parallel;
    Tensor ids = tokens(1), targets = tokens(2);
    if (layout == Layout::kTensorParallel) {
      auto mesh = std::make_shared<const DeviceMesh>(
          pg->shared_from_this(), std::vector<std::string>{"tp"}, std::vector<int64_t>{2});
      parallelize_gpt(*model, mesh, {.sequence_parallel = true});
    }
    if (layout == Layout::kFullySharded) {
      const auto meshes = train::ParallelDims::meshes(
          train::ParallelDims{.dp_shard = 2}.build_mesh(pg->shared_from_this()));
      data_parallel =
          std::make_unique<parallel::DataParallel>(model, gpt_blocks(*model), meshes, policy);
      const int64_t half = kBatch / 2;
      ids = ops::narrow(ids, 0, rank * half, half);
      targets = ops::narrow(targets, 0, rank * half, half);
    } else {
      nn::apply_mixed_precision(*model, policy);
    }
    EXPECT_EQ((*model)(ids).dtype(), output_dtype);
    Tensor loss = model->loss(ids, targets);
    EXPECT_EQ(loss.dtype(), kFloat32);
    if (data_parallel) {
      data_parallel->backward(/*last=*/true, [&] { backward(loss); });
    } else {
      backward(loss);
    }
    out.loss = is_dtensor(loss) ? full_tensor(loss).item<double>() : loss.item<double>();
    params = model->named_parameters();
  }
  for (const auto& [name, p] : params) {
    out.grads[name] = is_dtensor(p.grad()) ? full_tensor(p.grad()) : p.grad();
  }
  return out;
}

void expect_bitwise_equal(Layout layout, comm::ProcessGroup* pg, const std::string& what) {
  const Result f32_logits = run(layout, kFloat32, pg);
  const Result bf16_logits = run(layout, kBFloat16, pg);
  EXPECT_EQ(bf16_logits.loss, f32_logits.loss) << what;
  ASSERT_EQ(bf16_logits.grads.size(), f32_logits.grads.size()) << what;
  ASSERT_FALSE(f32_logits.grads.empty()) << what;
  for (const auto& [name, grad] : f32_logits.grads) {
    loom::testing::expect_equal(
        {.actual = bf16_logits.grads.at(name), .expected = grad, .what = what + ": " + name});
  }
}

TEST(GPTMixedPrecision, Bf16LogitsGiveTheLossAndGradientsOfF32LogitsBitForBit) {
  expect_bitwise_equal(Layout::kOneRank, nullptr, "one rank");
  for (const auto& [layout, what] :
       std::vector<std::pair<Layout, std::string>>{{Layout::kTensorParallel, "tp2+SP"},
                                                   {Layout::kPipeline, "pp2"},
                                                   {Layout::kFullySharded, "dp_shard2"}}) {
    comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
      expect_bitwise_equal(layout, &pg, what + " rank " + std::to_string(pg.rank()));
    });
  }
}

}  // namespace
}  // namespace loom::models
