// Helpers for the CPU-vs-CUDA kernel tests: moving tensors, random inputs and each dtype's
// tolerance.
#pragma once

#include <gtest/gtest.h>

#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom::testing {

inline Tensor gpu(const Tensor& t) { return ops::to(t, Device::cuda(0)); }

// Uniform values in [low, high) of `shape`, seeded, in `dtype` (rounded from f32).
inline Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = kFloat32,
                            float low = -2.0f, float high = 2.0f) {
  return ops::from_vector(random_floats(shape_numel(shape), seed, low, high), shape, dtype);
}

// The tolerance of a CUDA result against the CPU's, by the result's dtype (value checks:
// tests/testing/tensor_checks.h, |actual - expected| <= atol + rtol * |expected|; NaN must match
// NaN): both devices compute in f32 and round once, so f32 results differ only by summation order
// and libm vs CUDA math (a few ulp): 1e-5 relative (1e-5 absolute near 0). bf16 keeps 8 bits, so
// one rounding step apart is 2^-8 relative: 1e-2. Integers: exact. `slack` scales both for ops
// that sum long rows.
inline Tolerance kernel_tolerance(DType dtype, double slack = 1.0) {
  double tol = 0;
  switch (dtype) {
    case kFloat32:
      tol = 1e-5;
      break;
    case kBFloat16:
      tol = 1e-2;
      break;
    case kFloat16:
      tol = 2e-3;
      break;
    default:
      break;  // integers: exact
  }
  return {.rtol = slack * tol, .atol = slack * tol, .equal_nan = true};
}

// The floating dtypes the CUDA kernels are tested in.
inline constexpr DType kKernelDTypes[] = {kFloat32, kBFloat16};

}  // namespace loom::testing
