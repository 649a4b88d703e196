// PipelineStage and PipelineExecutor beyond the schedule matrix: stages on a DeviceMesh slice,
// the wrap/unwrap hooks (where tensor parallelism plugs in), stages handing over locally on one
// rank, and the errors for misassembled pipelines and bad batches.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "mesh/device_mesh.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedules.h"
#include "tensor/ops.h"
#include "tests/parallel/pipeline/pipeline_testing.h"

namespace loom::pipeline {
namespace {

using testing::build_stages;
using testing::expect_step_matches;
using ::testing::HasSubstr;
using testing::kWidth;
using testing::mse_loss;
using ::testing::ThrowsMessage;

const Tensor& batch() {
  static const Tensor inputs = ops::uniform({8, kWidth}, 11, -1.0, 1.0);
  return inputs;
}
const Tensor& targets() {
  static const Tensor t = ops::uniform({8, kWidth}, 12, -0.5, 0.5);
  return t;
}
const testing::Reference& reference() {
  static const testing::Reference ref = testing::reference_step(batch(), targets());
  return ref;
}

TEST(PipelineStageTest, StagesOnAMeshSliceMatchOneRank) {
  reference();  // computed before the rank threads start
  const Schedule schedule = one_f_one_b_schedule(2, 4);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const DeviceMesh mesh(pg.shared_from_this(), {"dp", "pp"}, {1, 2});
    const DeviceMesh pp = mesh["pp"];
    const auto stages =
        build_stages(schedule, static_cast<int>(pp.coordinate(0)), [&](auto module, int s) {
          return std::make_shared<PipelineStage>(module, s, schedule.num_stages, pp);
        });
    PipelineExecutor executor(schedule, stages, mse_loss);
    expect_step_matches(executor, stages, static_cast<int>(pp.coordinate(0)), batch(), targets(),
                        reference());
  });
}

TEST(PipelineStageTest, WrapAndUnwrapHooksSeeEveryBoundaryTensor) {
  reference();
  // unwrap halves what is sent and wrap doubles what is received: the model's function (and
  // gradients) are unchanged exactly (powers of two), so the hooks must run on every boundary,
  // in forward and, through autograd, in backward.
  const Schedule schedule = interleaved_one_f_one_b_schedule(2, 2, 2);
  std::atomic<int> wraps = 0, unwraps = 0;
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const StageOptions options{.wrap_input =
                                   [&](const Tensor& t) {
                                     ++wraps;
                                     return mul(t, 2.0);
                                   },
                               .unwrap_output =
                                   [&](const Tensor& t) {
                                     ++unwraps;
                                     return mul(t, 0.5);
                                   }};
    const auto stages = build_stages(schedule, pg.rank(), [&](auto module, int s) {
      return std::make_shared<PipelineStage>(module, s, schedule.num_stages, pg.shared_from_this(),
                                             options);
    });
    PipelineExecutor executor(schedule, stages, mse_loss);
    expect_step_matches(executor, stages, pg.rank(), batch(), targets(), reference());
  });
  // 4 stages x 2 microbatches: all but the first wrap what they receive; all but the last
  // unwrap what they send.
  EXPECT_EQ(wraps, 6);
  EXPECT_EQ(unwraps, 6);
}

TEST(PipelineStageTest, StagesOnOneRankHandOverLocally) {
  reference();
  for (const Schedule& schedule :
       {interleaved_one_f_one_b_schedule(1, 4, 2), gpipe_schedule(1, 2)}) {
    SCOPED_TRACE(schedule.name);
    comm::testing::run_on_ranks(1, [&](comm::ProcessGroup& pg) {
      const auto stages = build_stages(schedule, 0, [&](auto module, int s) {
        return std::make_shared<PipelineStage>(module, s, schedule.num_stages,
                                               pg.shared_from_this());
      });
      PipelineExecutor executor(schedule, stages, mse_loss);
      expect_step_matches(executor, stages, 0, batch(), targets(), reference());
      EXPECT_EQ(pg.counters().calls_of(comm::CollectiveKind::kSend), 0);
    });
  }
}

