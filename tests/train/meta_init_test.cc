// Meta-device initialization (parallel/build_stage.h, nn/meta_init.h) against the eager build,
// as the job builds its model (build_parallel_model), for GPT and Llama on 1 rank, tp 2,
// dp_shard 3 (uneven rows), pp 2 x dp_shard 2 x tp 2 and dp 2 x tp 2 (DDP):
//   - every rank's parameters (its local shards) equal the eager build's bit for bit (the eager
//     build's shards are slices of the whole model every rank built: the one-rank values);
//   - ten training steps give bitwise the same losses;
//   - a rank's tensor memory during construction never exceeds what it keeps once built (its
//     shards, and what the eager build keeps too), where the eager build first holds the whole
//     stage.
#include <gtest/gtest.h>

#include <mutex>

#include "comm/testing/multi_rank.h"
#include "dtensor/dtensor.h"
#include "models/gpt/family.h"
#include "models/llama/family.h"
#include "models/llama/llama.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/models/random_tokens.h"
#include "tests/testing/tensor_checks.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::train {
namespace {

using testing::expect_bitwise_equal;

constexpr int64_t kSeq = 16, kSteps = 10;

std::unique_ptr<models::ModelArgs> gpt() {
  return models::gpt_args(
      {.n_layer = 4, .n_head = 2, .n_embd = 16, .block_size = kSeq, .vocab_size = 67});
}

std::unique_ptr<models::ModelArgs> llama() {
  models::LlamaConfig c = models::LlamaConfig::preset("llama-tiny");
  c.vocab_size = 67;
  c.max_seq_len = kSeq;
  return models::llama_args(c);
}

int64_t local_bytes(const Tensor& p) {
  const Tensor& local = is_dtensor(p) ? local_shard(p) : p;
  return local.numel() * static_cast<int64_t>(element_size(local.dtype()));
}

struct Built {
  std::unique_ptr<ParallelModel> model;
  int64_t construction_peak = 0;
  int64_t held_after = 0;  // tensor bytes held once built
  int64_t kept_bytes = 0;  // of them, the parameters (local shards)
};

Built build(const models::ModelArgs& args, std::shared_ptr<const DeviceMesh> mesh,
            ParallelConfig parallel, bool meta_init, MemoryTracker& tracker) {
  parallel.meta_init = meta_init;
  Built out;
  {
    ScopedMemoryTracker scope(tracker);
    out.model = build_parallel_model(args, /*seed=*/3, std::move(mesh), parallel);
  }
  out.construction_peak = tracker.stats().peak_bytes;
  out.held_after = tracker.stats().current_bytes;
  for (const auto& [name, p] : out.model->named_parameters()) out.kept_bytes += local_bytes(p);
  return out;
}

std::vector<double> train(ParallelModel& model, const std::shared_ptr<const DeviceMesh>& mesh,
                          int64_t local_batch, int64_t vocab) {
  Trainer trainer(model, mesh, {.lr = [](int) { return 1e-2; }});
  std::vector<double> losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    const Tensor tokens =
        models::testing::random_tokens({local_batch, kSeq + 1}, 100 + step, vocab);
    losses.push_back(trainer
                         .step(ops::contiguous(ops::narrow(tokens, 1, 0, kSeq)),
                               ops::contiguous(ops::narrow(tokens, 1, 1, kSeq)))
                         .loss);
  }
  return losses;
}

void expect_meta_equals_eager(const models::ModelArgs& args, const ParallelConfig& parallel,
                              bool sharded) {
  SCOPED_TRACE(args.family() + " " + parallel.dims.str());
  const int64_t local_batch = 2 * parallel.pipeline.microbatches_for(parallel.dims.pp);
  comm::testing::run_on_ranks(
      static_cast<int>(parallel.dims.world_size()), [&](comm::ProcessGroup& pg) {
        MemoryTracker meta_memory, eager_memory;  // outlive both models
        const auto mesh = parallel.dims.build_mesh(pg.shared_from_this());
        const Built meta = build(args, mesh, parallel, /*meta_init=*/true, meta_memory);
        const Built eager = build(args, mesh, parallel, /*meta_init=*/false, eager_memory);
        const auto got = meta.model->named_parameters(), want = eager.model->named_parameters();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i].first, want[i].first);
          const Tensor& g = got[i].second;
          const Tensor& w = want[i].second;
          ASSERT_EQ(is_dtensor(g), is_dtensor(w)) << want[i].first;
          if (is_dtensor(w)) {
            EXPECT_EQ(dtensor_spec(g).placements, dtensor_spec(w).placements) << want[i].first;
          }
          expect_bitwise_equal({.actual = is_dtensor(g) ? local_shard(g) : g,
                                .expected = is_dtensor(w) ? local_shard(w) : w,
                                .what = "rank " + std::to_string(pg.rank()) + " " + want[i].first});
        }
        // Construction never holds more than the rank keeps once built (its shards, the tables
        // the model computes, DDP's buckets), which is what the eager build keeps too; the eager
        // build holds the whole stage first. (Besides: the 8 bytes of RoPE tables of the
        // names-only Llama stage the model builds to list its parameters' names.)
        EXPECT_LE(meta.construction_peak - meta.held_after, 8) << "rank " << pg.rank();
        EXPECT_EQ(meta.held_after, eager.held_after) << "rank " << pg.rank();
        EXPECT_GE(meta.held_after, meta.kept_bytes) << "rank " << pg.rank();
        if (sharded) {
          EXPECT_GT(eager.construction_peak, meta.held_after) << "rank " << pg.rank();
        }
        const auto meta_losses = train(*meta.model, mesh, local_batch, args.vocab_size());
        const auto eager_losses = train(*eager.model, mesh, local_batch, args.vocab_size());
        EXPECT_EQ(meta_losses, eager_losses) << "rank " << pg.rank();
      });
}

const std::vector<std::pair<ParallelConfig, bool>>& layouts() {
  static const std::vector<std::pair<ParallelConfig, bool>> all = {
      {{.dims = {}}, false},
      {{.dims = {.tp = 2}}, true},
      {{.dims = {.dp_shard = 3}}, true},
      {{.dims = {.pp = 2, .dp_shard = 2, .tp = 2}, .pipeline = {.microbatches = 2}}, true},
      {{.dims = {.dp_replicate = 2, .tp = 2}}, true},
  };
  return all;
}

TEST(MetaInitTest, GPTEqualsTheEagerBuildOnEveryLayout) {
  for (const auto& [parallel, sharded] : layouts())
    expect_meta_equals_eager(*gpt(), parallel, sharded);
}

TEST(MetaInitTest, LlamaEqualsTheEagerBuildOnEveryLayout) {
  for (const auto& [parallel, sharded] : layouts()) {
    expect_meta_equals_eager(*llama(), parallel, sharded);
  }
}

}  // namespace
}  // namespace loom::train
