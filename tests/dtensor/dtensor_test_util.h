// Shared helpers for DTensor tests: meshes over the harness's world group (make_mesh, from
// tests/mesh), integer-valued data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tensor/ops.h"
#include "tests/mesh/mesh_test_util.h"

namespace loom::testing {

// A deterministic full tensor with small integer values, so sums and averages over ranks are
// exact in f32 and comparisons can be bit for bit.
inline Tensor integer_tensor(const Shape& shape, uint64_t seed) {
  Tensor u = ops::uniform(shape, seed, -8.0, 8.0);
  std::vector<double> values = ops::to_vector(u);
  std::vector<float> rounded;
  for (double v : values) rounded.push_back(static_cast<float>(static_cast<int>(v)));
  return ops::from_vector(rounded, shape);
}

}  // namespace loom::testing
