// The whole training step against one rank: 4 AdamW steps (gradient norm clipped) of a tiny GPT
// under dp2, tp2 (with and without sequence parallelism), dp2 x tp2, gradient accumulation, pp2
// and dp2 x tp2 x pp2 give the same losses, gradient norms and final parameters as one rank on
// the same global batches, within 1e-5 relative (f32:
// sharded GEMMs and all-reduces sum in another order). The vocabulary is odd (257, as GPT-2's
// 50257), so the vocab-parallel embedding and the loss-parallel head split it unevenly.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/data/token_data.h"
#include "models/gpt/gpt.h"
#include "models/gpt/pipeline.h"
#include "models/gpt/plans.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "parallel/ddp/ddp.h"
#include "tensor/ops.h"

namespace loom::models {
namespace {

constexpr int kSteps = 4;
constexpr int64_t kGlobalBatch = 8, kSeqLen = 32;

GPTConfig config() { return GPTConfig{.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 32, .vocab_size = 257}; }

data::TokenData corpus() {
  data::TokenData d;
  d.vocab_size = 256;
  d.description = "synthetic";
  // A repetitive byte text with some structure to learn.
  const std::string text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. ";
  for (int i = 0; i < 40; ++i) {
    for (char c : text) d.tokens.push_back(static_cast<unsigned char>(c));
  }
  return d;
}

struct Result {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // before clipping
  std::map<std::string, std::vector<double>> params;
};

// How the run is parallelized: a mesh ("pp", "dp", "tp") or none (one rank), gradient
// accumulation (without pipelining), the TP plan, and the pipeline's schedule.
struct Layout {
  int accum = 1;
  GPTPlanOptions plan = {};
  std::string schedule = "1f1b";
  int microbatches = 1;
  int virtual_stages = 1;
};

constexpr double kClip = 0.5;  // below the tiny model's early gradient norms, so clipping acts

// One training run on `mesh` with `layout`; every rank returns the global losses and gradient
// norms, and the full final values of the parameters it holds (all of them without pipeline
// parallelism; its stages' with it).
Result train(std::shared_ptr<const DeviceMesh> mesh, Layout layout = {}) {
  const int64_t dp = mesh ? mesh->size("dp") : 1, tp = mesh ? mesh->size("tp") : 1, pp = mesh ? mesh->size("pp") : 1;
  const int64_t dp_rank = mesh ? mesh->coordinate(mesh->dim_index("dp")) : 0;
  const auto data = corpus();
  std::shared_ptr<GPT> model;
  std::unique_ptr<GPTPipeline> pipelined;
  std::unique_ptr<ddp::DistributedDataParallel> ddp;
  if (pp > 1) {
    pipelined = std::make_unique<GPTPipeline>(config(), /*seed=*/5, mesh,
                                              GPTPipelineOptions{.schedule = layout.schedule,
                                                                 .microbatches = layout.microbatches,
                                                                 .virtual_stages = layout.virtual_stages,
                                                                 .tp_plan = layout.plan});
  } else {
    model = std::make_shared<GPT>(config(), /*seed=*/5);
    if (mesh && tp > 1) parallelize_gpt(*model, std::make_shared<const DeviceMesh>((*mesh)["tp"]), layout.plan);
    if (mesh) ddp = std::make_unique<ddp::DistributedDataParallel>(model, mesh->group("dp"));
  }
  const auto named = pipelined ? pipelined->named_parameters() : model->named_parameters();
  std::vector<Tensor> parameters;
  for (const auto& [name, p] : named) parameters.push_back(p);
  optim::AdamW opt(parameters, {.lr = 3e-3, .weight_decay = 0.1});
  Result result;
  const int64_t per_rank = kGlobalBatch / dp, micro = per_rank / layout.accum;
  for (int step = 0; step < kSteps; ++step) {
    double step_loss = 0;
    if (pipelined) {
      pipelined->zero_grad();
      const auto batch = data::batch_slice(data, 11, step, dp_rank * per_rank, per_rank, kSeqLen);
      step_loss = pipelined->step(batch.inputs, batch.targets);
      result.grad_norms.push_back(pipelined->clip_grad_norm(kClip));
    } else {
      if (ddp) ddp->zero_grad(); else opt.zero_grad();
      for (int m = 0; m < layout.accum; ++m) {
        const auto batch = data::batch_slice(data, 11, step, dp_rank * per_rank + m * micro, micro, kSeqLen);
        Tensor loss = div(model->loss(batch.inputs, batch.targets), static_cast<double>(layout.accum));
        if (ddp && m + 1 < layout.accum) {
          auto guard = ddp->no_sync();
          backward(loss);
        } else {
          backward(loss);
        }
        step_loss += loss.item<double>();
      }
      result.grad_norms.push_back(optim::clip_grad_norm_(parameters, kClip));
    }
    opt.step();
    if (mesh) {
      Tensor t = ops::full({1}, step_loss);
      mesh->group("dp")->all_reduce(t, comm::ReduceOp::kAvg)->wait();
      step_loss = ops::to_vector(t)[0];
    }
    result.losses.push_back(step_loss);
  }
  for (const auto& [name, p] : named) result.params[name] = ops::to_vector(is_dtensor(p) ? full_tensor(p) : p);
  return result;
}

void expect_same(const Result& actual, const Result& expected, const std::string& layout) {
  ASSERT_EQ(actual.losses.size(), expected.losses.size());
  for (size_t s = 0; s < expected.losses.size(); ++s) {
    EXPECT_NEAR(actual.losses[s], expected.losses[s], 1e-5 * std::abs(expected.losses[s])) << layout << " step " << s;
    EXPECT_NEAR(actual.grad_norms[s], expected.grad_norms[s], 1e-5 * expected.grad_norms[s])
        << layout << " gradient norm, step " << s;
  }
  // Parameters: 1e-5 relative to the model's largest parameter magnitude (the LayerNorm weights,
  // ~1). Not per tensor: AdamW divides each gradient by its own running RMS, so a parameter
  // whose gradient is tiny — the attention key bias's is mathematically zero (adding b to every
  // key adds q.b to a whole softmax row), the query bias's is small — takes near-unit steps
  // driven by f32 rounding noise that depends on the summation order. Measured here: up to
  // ~3e-6 absolute on such elements (5e-5 of their own tensor's scale), against ~1e-8 elsewhere.
  double model_scale = 0;
  for (const auto& [name, values] : expected.params) {
    for (double v : values) model_scale = std::max(model_scale, std::abs(v));
  }
  ASSERT_FALSE(actual.params.empty()) << layout;
  for (const auto& [name, got] : actual.params) {  // a pipeline rank holds its stages' only
    ASSERT_TRUE(expected.params.count(name)) << layout << " " << name;
    const auto& values = expected.params.at(name);
    ASSERT_EQ(got.size(), values.size()) << layout << " " << name;
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(got[i], values[i], 1e-5 * model_scale) << layout << " " << name << " at " << i;
    }
  }
}

const Result& reference() {
  static const Result r = train(nullptr);
  return r;
}

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, int64_t dp, int64_t tp, int64_t pp = 1) {
  return std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"pp", "dp", "tp"},
                                            std::vector<int64_t>{pp, dp, tp});
}

