// Helpers shared by the autograd tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"

namespace loom::testing {

// A leaf requiring grad with deterministic values in [low, high).
inline Tensor leaf(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Tensor t = ops::uniform(shape, seed, low, high);
  t.set_requires_grad(true);
  return t;
}

// Expects autograd::gradcheck (default tolerances) to accept `fn`'s gradients at `inputs`.
// EXPECT_TRUE(passes_gradcheck(fn, inputs)) reports the first mismatch on failure.
inline ::testing::AssertionResult passes_gradcheck(
    const std::function<Tensor(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& inputs) {
  const auto result = autograd::gradcheck(fn, inputs);
  if (result.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << result.message << " (max abs error " << result.max_abs_error << ")";
}

}  // namespace loom::testing
