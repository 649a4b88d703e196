// Helpers shared by the autograd tests.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "tensor/ops.h"

namespace loom::testing {

// A leaf requiring grad with deterministic values in [low, high).
inline Tensor leaf(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Tensor t = ops::uniform(shape, seed, low, high);
  t.set_requires_grad(true);
  return t;
}

inline void expect_values_near(const Tensor& actual, const std::vector<double>& expected,
                               double tolerance) {
  const std::vector<double> values = ops::to_vector(actual);
  ASSERT_EQ(values.size(), expected.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_NEAR(values[i], expected[i], tolerance) << "at element " << i;
  }
}

}  // namespace loom::testing
