#include "dtensor/factories.h"

#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"
#include "tensor/rng.h"

namespace loom {

namespace {

// A DTensor whose shard is filled by `fill(local, region)`; Partial mesh dims hold the value
// on their coordinate 0 (sum) or everywhere (avg/max/min), like replicate_to_partial.
template <typename Fill>
Tensor make_filled(const Shape& shape, std::shared_ptr<const DeviceMesh> mesh,
                   Placements placements, DType dtype, std::string_view op, Fill&& fill) {
  LOOM_CHECK(mesh != nullptr, "{}: the mesh is null", op);
  placements = normalize_placements(placements, *mesh, static_cast<int64_t>(shape.size()), op);
  DTensorSpec spec{mesh, placements, shape, dtype};
  Tensor local = ops::empty(spec.local_shape(), dtype, mesh->device());
  fill(local, RngRegion{shape, spec.local_offset()});
  for (size_t md = 0; md < placements.size(); ++md) {
    if (placements[md].is_partial() && placements[md].reduce_op() == comm::ReduceOp::kSum &&
        mesh->coordinate(static_cast<int64_t>(md)) != 0) {
      local = ops::zeros_like(local);
    }
  }
  return make_dtensor(local, std::move(spec));
}

}  // namespace

Tensor dtensor_full(const Shape& shape, double value, std::shared_ptr<const DeviceMesh> mesh,
                    Placements placements, DType dtype) {
  return make_filled(shape, std::move(mesh), std::move(placements), dtype, "dtensor_full",
                     [value](const Tensor& local, const RngRegion&) { ops::fill_(local, value); });
}

Tensor dtensor_zeros(const Shape& shape, std::shared_ptr<const DeviceMesh> mesh,
                     Placements placements, DType dtype) {
  return dtensor_full(shape, 0.0, std::move(mesh), std::move(placements), dtype);
}

Tensor dtensor_normal(const Shape& shape, uint64_t seed, double mean, double std,
                      std::shared_ptr<const DeviceMesh> mesh, Placements placements, DType dtype) {
  return make_filled(shape, std::move(mesh), std::move(placements), dtype, "dtensor_normal",
                     [&](const Tensor& local, const RngRegion& region) {
                       ops::normal_(local, seed, mean, std, region);
                     });
}

Tensor dtensor_uniform(const Shape& shape, uint64_t seed, double low, double high,
                       std::shared_ptr<const DeviceMesh> mesh, Placements placements, DType dtype) {
  return make_filled(shape, std::move(mesh), std::move(placements), dtype, "dtensor_uniform",
                     [&](const Tensor& local, const RngRegion& region) {
                       ops::uniform_(local, seed, low, high, region);
                     });
}

}  // namespace loom
