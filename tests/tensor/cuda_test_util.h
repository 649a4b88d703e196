// Helpers for the CPU-vs-CUDA kernel tests: moving tensors, random inputs and the comparison with
// each dtype's stated tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::testing {

inline Tensor gpu(const Tensor& t) { return ops::to(t, Device::cuda(0)); }

// Uniform values in [low, high) of `shape`, seeded, in `dtype` (rounded from f32).
inline Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = kFloat32,
                            float low = -2.0f, float high = 2.0f) {
  return ops::from_vector(random_floats(shape_numel(shape), seed, low, high), shape, dtype);
}

// Tolerances: both devices compute in f32 and round once, so f32 results differ only by
// summation order and libm vs CUDA math (a few ulp): 1e-5 relative (1e-5 absolute near 0).
// bf16 keeps 8 bits, so one rounding step apart is 2^-8 relative: 1e-2.
struct Tolerance {
  double rtol;
  double atol;
};
inline Tolerance tolerance(DType dtype) {
  switch (dtype) {
    case kFloat32: return {1e-5, 1e-5};
    case kBFloat16: return {1e-2, 1e-2};
    case kFloat16: return {2e-3, 2e-3};
    default: return {0.0, 0.0};  // integers: exact
  }
}

// Expects `actual` (any device) to equal `expected` (CPU) in shape and dtype and in every value
// within tolerance(dtype) (scaled by `slack` for ops that sum long rows); NaNs must match NaNs.
inline void expect_close(const Tensor& expected, const Tensor& actual, const std::string& what,
                         double slack = 1.0) {
  ASSERT_EQ(shape_str(actual.shape()), shape_str(expected.shape())) << what;
  ASSERT_EQ(dtype_name(actual.dtype()), dtype_name(expected.dtype())) << what;
  const Values e = ops::to_vector(expected), a = ops::to_vector(actual);
  const Tolerance tol = tolerance(expected.dtype());
  int reported = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const bool both_nan = std::isnan(e[i]) && std::isnan(a[i]);
    const double bound = slack * (tol.atol + tol.rtol * std::abs(e[i]));
    if (!both_nan && !(std::abs(a[i] - e[i]) <= bound) && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << " on CUDA, " << e[i]
                    << " on CPU (bound " << bound << ")";
    }
  }
}

// The floating dtypes the CUDA kernels are tested in.
inline constexpr DType kKernelDTypes[] = {kFloat32, kBFloat16};

}  // namespace loom::testing