TEST(PipelineStageTest, MisassembledPipelinesAreNamed) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    auto group = pg.shared_from_this();
    auto module = testing::build_layers({0, 1});
    EXPECT_THAT([&] { PipelineStage(module, 1 - pg.rank(), 2, group); },
                ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "stage {} belongs on pp rank {} (loop placement: stage s on rank s % 2), but "
                    "this is pp rank {}",
                    1 - pg.rank(), 1 - pg.rank(), pg.rank()))));
    EXPECT_THAT([&] { PipelineStage(module, 2, 2, group); },
                ThrowsMessage<Error>(HasSubstr("stage index 2 is not in [0, 2)")));
    auto mine = std::make_shared<PipelineStage>(module, pg.rank(), 4, group);
    EXPECT_THAT(
        [&] { PipelineExecutor(interleaved_one_f_one_b_schedule(2, 2, 2), {mine}, mse_loss); },
        ThrowsMessage<Error>(HasSubstr(fmt::format(
            "pp rank {} must hold stages [{}, {}] under schedule 'Interleaved1F1B' (stage s "
            "on rank s % 2), got stages [{}]",
            pg.rank(), pg.rank(), pg.rank() + 2, pg.rank()))));
    EXPECT_THAT([&] { PipelineExecutor(one_f_one_b_schedule(2, 2), {mine}, mse_loss); },
                ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "stage {} was built for 4 stages but schedule '1F1B' has 2", pg.rank()))));
    // Stages built for the loop placement under a V schedule: named, with the fix.
    EXPECT_THAT([&] { PipelineExecutor(zbv_schedule(2, 4), {mine}, mse_loss); },
                ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "stage {} was built for the loop placement but schedule 'ZBV' places its "
                    "stages in the v placement (stage s on rank s for s < 2 and on rank 3 - s "
                    "after (a V)); build the stages with StageOptions::placement = the schedule's",
                    pg.rank()))));
    EXPECT_THAT(
        [&] { PipelineStage(module, 2 + pg.rank(), 4, group, {.placement = StagePlacement::kV}); },
        ThrowsMessage<Error>(HasSubstr(fmt::format(
            "stage {} belongs on pp rank {} (v placement: stage s on rank s for s < 2 and "
            "on rank 3 - s after (a V)), but this is pp rank {}",
            2 + pg.rank(), 1 - pg.rank(), pg.rank()))));
    EXPECT_THAT([&] { PipelineExecutor(one_f_one_b_schedule(4, 2), {mine}, mse_loss); },
                ThrowsMessage<Error>(
                    HasSubstr("schedule '1F1B' is for 4 ranks but the pp group 'default' has 2")));
    // The batch check runs on both ends before any message: both fail, nobody waits.
    auto stage = std::make_shared<PipelineStage>(module, pg.rank(), 2, group);
    PipelineExecutor executor(one_f_one_b_schedule(2, 4), {stage}, mse_loss);
    const Tensor six_rows = ops::zeros({6, kWidth});
    EXPECT_THAT([&] { executor.step(six_rows, six_rows); },
                ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "the {} have 6 rows along dim 0, which do not split into 4 equal microbatches",
                    pg.rank() == 0 ? "inputs" : "targets"))));
  });
}

TEST(PipelineStageTest, BadLossAndMissingInputsAreNamed) {
  comm::testing::run_on_ranks(1, [&](comm::ProcessGroup& pg) {
    auto stage =
        std::make_shared<PipelineStage>(testing::build_layers({0, 1}), 0, 1, pg.shared_from_this());
    PipelineExecutor executor(gpipe_schedule(1, 2), {stage},
                              [](const Tensor& output, const Tensor&) { return output; });
    EXPECT_THAT([&] { executor.step(batch(), targets()); },
                ThrowsMessage<Error>(HasSubstr(
                    "pp rank 0 action 0 F mb 0 stage 0 failed: the loss function returned "
                    "Tensor(shape=(4, 16)")));
    EXPECT_THAT([&] { executor.step(Tensor(), targets()); },
                ThrowsMessage<Error>(HasSubstr(
                    "pp rank 0 holds the first stage and needs the inputs (a tensor with a batch "
                    "dim), got an undefined tensor")));
  });
}

}  // namespace
}  // namespace loom::pipeline
