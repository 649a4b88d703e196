// Fully sharded data parallelism in the job's composition (train/: build_parallel_model and
// Trainer) against one rank: 4 AdamW steps with clipping of the tiny GPT give the same losses,
// gradient norms and final (gathered) parameters as one rank, within the equivalence suite's
// tolerances (gpt_training_run.h), under dp_shard 2 and 4, HSDP 2x2, dp_shard 2 with gradient
// accumulation, dp_shard 2 x tp 2 and pp 2 x dp_shard 2 x tp 2. The vocabulary (257) splits
// unevenly over 2 and 4 shards (129 + 128 rows, 65 x 3 + 62), and under tp its halves again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/testing/multi_rank.h"
#include "models/gpt/pipeline.h"
#include "parallel/data_parallel.h"
#include "tests/models/gpt_training_run.h"
#include "tests/testing/errors.h"
#include "train/parallel_dims.h"

namespace loom::models {
namespace {

using gpt_run::expect_same;
using gpt_run::mesh_of;
using gpt_run::reference;
using gpt_run::Result;
using gpt_run::train;

TEST(GPTFsdpEquivalenceTest, FullyShardedOverTwoAndFour) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const Result run = train(mesh_of(pg, {.dp_shard = 2}));
    expect_same({.actual = run, .expected = ref, .layout = "dp_shard2"});
    // Every parameter is a Shard(0) DTensor between steps (the embeddings, norms and head of the
    // root unit as well as each block's).
    for (const auto& [name, layout] : run.layouts) {
      EXPECT_EQ(layout, "DeviceMesh(dp_shard=2, cpu) [S(0)]") << name;
    }
  });
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    expect_same(
        {.actual = train(mesh_of(pg, {.dp_shard = 4})), .expected = ref, .layout = "dp_shard4"});
  });
}

TEST(GPTFsdpEquivalenceTest, FullyShardedWithGradientAccumulation) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, {.dp_shard = 2}), {.accum = 2}),
                 .expected = ref,
                 .layout = "dp_shard2 accum2"});
  });
}

TEST(GPTFsdpEquivalenceTest, Hsdp) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    const Result run = train(mesh_of(pg, {.dp_replicate = 2, .dp_shard = 2}));
    expect_same({.actual = run, .expected = ref, .layout = "dp_replicate2 x dp_shard2"});
    EXPECT_EQ(run.layouts.at("h.0.mlp.c_fc.weight"),
              "DeviceMesh(dp_replicate=2, dp_shard=2, cpu) [R, S(0)]");
  });
}

TEST(GPTFsdpEquivalenceTest, FullyShardedAndTensorParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    const Result run = train(mesh_of(pg, {.dp_shard = 2, .tp = 2}));
    expect_same({.actual = run, .expected = ref, .layout = "dp_shard2 x tp2 (sequence parallel)"});
    // 2-D parameters: the TP placement, then Shard(0) over dp_shard on the (tp, dp_shard) mesh
    // (placements apply in mesh-dim order: the TP shard's rows split again).
    EXPECT_EQ(run.layouts.at("h.0.mlp.c_fc.weight"),
              "DeviceMesh(tp=2, dp_shard=2, cpu) [S(0), S(0)]");
    EXPECT_EQ(run.layouts.at("h.0.mlp.c_proj.weight"),
              "DeviceMesh(tp=2, dp_shard=2, cpu) [S(1), S(0)]");
    EXPECT_EQ(run.layouts.at("ln_f.weight"), "DeviceMesh(tp=2, dp_shard=2, cpu) [R, S(0)]");
  });
}

TEST(GPTFsdpEquivalenceTest, PipelineFullyShardedAndTensorParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(8, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, {.pp = 2, .dp_shard = 2, .tp = 2}),
                                 {.schedule = "1f1b", .microbatches = 2}),
                 .expected = ref,
                 .layout = "pp2 x dp_shard2 x tp2"});
  });
}

// The composition takes its meshes by role from ParallelDims: a mesh without the job's dims is
// named with the dims it has, and data parallelism without its meshes says where they come from.
TEST(GPTFsdpEquivalenceTest, AMeshWithoutTheDataParallelDimsIsNamed) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"dp_shard"}, std::vector<int64_t>{2});
    EXPECT_THAT(loom::testing::error_of([&] { train::ParallelDims::meshes(mesh); }),
                ::testing::HasSubstr("no dim named 'pp' in DeviceMesh(dp_shard=2, cpu); its dims "
                                     "are [dp_shard]"));
    auto gpt = std::make_shared<GPT>(
        GPTConfig{.n_layer = 1, .n_head = 1, .n_embd = 4, .block_size = 4, .vocab_size = 8}, 1);
    EXPECT_THAT(loom::testing::error_of([&] {
                  parallel::DataParallel(gpt, gpt_blocks(*gpt), {.mesh = mesh}, std::nullopt);
                }),
                ::testing::HasSubstr("train::ParallelDims::meshes"));
  });
}

}  // namespace
}  // namespace loom::models
