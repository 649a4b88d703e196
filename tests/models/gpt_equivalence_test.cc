// The whole training step against one rank: 4 AdamW steps (gradient norm clipped) of a tiny GPT
// under dp2, tp2 (with and without sequence parallelism), dp2 x tp2, gradient accumulation, pp2
// and dp2 x tp2 x pp2 give the same losses, gradient norms and final parameters as one rank on
// the same global batches, within 1e-5 relative (f32:
// sharded GEMMs and all-reduces sum in another order). The vocabulary is odd (257, as GPT-2's
// 50257), so the vocab-parallel embedding and the loss-parallel head split it unevenly.
#include <gtest/gtest.h>

#include "comm/testing/multi_rank.h"
#include "tests/models/gpt_training_run.h"

namespace loom::models {
namespace {

using gpt_run::expect_same;
using gpt_run::kClip;
using gpt_run::Layout;
using gpt_run::mesh_of;
using gpt_run::reference;
using gpt_run::Result;
using gpt_run::train;

TEST(GPTEquivalenceTest, ReferenceLearns) {
  EXPECT_LT(reference().losses.back(), reference().losses.front());
  EXPECT_GT(reference().grad_norms.front(), kClip)
      << "the clip must act for the norm checks to mean something";
}

TEST(GPTEquivalenceTest, GradientAccumulationOnOneRank) {
  comm::testing::run_on_ranks(1, [](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 1), {.accum = 2}),
                 .expected = reference(),
                 .layout = "accum2"});
  });
}

TEST(GPTEquivalenceTest, DataParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 1)), .expected = ref, .layout = "dp2"});
  });
}

TEST(GPTEquivalenceTest, DataParallelWithGradientAccumulation) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 1), {.accum = 2}),
                 .expected = ref,
                 .layout = "dp2 accum2"});
  });
}

TEST(GPTEquivalenceTest, TensorParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 2), {.plan = {.sequence_parallel = false}}),
                 .expected = ref,
                 .layout = "tp2"});
  });
}

TEST(GPTEquivalenceTest, TensorParallelWithSequenceParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 2), {.plan = {.sequence_parallel = true}}),
                 .expected = ref,
                 .layout = "tp2 + sequence parallel"});
  });
}

TEST(GPTEquivalenceTest, DataAndTensorParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 2)),
                 .expected = ref,
                 .layout = "dp2 x tp2 (sequence parallel)"});
  });
}

TEST(GPTEquivalenceTest, PipelineParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 1, 2), {.schedule = "1f1b", .microbatches = 4}),
                 .expected = ref,
                 .layout = "pp2 1f1b m4"});
  });
}

// The mission's composition: DDP on dp, TP (sequence parallel) on tp, 1F1B stages on pp, on 8
// ranks; gradient-norm clipping and the reported loss are global across all three dims.
TEST(GPTEquivalenceTest, DataTensorAndPipelineParallel) {
  const Result& ref = reference();
  comm::testing::run_on_ranks(8, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 2, 2), {.schedule = "1f1b", .microbatches = 2}),
                 .expected = ref,
                 .layout = "dp2 x tp2 x pp2"});
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
    auto reversed = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(),
        std::vector<std::string>{"pp", "dp_replicate", "dp_shard", "cp", "tp"},
        std::vector<int64_t>{1, 2, 1, 1, 2}, std::vector<int>{3, 2, 1, 0});
    const Result other_order = train(reversed);
    EXPECT_EQ(again.losses, first.losses) << "rerun";
    EXPECT_EQ(other_order.losses, first.losses) << "ranks in reverse order";
    EXPECT_TRUE(again.params == first.params) << "rerun parameters differ";
    EXPECT_TRUE(other_order.params == first.params) << "reverse-order parameters differ";
  });
}

}  // namespace
}  // namespace loom::models
