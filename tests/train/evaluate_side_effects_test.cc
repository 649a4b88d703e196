// Validation changes nothing a training step depends on (Trainer::evaluate, as the job's
// --val-every and its samples call it): a run that evaluates after every step trains exactly as
// one that never evaluates — the same losses, gradient norms and router statistics, bit for bit —
// with GPT's dropout on, and with a mixture of experts whose router statistics and bias balancing
// are counted in training mode only. On 1 rank, dp 2, tp 2 and pp 2 (where each stage is a
// module tree of its own), and ep 2 for the experts. Every module is back in training mode after
// each evaluation.
#include <gtest/gtest.h>

#include "comm/testing/multi_rank.h"
#include "data/token_data.h"
#include "models/gpt/family.h"
#include "models/llama/family.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::train {
namespace {

constexpr int64_t kBatch = 8, kSeq = 16, kSteps = 3;

std::unique_ptr<models::ModelArgs> gpt_with_dropout() {
  return models::gpt_args({.n_layer = 2,
                           .n_head = 2,
                           .n_embd = 16,
                           .block_size = kSeq,
                           .vocab_size = 37,
                           .dropout = 0.2,
                           .attn_dropout = 0.2});
}

// llama-moe-tiny's routing with capacity (tokens dropped) and the bias balancing on.
std::unique_ptr<models::ModelArgs> moe_with_balancing() {
  models::LlamaConfig config = models::LlamaConfig::preset("llama-moe-tiny");
  config.vocab_size = 37;
  config.max_seq_len = kSeq;
  config.moe->capacity_factor = 1.0;
  config.moe->bias_update_rate = 0.01;
  return models::llama_args(config);
}

data::TokenCorpus corpus() {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back((i * 7 + i / 13) % 37);
  return data::TokenCorpus::from_tokens(std::move(tokens), 37, "test tokens");
}

struct Step {
  double loss, grad_norm;
  std::optional<RouterSummary> router;
};

// kSteps steps on `dims`; with `evaluate`, a validation batch after each. Rank 0's results.
std::vector<Step> train(const models::ModelArgs& args, const ParallelDims& dims, bool evaluate) {
  std::vector<Step> out;
  comm::testing::run_on_ranks(static_cast<int>(dims.world_size()), [&](comm::ProcessGroup& pg) {
    const auto mesh = dims.build_mesh(pg.shared_from_this());
    ParallelConfig parallel{.dims = dims};
    if (dims.pp > 1) parallel.pipeline.microbatches = 2;
    auto model = build_parallel_model(args, /*seed=*/5, mesh, parallel);
    Trainer trainer(*model, mesh, {.lr = [](int) { return 1e-2; }});
    const data::TokenCorpus data = corpus();
    std::vector<Step> steps;
    for (int s = 0; s < kSteps; ++s) {
      const auto batch = local_batch(data, 3, trainer.steps_done(), *mesh, kBatch, kSeq);
      const StepResult result = trainer.step(batch.inputs, batch.targets);
      steps.push_back({result.loss, result.grad_norm, result.router});
      if (!evaluate) continue;
      const auto val = local_batch(data, 11, s, *mesh, kBatch, kSeq);
      trainer.evaluate(val.inputs, val.targets);
      for (const auto& [name, module] : model->named_modules()) {
        EXPECT_TRUE(module->is_training()) << "'" << name << "' after evaluate, " << dims.str();
      }
    }
    if (pg.rank() == 0) out = steps;
  });
  return out;
}

void expect_evaluation_changes_nothing(const models::ModelArgs& args, const ParallelDims& dims) {
  SCOPED_TRACE(dims.str());
  const std::vector<Step> plain = train(args, dims, false);
  const std::vector<Step> evaluated = train(args, dims, true);
  ASSERT_EQ(plain.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(evaluated.size(), plain.size());
  for (size_t s = 0; s < plain.size(); ++s) {
    EXPECT_EQ(evaluated[s].loss, plain[s].loss) << "step " << s;
    EXPECT_EQ(evaluated[s].grad_norm, plain[s].grad_norm) << "step " << s;
    ASSERT_EQ(evaluated[s].router.has_value(), plain[s].router.has_value()) << "step " << s;
    if (!plain[s].router) continue;
    const RouterSummary &want = *plain[s].router, &got = *evaluated[s].router;
    // The statistics are those of a step that routed tokens (not an evaluating layer's zeros).
    EXPECT_GT(want.aux_loss, 0) << "step " << s;
    EXPECT_GT(want.max_over_mean, 0) << "step " << s;
    EXPECT_EQ(got.max_over_mean, want.max_over_mean) << "step " << s;
    EXPECT_EQ(got.min_over_mean, want.min_over_mean) << "step " << s;
    EXPECT_EQ(got.aux_loss, want.aux_loss) << "step " << s;
    EXPECT_EQ(got.dropped, want.dropped) << "step " << s;
  }
}

TEST(EvaluateSideEffectsTest, DropoutStaysOnAfterValidation) {
  const auto args = gpt_with_dropout();
  for (const ParallelDims& dims : {ParallelDims{}, ParallelDims{.dp_replicate = 2},
                                   ParallelDims{.tp = 2}, ParallelDims{.pp = 2}}) {
    expect_evaluation_changes_nothing(*args, dims);
  }
}

TEST(EvaluateSideEffectsTest, RouterCountsAndBalancesAfterValidation) {
  const auto args = moe_with_balancing();
  for (const ParallelDims& dims : {ParallelDims{}, ParallelDims{.dp_shard = 2, .ep = 2}}) {
    expect_evaluation_changes_nothing(*args, dims);
  }
}

}  // namespace
}  // namespace loom::train