TEST(GPTEquivalenceTest, ReferenceLearns) {
  EXPECT_LT(reference().losses.back(), reference().losses.front());
  EXPECT_GT(reference().grad_norms.front(), kClip) << "the clip must act for the norm checks to mean something";
}

TEST(GPTEquivalenceTest, GradientAccumulationOnOneRank) {
  comm::testing::run_on_ranks(1, [](comm::ProcessGroup& pg) { expect_same(train(mesh_of(pg, 1, 1), {.accum = 2}), reference(), "accum2"); });
}

TEST(GPTEquivalenceTest, DataParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) { expect_same(train(mesh_of(pg, 2, 1)), ref, "dp2"); });
}

TEST(GPTEquivalenceTest, DataParallelWithGradientAccumulation) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) { expect_same(train(mesh_of(pg, 2, 1), {.accum = 2}), ref, "dp2 accum2"); });
}

TEST(GPTEquivalenceTest, TensorParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same(train(mesh_of(pg, 1, 2), {.plan = {.sequence_parallel = false}}), ref, "tp2");
  });
}

TEST(GPTEquivalenceTest, TensorParallelWithSequenceParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same(train(mesh_of(pg, 1, 2), {.plan = {.sequence_parallel = true}}), ref, "tp2 + sequence parallel");
  });
}

TEST(GPTEquivalenceTest, DataAndTensorParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) { expect_same(train(mesh_of(pg, 2, 2)), ref, "dp2 x tp2 (sequence parallel)"); });
}

TEST(GPTEquivalenceTest, PipelineParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same(train(mesh_of(pg, 1, 1, 2), {.schedule = "1f1b", .microbatches = 4}), ref, "pp2 1f1b m4");
  });
}

// The mission's composition: DDP on dp, TP (sequence parallel) on tp, 1F1B stages on pp, on 8
// ranks; gradient-norm clipping and the reported loss are global across all three dims.
TEST(GPTEquivalenceTest, DataTensorAndPipelineParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(8, [&](comm::ProcessGroup& pg) {
    expect_same(train(mesh_of(pg, 2, 2, 2), {.schedule = "1f1b", .microbatches = 2}), ref, "dp2 x tp2 x pp2");
  });
}

// Determinism. Reductions are canonical: the Gloo backend sums contributions in group-rank
// order whatever order they arrive in (comm/gloo/), so a rerun is bit-identical. Two layouts
// that differ only in which process holds which mesh coordinate (ranks [0, 1, 2, 3] vs
// [3, 2, 1, 0]) feed every reduction the same operands, each dp/tp group of two in the other
// order, and float addition of two operands is commutative: bit-identical too. (Layouts with a
// different dp degree also change which samples each rank sums locally, so they agree to
// rounding only — the 1e-5 checks above.)
TEST(GPTEquivalenceTest, BitIdenticalAcrossRerunsAndRankOrders) {
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    const Result first = train(mesh_of(pg, 2, 2));
    const Result again = train(mesh_of(pg, 2, 2));
    auto reversed = std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::vector<std::string>{"pp", "dp", "tp"},
                                                       std::vector<int64_t>{1, 2, 2}, std::vector<int>{3, 2, 1, 0});
    const Result other_order = train(reversed);
    EXPECT_EQ(again.losses, first.losses) << "rerun";
    EXPECT_EQ(other_order.losses, first.losses) << "ranks in reverse order";
    EXPECT_TRUE(again.params == first.params) << "rerun parameters differ";
    EXPECT_TRUE(other_order.params == first.params) << "reverse-order parameters differ";
  });
}

}  // namespace
}  // namespace loom::models
