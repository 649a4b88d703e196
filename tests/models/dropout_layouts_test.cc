// Dropout on every layout draws the masks one rank draws for the whole batch: 4 AdamW steps of
// the tiny GPT with dropout 0.1 on its embeddings, residual branches and attention
// probabilities give, under data parallelism (DDP and FSDP), gradient accumulation, tensor and
// sequence parallelism, a pipeline's microbatches and activation checkpointing, the losses,
// gradient norms, gradients and parameters of one rank running the whole batch in one forward
// (tolerances: gpt_run::expect_same). Each part of a batch (a dp rank's share, a micro-batch, a
// microbatch) draws its rows' slice of the whole batch's masks, from the step's dropout call
// counts (nn/batch_part.h); before that, each drew masks of its own and none of these matched.
#include <gtest/gtest.h>

#include "comm/testing/multi_rank.h"
#include "tests/models/gpt_training_run.h"

namespace loom::models {
namespace {

using gpt_run::expect_same;
using gpt_run::Layout;
using gpt_run::mesh_of;
using gpt_run::reference;
using gpt_run::Result;
using gpt_run::train;

constexpr double kDropout = 0.1;

Layout with_dropout(Layout layout) {
  layout.dropout = kDropout;
  return layout;
}

// The reference drops: its losses are not the run's without dropout, and a rerun draws the same.
TEST(DropoutLayoutsTest, ReferenceDropsAndRepeats) {
  const Result& dropped = reference(kDropout);
  const Result& plain = reference();
  ASSERT_EQ(dropped.losses.size(), plain.losses.size());
  for (size_t step = 0; step < plain.losses.size(); ++step) {
    EXPECT_GT(std::abs(dropped.losses[step] - plain.losses[step]), 1e-4) << "step " << step;
  }
  EXPECT_EQ(train(nullptr, with_dropout({})).losses, dropped.losses);
}

TEST(DropoutLayoutsTest, GradientAccumulationWithAndWithoutCheckpointing) {
  const Result& ref = reference(kDropout);
  comm::testing::run_on_ranks(1, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 1), with_dropout({.accum = 2})),
                 .expected = ref,
                 .layout = "accum2, dropout"});
    // The recompute draws the masks its micro-batch's forward drew.
    const Layout checkpointed{
        .accum = 2,
        .activation_checkpoint = {.mode = parallel::ActivationCheckpointing::Mode::kFull}};
    expect_same({.actual = train(mesh_of(pg, 1, 1), with_dropout(checkpointed)),
                 .expected = ref,
                 .layout = "accum2 + full activation checkpointing, dropout"});
  });
}

TEST(DropoutLayoutsTest, DataParallel) {
  const Result& ref = reference(kDropout);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 1), with_dropout({})),
                 .expected = ref,
                 .layout = "dp2, dropout"});
    expect_same({.actual = train(mesh_of(pg, {.dp_shard = 2}), with_dropout({.accum = 2})),
                 .expected = ref,
                 .layout = "dp_shard2 accum2, dropout"});
  });
}

// Tensor-parallel ranks hold heads (attention dropout) and, under sequence parallelism, tokens
// (the other dropouts) of their dp rank's rows.
TEST(DropoutLayoutsTest, DataAndTensorParallel) {
  const Result& ref = reference(kDropout);
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 2), with_dropout({})),
                 .expected = ref,
                 .layout = "dp2 x tp2 (sequence parallel), dropout"});
  });
}

// Each stage's microbatch draws its rows' masks from the step's call counts, also when the
// schedule runs twice a step (gradient accumulation), when a block recomputes its forward in a
// backward that runs outside its microbatch's forward, and beside data parallelism.
TEST(DropoutLayoutsTest, PipelineMicrobatches) {
  const Result& ref = reference(kDropout);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 1, 1, 2),
                                 with_dropout({.accum = 2, .schedule = "1f1b", .microbatches = 2})),
                 .expected = ref,
                 .layout = "pp2 1f1b m2 accum2, dropout"});
    const Layout checkpointed{
        .schedule = "1f1b",
        .microbatches = 4,
        .activation_checkpoint = {.mode = parallel::ActivationCheckpointing::Mode::kFull}};
    expect_same({.actual = train(mesh_of(pg, 1, 1, 2), with_dropout(checkpointed)),
                 .expected = ref,
                 .layout = "pp2 1f1b m4 + full activation checkpointing, dropout"});
  });
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    expect_same({.actual = train(mesh_of(pg, 2, 1, 2),
                                 with_dropout({.schedule = "zb-h1", .microbatches = 2})),
                 .expected = ref,
                 .layout = "dp2 x pp2 zb-h1 m2, dropout"});
  });
}

}  // namespace
}  // namespace loom::models
