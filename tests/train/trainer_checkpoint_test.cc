// The whole training state through a distributed checkpoint, across layouts: a GPT trained 2
// steps on layout A is saved; layout B loads it and saves it again; both checkpoints, read whole
// on one rank, hold bit-identical values for every entry (parameters, AdamW moments and step
// counts, dropout counters). A -> B pairs: dp2 x tp2 to 1 rank, tp2, pp2 and pp2 x dp2 x tp2 and
// each of those back to dp2 x tp2; dp_shard 4 (FSDP: sharded moments) to 1 rank, and
// dp_shard2 x tp2 to pp2 x dp2 x tp2.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/distributed_checkpoint.h"
#include "comm/testing/multi_rank.h"
#include "data/token_data.h"
#include "models/gpt/family.h"
#include "tensor/ops.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

models::GPTConfig config() {
  return {.n_layer = 2, .n_head = 2, .n_embd = 16, .block_size = 16, .vocab_size = 37};
}

data::TokenCorpus corpus() {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back((i * 7 + i / 13) % 37);
  return data::TokenCorpus::from_tokens(std::move(tokens), 37, "test tokens");
}

constexpr int64_t kBatch = 8, kSeq = 16;

std::unique_ptr<ParallelModel> model_on(const std::shared_ptr<const DeviceMesh>& mesh,
                                        const ParallelDims& dims) {
  ParallelConfig parallel{.dims = dims};
  if (dims.pp > 1) parallel.pipeline.microbatches = 2;
  return build_parallel_model(*models::gpt_args(config()), 5, mesh, parallel);
}

TrainerOptions options() {
  return {.lr = [](int) { return 1e-2; }, .weight_decay = 0.1, .clip = 1.0};
}

// Trains `steps` steps on `dims` (one rank per process group rank) and saves under `root`; or,
// with `from`, loads that checkpoint first and saves it again untrained.
void run(comm::ProcessGroup& pg, const ParallelDims& dims, const std::string& root, int steps,
         const std::string& from = "") {
  const auto mesh = dims.build_mesh(pg.shared_from_this());
  auto model = model_on(mesh, dims);
  Trainer trainer(*model, mesh, options());
  if (!from.empty()) trainer.load_checkpoint(from, pg);
  const data::TokenCorpus data = corpus();
  for (int s = 0; s < steps; ++s) {
    const auto batch = local_batch(data, 3, trainer.steps_done(), *mesh, kBatch, kSeq);
    trainer.step(batch.inputs, batch.targets);
  }
  trainer.save_checkpoint(root, pg);
}

// Every entry of a checkpoint, read whole on one rank.
std::map<std::string, std::vector<double>> read_whole(const std::string& dir) {
  const checkpoint::Metadata metadata = checkpoint::read_metadata(dir);
  checkpoint::StateDict state;
  for (const auto& [name, entry] : metadata.entries) {
    state.tensors.emplace_back(name, ops::zeros(entry.shape, entry.dtype));
  }
  checkpoint::load(state, dir);
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : state.tensors) out[name] = ops::to_vector(t);
  return out;
}

std::string fresh(const std::string& name) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  fs::remove_all(path);
  return path;
}

void expect_round_trip(const ParallelDims& a, const ParallelDims& b, const std::string& what) {
  const std::string root_a = fresh(what + "_a"), root_b = fresh(what + "_b");
  comm::testing::run_on_ranks(static_cast<int>(a.world_size()),
                              [&](comm::ProcessGroup& pg) { run(pg, a, root_a, 2); });
  const std::string saved = checkpoint::step_directory(root_a, 2);
  comm::testing::run_on_ranks(static_cast<int>(b.world_size()),
                              [&](comm::ProcessGroup& pg) { run(pg, b, root_b, 0, saved); });
  const auto want = read_whole(saved);
  const auto got = read_whole(checkpoint::step_directory(root_b, 2));
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t moments = 0;
  for (const auto& [name, values] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    EXPECT_EQ(got.at(name), values) << what << ": " << name;
    moments += name.find("/exp_avg") != std::string::npos;
  }
  EXPECT_GT(moments, 0) << what << ": the optimizer state is in the checkpoint";
}

TEST(TrainerCheckpointTest, GridToOtherLayouts) {
  const ParallelDims grid{.dp_replicate = 2, .tp = 2};
  expect_round_trip(grid, {}, "grid_to_one");
  expect_round_trip(grid, {.tp = 2}, "grid_to_tp2");
  expect_round_trip(grid, {.pp = 2}, "grid_to_pp2");
  expect_round_trip(grid, {.pp = 2, .dp_replicate = 2, .tp = 2}, "grid_to_3d");
}

TEST(TrainerCheckpointTest, OtherLayoutsToGrid) {
  const ParallelDims grid{.dp_replicate = 2, .tp = 2};
  expect_round_trip({}, grid, "one_to_grid");
  expect_round_trip({.tp = 2}, grid, "tp2_to_grid");
  expect_round_trip({.pp = 2}, grid, "pp2_to_grid");
  expect_round_trip({.pp = 2, .dp_replicate = 2, .tp = 2}, grid, "3d_to_grid");
}

TEST(TrainerCheckpointTest, FullyShardedStateToOtherLayouts) {
  expect_round_trip({.dp_shard = 4}, {}, "fsdp_to_one");
  expect_round_trip({.dp_shard = 2, .tp = 2}, {.pp = 2, .dp_replicate = 2, .tp = 2},
                    "fsdp_tp_to_3d");
}

}  // namespace
}  // namespace loom::train
