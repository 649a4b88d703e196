#include "base/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace loom {
namespace {

using ::testing::HasSubstr;

TEST(ErrorTest, CheckThrowsErrorWithFormattedMessage) {
  const int given = 3;
  try {
    LOOM_CHECK(given == 5, "op: got {} dims, expected {}", given, 5);
    FAIL() << "LOOM_CHECK did not throw";
  } catch (const InternalError&) {
    FAIL() << "a user check must not throw InternalError";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), "op: got 3 dims, expected 5");
  }
}

TEST(ErrorTest, CheckPassesWithoutEvaluatingMessage) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  LOOM_CHECK(true, "never {}", count());
  EXPECT_EQ(evaluated, 0);
}

TEST(ErrorTest, InternalAssertNamesConditionAndLocation) {
  try {
    LOOM_INTERNAL_ASSERT(1 + 1 == 3, "math is {}", "broken");
    FAIL() << "LOOM_INTERNAL_ASSERT did not throw";
  } catch (const InternalError& error) {
    EXPECT_THAT(error.what(), HasSubstr("`1 + 1 == 3` failed: math is broken"));
    EXPECT_THAT(error.what(), HasSubstr("error_test.cc"));
  }
}

}  // namespace
}  // namespace loom
