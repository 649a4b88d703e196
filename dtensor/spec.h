// DTensorSpec: what a DTensor is — a mesh, one placement per mesh dim, and the global (logical)
// shape and dtype. Everything about local shards is derived from it here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtensor/placement.h"
#include "mesh/device_mesh.h"
#include "tensor/tensor.h"

namespace loom {

struct DTensorSpec {
  std::shared_ptr<const DeviceMesh> mesh;
  Placements placements;  // one per mesh dim, Shard dims normalized to [0, ndim)
  Shape shape;            // global shape
  DType dtype = kFloat32;

  // Checks the invariants and throws naming mesh, placements and shape:
  // one placement per mesh dim, Shard dims in range.
  void validate(std::string_view op) const;

  // This rank's local shard: shape and offset (first global index) along each tensor dim. A
  // tensor dim sharded by several mesh dims is split in mesh-dim order (nested).
  Shape local_shape() const;
  Shape local_offset() const;
  // local == local_shape(), without building it.
  bool has_local_shape(const Shape& local) const;
  // Same, for any coordinate of the mesh (for planning and tests).
  Shape local_shape_at(const std::vector<int64_t>& coordinate) const;
  // Dim `dim` of local_shape_at(coordinate), without building the shape.
  int64_t local_size_at(size_t dim, const std::vector<int64_t>& coordinate) const;
  Shape local_offset_at(const std::vector<int64_t>& coordinate) const;

  bool has_partial() const;
  bool is_replicated() const;  // every placement Replicate
  // "DTensorSpec(DeviceMesh(dp=2, tp=2, cpu), [S(0), R], shape=(8, 4), f32)"
  std::string str() const;
  bool operator==(const DTensorSpec& other) const;
};

// Normalizes placements against a tensor rank and checks them for `mesh`:
// "distribute_tensor: got 1 placement [S(0)] for DeviceMesh(dp=2, tp=4) with 2 dims; pass one
// placement per mesh dim".
Placements normalize_placements(const Placements& placements, const DeviceMesh& mesh,
                                int64_t tensor_ndim, std::string_view op);

}  // namespace loom
