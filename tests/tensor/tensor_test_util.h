// Helpers shared by the tensor-layer tests (tests/tensor): error capture, small tensor
// factories, seeded random data and the GPU skip.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"
#include "tests/tensor/cuda_skip.h"
#include "tests/testing/errors.h"

namespace loom::testing {

// Tensor contents as ops::to_vector returns them.
using Values = std::vector<double>;

// Every dtype, for tests that loop over all of them.
inline constexpr DType kAllDTypes[] = {kFloat32, kBFloat16, kFloat16, kInt32, kInt64};

// 0, 1, 2, ... in `shape` (contiguous).
inline Tensor iota(const Shape& shape, DType dtype = kFloat32) {
  return ops::reshape(ops::arange(shape_numel(shape), dtype), shape);
}

// ops::from_vector, short for the literal operands the tests are full of.
inline Tensor fv(const std::vector<float>& values, const Shape& shape, DType dtype = kFloat32) {
  return ops::from_vector(values, shape, dtype);
}

// `count` floats drawn uniformly from [low, high) by a std::mt19937 seeded with `seed`.
inline std::vector<float> random_floats(std::size_t count, uint32_t seed, float low = -1.0f,
                                        float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

}  // namespace loom::testing
