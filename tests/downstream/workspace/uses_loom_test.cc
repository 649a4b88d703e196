// Compiled in a workspace that is not Loom: proves @loom's headers, include paths and
// dependencies (fmt through loom_dependencies()) resolve from outside.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"

namespace {

TEST(DownstreamTest, LoomCheckThrowsLoomErrorWithMessage) {
  const int dims = 3;
  try {
    LOOM_CHECK(dims == 2, "downstream: got {} dims, expected {}", dims, 2);
    FAIL() << "LOOM_CHECK did not throw";
  } catch (const loom::Error& error) {
    EXPECT_EQ(std::string(error.what()), "downstream: got 3 dims, expected 2");
  }
}

}  // namespace
