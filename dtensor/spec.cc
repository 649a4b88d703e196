#include "dtensor/spec.h"

#include <fmt/format.h>

#include "base/error.h"
#include "dtensor/shard_math.h"

namespace loom {

namespace {

// Checks placement `p` on mesh dim `i` for a tensor with `tensor_ndim` dims (what validate and
// normalize_placements both require).
void check_placement(const Placement& p, size_t i, const DeviceMesh& mesh, int64_t tensor_ndim,
                     std::string_view op) {
  if (!p.is_shard()) return;
  LOOM_CHECK(p.dim() >= -tensor_ndim && p.dim() < tensor_ndim,
             "{}: placement {} on mesh dim {} ('{}') shards dim {} of a tensor with {} dim{}; "
             "a Shard dim is in [{}, {})",
             op, p.str(), i, mesh.dim_names()[i], p.dim(), tensor_ndim, tensor_ndim == 1 ? "" : "s",
             -tensor_ndim, tensor_ndim);
}

void check_placement_count(const Placements& placements, const DeviceMesh& mesh,
                           std::string_view op) {
  LOOM_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(),
             "{}: got {} placement{} {} for {} with {} dim{}; pass one placement per mesh dim", op,
             placements.size(), placements.size() == 1 ? "" : "s", placements_str(placements),
             mesh.str(), mesh.ndim(), mesh.ndim() == 1 ? "" : "s");
}

}  // namespace

Placements normalize_placements(const Placements& placements, const DeviceMesh& mesh,
                                int64_t tensor_ndim, std::string_view op) {
  check_placement_count(placements, mesh, op);
  Placements out;
  out.reserve(placements.size());
  for (size_t i = 0; i < placements.size(); ++i) {
    check_placement(placements[i], i, mesh, tensor_ndim, op);
    out.push_back(placements[i].normalized(tensor_ndim));
  }
  return out;
}

// Allocates nothing: every DTensor op's outputs are validated.
void DTensorSpec::validate(std::string_view op) const {
  LOOM_CHECK(mesh != nullptr, "{}: DTensorSpec has no mesh", op);
  check_placement_count(placements, *mesh, op);
  const auto ndim = static_cast<int64_t>(shape.size());
  for (size_t i = 0; i < placements.size(); ++i) check_placement(placements[i], i, *mesh, ndim, op);
}

int64_t DTensorSpec::local_size_at(size_t dim, const std::vector<int64_t>& coordinate) const {
  // Nested in mesh-dim order: each mesh dim sharding `dim` splits what the ones before it left.
  int64_t size = shape[dim];
  for (size_t md = 0; md < placements.size(); ++md) {
    const Placement& p = placements[md];
    if (p.is_shard() && p.dim() == static_cast<int64_t>(dim)) {
      size = shard_range(size, mesh->size(md), coordinate[md]).size;
    }
  }
  return size;
}

bool DTensorSpec::has_local_shape(const Shape& local) const {
  if (local.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (local_size_at(d, mesh->coordinate()) != local[d]) return false;
  }
  return true;
}

Shape DTensorSpec::local_shape_at(const std::vector<int64_t>& coordinate) const {
  Shape local(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) local[d] = local_size_at(d, coordinate);
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
