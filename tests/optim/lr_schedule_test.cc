// WarmupCosine against values computed by hand (nanoGPT's formula), and its argument checks.
#include "optim/lr_schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "base/error.h"

namespace loom::optim {
namespace {

using ::testing::HasSubstr;

TEST(WarmupCosineTest, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
  const WarmupCosine s{.peak_lr = 1.0, .warmup_steps = 4, .total_steps = 14, .min_ratio = 0.1};
  EXPECT_DOUBLE_EQ(s(0), 0.25);
  EXPECT_DOUBLE_EQ(s(3), 1.0);
  EXPECT_DOUBLE_EQ(s(4), 1.0);  // decay starts at the peak
  EXPECT_DOUBLE_EQ(s(9),
                   0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5)));  // halfway: 0.55
  EXPECT_NEAR(s(9), 0.55, 1e-15);
  EXPECT_DOUBLE_EQ(s(14), 0.1);
  EXPECT_DOUBLE_EQ(s(100), 0.1);  // constant after total_steps
  for (int step = 4; step < 14; ++step) EXPECT_GT(s(step), s(step + 1)) << step;
}

TEST(WarmupCosineTest, NoWarmup) {
  const WarmupCosine s{.peak_lr = 2.0, .warmup_steps = 0, .total_steps = 1};
  EXPECT_DOUBLE_EQ(s(0), 2.0);
}

TEST(WarmupCosineTest, BadFieldsAreNamed) {
  auto error = [](const WarmupCosine& s, int step = 0) {
    try {
      s(step);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(error({.peak_lr = 0, .warmup_steps = 1, .total_steps = 2}),
              HasSubstr("peak_lr must be positive, got 0"));
  EXPECT_THAT(error({.peak_lr = 1, .warmup_steps = 5, .total_steps = 5}),
              HasSubstr("total_steps 5 must exceed warmup_steps 5"));
  EXPECT_THAT(error({.peak_lr = 1, .warmup_steps = 1, .total_steps = 5, .min_ratio = 2}),
              HasSubstr("min_ratio must be in [0, 1], got 2"));
  EXPECT_THAT(error({.peak_lr = 1, .warmup_steps = 1, .total_steps = 5}, -1),
              HasSubstr("step must be >= 0, got -1"));
}

}  // namespace
}  // namespace loom::optim
