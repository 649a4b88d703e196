// DTensor factories (torch.distributed.tensor.zeros/ones/full/randn/rand). Random ones use the
// counter-based RNG keyed by each element's *global* index, so every shard equals the same
// slice of the single-rank tensor bit for bit, whatever the mesh and placements. No
// communication.
#pragma once

#include <memory>

#include "dtensor/placement.h"
#include "mesh/device_mesh.h"
#include "tensor/tensor.h"

namespace loom {

Tensor dtensor_full(const Shape& shape, double value, std::shared_ptr<const DeviceMesh> mesh,
                    Placements placements, DType dtype = kFloat32);
Tensor dtensor_zeros(const Shape& shape, std::shared_ptr<const DeviceMesh> mesh,
                     Placements placements, DType dtype = kFloat32);
// Element i ~ N(mean, std) from (seed, i) — equal to ops::normal(shape, seed, mean, std).
Tensor dtensor_normal(const Shape& shape, uint64_t seed, double mean, double std,
                      std::shared_ptr<const DeviceMesh> mesh, Placements placements,
                      DType dtype = kFloat32);
// Element i ~ U[low, high) from (seed, i) — equal to ops::uniform(shape, seed, low, high).
Tensor dtensor_uniform(const Shape& shape, uint64_t seed, double low, double high,
                       std::shared_ptr<const DeviceMesh> mesh, Placements placements,
                       DType dtype = kFloat32);

}  // namespace loom
