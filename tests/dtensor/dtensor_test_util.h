// Shared helpers for DTensor tests: meshes over the harness's world group, integer-valued data.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "mesh/device_mesh.h"
#include "tensor/ops.h"

namespace loom::testing {

inline std::shared_ptr<const DeviceMesh> make_mesh(comm::ProcessGroup& world, std::vector<std::string> names,
                                                   std::vector<int64_t> shape) {
  return std::make_shared<const DeviceMesh>(world.shared_from_this(), std::move(names), std::move(shape));
}

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
