// Pipelined training steps against the same model on one rank: every schedule (GPipe, 1F1B,
// interleaved 1F1B with v = 2, ZB-H1, and the V schedules ZBV and DualPipeV), pp 2 and 4,
// microbatches 1, 2, 4, 6 and 8 (interleaved in rounds of r = m / max(1, m / p), r < p and r > p
// included), give the same loss and the same gradients; DualPipeV with fewer than 2p raises
// naming the numbers.
#include "parallel/pipeline/executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "comm/testing/multi_rank.h"
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
using testing::Reference;
using testing::reference_step;

constexpr int64_t kBatch = 24;  // splits into every microbatch count below

enum class Kind { kGPipe, kOneFOneB, kInterleaved, kZeroBubbleH1, kZBV, kDualPipeV };
constexpr int kInterleavedStagesPerRank = 2;

Schedule make_schedule(Kind kind, int p, int m) {
  switch (kind) {
    case Kind::kGPipe:
      return gpipe_schedule(p, m);
    case Kind::kOneFOneB:
      return one_f_one_b_schedule(p, m);
    case Kind::kInterleaved:
      return interleaved_one_f_one_b_schedule(p, m, kInterleavedStagesPerRank);
    case Kind::kZeroBubbleH1:
      return zb_h1_schedule(p, m);
    case Kind::kZBV:
      return zbv_schedule(p, m);
    case Kind::kDualPipeV:
      return dualpipev_schedule(p, m);
  }
  return {};
}

struct Case {
  Kind kind;
  int p;
  int m;
};

std::string case_name(const Case& c) {
  const char* kind = c.kind == Kind::kGPipe          ? "GPipe"
                     : c.kind == Kind::kOneFOneB     ? "OneFOneB"
                     : c.kind == Kind::kInterleaved  ? "Interleaved"
                     : c.kind == Kind::kZeroBubbleH1 ? "ZeroBubbleH1"
                     : c.kind == Kind::kZBV          ? "ZBV"
                                                     : "DualPipeV";
  return fmt::format("{}_pp{}_mb{}", kind, c.p, c.m);
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class PipelineEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEquivalenceTest, LossAndGradientsEqualOneRank) {
  const auto [kind, p, m] = GetParam();
  if (kind == Kind::kDualPipeV && m < 2 * p) {
    EXPECT_THAT([&] { make_schedule(kind, p, m); },
                ::testing::ThrowsMessage<Error>(HasSubstr(fmt::format(
                    "got {} microbatches for {} ranks; DualPipeV's main phase needs at least 2 x "
                    "{} = {}",
                    m, p, p, 2 * p))));
    return;
  }
  const Schedule schedule = make_schedule(kind, p, m);
  // Two steps on different batches: the second checks that a step leaves nothing behind
  // (messages, shape metadata, saved activations), that zeroed gradients start afresh, and that
  // activations may change shape between steps (twice the rows: new metadata per boundary).
  const Tensor inputs[2] = {ops::uniform({kBatch, kWidth}, 1, -1.0, 1.0),
                            ops::uniform({2 * kBatch, kWidth}, 2, -1.0, 1.0)};
  const Tensor targets[2] = {ops::uniform({kBatch, kWidth}, 3, -0.5, 0.5),
                             ops::uniform({2 * kBatch, kWidth}, 4, -0.5, 0.5)};
  const Reference first = reference_step(inputs[0], targets[0]);
  const Reference second = reference_step(inputs[1], targets[1]);
  comm::testing::run_on_ranks(p, [&](comm::ProcessGroup& pg) {
    const auto stages = build_stages(schedule, pg.rank(), [&](auto module, int s) {
      return std::make_shared<PipelineStage>(module, s, schedule.num_stages, pg.shared_from_this(),
                                             StageOptions{.placement = schedule.placement});
    });
    PipelineExecutor executor(schedule, stages, mse_loss);
    for (int i = 0; i < 2; ++i) {
      SCOPED_TRACE(fmt::format("step {}", i));
      expect_step_matches(executor, stages, pg.rank(), inputs[i], targets[i],
                          i == 0 ? first : second);
    }
  });
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Kind kind : {Kind::kGPipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZeroBubbleH1,
                    Kind::kZBV, Kind::kDualPipeV})
    for (int p : {2, 4})
      for (int m : {1, 2, 4, 6, 8}) cases.push_back({kind, p, m});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineEquivalenceTest, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace loom::pipeline
