#include "dtensor/spec.h"

#include <fmt/format.h>

#include "base/error.h"
#include "dtensor/shard_math.h"

namespace loom {

Placements normalize_placements(const Placements& placements, const DeviceMesh& mesh,
                                int64_t tensor_ndim, std::string_view op) {
  LOOM_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(),
             "{}: got {} placement{} {} for {} with {} dims; pass one placement per mesh dim", op,
             placements.size(), placements.size() == 1 ? "" : "s", placements_str(placements),
             mesh.str(), mesh.ndim());
  Placements out;
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    if (p.is_shard()) {
      LOOM_CHECK(p.dim() >= -tensor_ndim && p.dim() < tensor_ndim,
                 "{}: placement {} on mesh dim {} ('{}') shards dim {} of a tensor with {} dims",
                 op, p.str(), i, mesh.dim_names()[i], p.dim(), tensor_ndim);
    }
    out.push_back(p.normalized(tensor_ndim));
  }
  return out;
}

void DTensorSpec::validate(std::string_view op) const {
  LOOM_CHECK(mesh != nullptr, "{}: DTensorSpec has no mesh", op);
  (void)normalize_placements(placements, *mesh, static_cast<int64_t>(shape.size()), op);
}

Shape DTensorSpec::local_shape_at(const std::vector<int64_t>& coordinate) const {
  Shape local = shape;
  for (size_t md = 0; md < placements.size(); ++md) {
    const Placement& p = placements[md];
    if (!p.is_shard()) continue;
    local[p.dim()] = shard_range(local[p.dim()], mesh->size(md), coordinate[md]).size;
  }
  return local;
}

Shape DTensorSpec::local_offset_at(const std::vector<int64_t>& coordinate) const {
  Shape local = shape;
  Shape offset(shape.size(), 0);
  for (size_t md = 0; md < placements.size(); ++md) {
    const Placement& p = placements[md];
    if (!p.is_shard()) continue;
    const ShardRange range = shard_range(local[p.dim()], mesh->size(md), coordinate[md]);
    offset[p.dim()] += range.offset;
    local[p.dim()] = range.size;
  }
  return offset;
}

Shape DTensorSpec::local_shape() const { return local_shape_at(mesh->coordinate()); }
Shape DTensorSpec::local_offset() const { return local_offset_at(mesh->coordinate()); }

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements) {
    if (p.is_partial()) return true;
  }
  return false;
}

bool DTensorSpec::is_replicated() const {
  for (const auto& p : placements) {
    if (!p.is_replicate()) return false;
  }
  return true;
}

std::string DTensorSpec::str() const {
  return fmt::format("DTensorSpec({}, {}, shape={}, {})", mesh ? mesh->str() : "no mesh",
                     placements_str(placements), shape_str(shape), dtype_name(dtype));
}

bool DTensorSpec::operator==(const DTensorSpec& other) const {
  return (mesh == other.mesh || (mesh && other.mesh && *mesh == *other.mesh)) &&
         placements == other.placements && shape == other.shape && dtype == other.dtype;
}

}  // namespace loom
