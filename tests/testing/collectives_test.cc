// expect_collectives against a CommDebugMode (here one that saw nothing: the failure path and
// the message; the multi-rank suites exercise the counting).
#include "tests/testing/collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

namespace loom::testing {
namespace {

TEST(CollectivesTest, NamesEveryKindItExpects) {
  EXPECT_EQ(collectives_str({}), "none");
  EXPECT_EQ(collectives_str({.all_reduce = 2, .all_to_all = 1}), "2 all_reduce, 1 all_to_all");
  EXPECT_EQ((Collectives{.all_gather = 1}).total(), 1);
}

TEST(CollectivesTest, FailsWithWhatWasExpectedAndWhatWasIssued) {
  CommDebugMode comm;
  expect_collectives(comm, {}, "nothing");
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    expect_collectives(comm, {.all_gather = 1}, "forward");
  }
  ASSERT_EQ(results.size(), 1);
  EXPECT_THAT(results.GetTestPartResult(0).message(),
              ::testing::HasSubstr("forward: expected 1 all_gather, issued none"));
}

}  // namespace
}  // namespace loom::testing
