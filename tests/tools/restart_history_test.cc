// --max-restarts' decisions: the restarts it allows, and the failures that repeat where restarts
// cannot get past them (the same step, or before the first step — a checkpoint that cannot be
// loaded — kSameStepLimit times in a row).
#include "tools/loomrun/restart_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace loom::loomrun {
namespace {

using ::testing::HasSubstr;

TEST(RestartHistoryTest, RestartsUntilTheLimit) {
  RestartHistory history(2);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(history.restart_after("rank 1 (pid 7) exited with status 1", 4));
  EXPECT_TRUE(history.restart_after("rank 1 (pid 8) exited with status 1", 9));
  EXPECT_FALSE(history.restart_after("rank 1 (pid 9) exited with status 1", 12));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("restart 1 of 2: rank 1 (pid 7) exited with status 1 at step 5; "
                             "starting the job again (LOOM_RESTART_COUNT=1; a job that saves "
                             "checkpoints resumes from its latest)"));
  EXPECT_THAT(log, HasSubstr("the job failed after 2 restarts (--max-restarts 2)"));
}

TEST(RestartHistoryTest, TheSameStepThreeTimesInARowStops) {
  RestartHistory history(10);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(history.restart_after("a", 4));
  EXPECT_TRUE(history.restart_after("b", 4));
  EXPECT_FALSE(history.restart_after("c", 4));
  EXPECT_THAT(
      ::testing::internal::GetCapturedStderr(),
      HasSubstr("the job failed at step 5 3 times in a row; not restarting it again "
                "(attempt 1: a at step 5; attempt 2: b at step 5; attempt 3: c at step 5)"));
}

TEST(RestartHistoryTest, FailingBeforeTheFirstStepThreeTimesInARowStops) {
  RestartHistory history(10);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(history.restart_after("a", 6));  // then the latest checkpoint cannot be loaded
  EXPECT_TRUE(history.restart_after("b", std::nullopt));
  EXPECT_TRUE(history.restart_after("b", std::nullopt));
  EXPECT_FALSE(history.restart_after("b", std::nullopt));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("the job failed before its first step 3 times in a row"));
}

TEST(RestartHistoryTest, FailuresAtOtherStepsGoOn) {
  RestartHistory history(10);
  ::testing::internal::CaptureStderr();
  for (std::optional<long> step :
       {std::optional<long>(3), std::optional<long>(3), std::optional<long>(),
        std::optional<long>(), std::optional<long>(3), std::optional<long>(4)}) {
    EXPECT_TRUE(history.restart_after("x", step));
  }
  ::testing::internal::GetCapturedStderr();
}

}  // namespace
}  // namespace loom::loomrun
