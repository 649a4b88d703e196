// The op timer's bookkeeping (base/profiler.h): calls, self and total times of nested scopes, a
// scope nested in one of the same name counted once, nothing recorded while disabled, the table,
// and LOOM_PROFILE's values.
#include "base/profiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/error.h"

namespace loom::profiler {
namespace {

using ::testing::HasSubstr;

const Entry* find(const std::vector<Entry>& all, const std::string& name) {
  for (const Entry& e : all) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override {
    disable();
    reset();
  }
};

TEST_F(ProfilerTest, NothingIsRecordedWhileDisabled) {
  { Scope s("outer"); }
  EXPECT_TRUE(entries().empty());
}

TEST_F(ProfilerTest, SelfTimeExcludesNestedScopesAndTotalIncludesThem) {
  enable();
  for (int i = 0; i < 2; ++i) {
    Scope outer("outer");
    sleep_ms(5);
    {
      Scope inner("inner");
      sleep_ms(20);
    }
  }
  const auto all = entries();
  const Entry* outer = find(all, "outer");
  const Entry* inner = find(all, "inner");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(outer->calls, 2);
  EXPECT_EQ(inner->calls, 2);
  EXPECT_GE(inner->self_s, 0.040);
  EXPECT_DOUBLE_EQ(inner->self_s, inner->total_s);  // nothing nested in it
  EXPECT_GE(outer->self_s, 0.010);
  EXPECT_LT(outer->self_s, inner->self_s) << "the inner scope's time is not the outer's own";
  EXPECT_NEAR(outer->total_s, outer->self_s + inner->total_s, 1e-9);
  EXPECT_EQ(all.front().name, "inner") << "largest self time first";
}

TEST_F(ProfilerTest, AScopeInsideOneOfTheSameNameCountsOnce) {
  enable();
  {
    Scope outer("add");
    sleep_ms(2);
    Scope again("add");  // e.g. autograd recording add, then running it below autograd
    sleep_ms(10);
  }
  const Entry* add = find(entries(), "add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->calls, 1);
  EXPECT_NEAR(add->self_s, add->total_s, 1e-9) << "self times of the pair sum to the total";
  EXPECT_GE(add->total_s, 0.012);
}

TEST_F(ProfilerTest, TableListsTheEntriesAndTheRest) {
  enable();
  { Scope a("first"); }
  { Scope b("second"); }
  { Scope c("third"); }
  const std::string two = table(2);
  EXPECT_THAT(two, HasSubstr("self ms"));
  EXPECT_THAT(two, HasSubstr("(the rest)"));
  EXPECT_THAT(two, HasSubstr("(self times summed)"));
  EXPECT_THAT(table(), ::testing::Not(HasSubstr("(the rest)")));
}

TEST_F(ProfilerTest, EnvironmentValues) {
  ::unsetenv("LOOM_PROFILE");
  EXPECT_FALSE(enable_from_environment());
  EXPECT_FALSE(enabled());
  ::setenv("LOOM_PROFILE", "ops,sync", 1);
  EXPECT_TRUE(enable_from_environment());
  EXPECT_TRUE(enabled());
  EXPECT_TRUE(options().synchronize);
  EXPECT_FALSE(options().by_shape);
  ::setenv("LOOM_PROFILE", "ops,shapes", 1);
  EXPECT_TRUE(environment_options().by_shape);
  EXPECT_FALSE(environment_options().synchronize);
  ::setenv("LOOM_PROFILE", "ops,everything", 1);
  try {
    environment_options();
    ADD_FAILURE() << "an unknown value must throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("LOOM_PROFILE='ops,everything'"));
    EXPECT_THAT(e.what(), HasSubstr("'everything' is not a profiler setting"));
  }
  ::unsetenv("LOOM_PROFILE");
}

}  // namespace
}  // namespace loom::profiler
