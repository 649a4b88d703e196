#include "mesh/device_mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "base/error.h"

namespace loom {

namespace {

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

std::string mesh_desc(const std::vector<std::string>& names, const std::vector<int64_t>& shape) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < names.size() && i < shape.size(); ++i)
    parts.push_back(fmt::format("{}={}", names[i], shape[i]));
  return fmt::format("({})", fmt::join(parts, ", "));
}

// The mesh's device type: its world group's, where its tensors live (a GPU's for NCCL and for
// Gloo staging GPU tensors, meta for a traced job's fake groups). One given must agree.
DeviceType checked_device_type(const comm::ProcessGroup& world, std::optional<DeviceType> given) {
  const Device device = world.device();
  LOOM_CHECK(!given || *given == device.type,
             "DeviceMesh: device type {} given, but the world group's tensors live on {}; pass "
             "its device type or none",
             Device{*given, 0}.str(), device.str());
  return device.type;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> world,
                       std::vector<std::string> dim_names, std::vector<int64_t> shape,
                       std::optional<DeviceType> device_type)
    : world_(std::move(world)) {
  LOOM_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
  device_type_ = checked_device_type(*world_, device_type);
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  LOOM_CHECK(count == world_->size(),
             "DeviceMesh: mesh shape {} has {} ranks but the world has {}; the product of the mesh "
             "shape must equal the world size",
             mesh_desc(dim_names, shape), count, world_->size());
  std::vector<int> ranks(world_->size());
  for (int r = 0; r < world_->size(); ++r) ranks[r] = r;
  init(std::move(dim_names), std::move(shape), std::move(ranks));
  create_groups();
}

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> world,
                       std::vector<std::string> dim_names, std::vector<int64_t> shape,
                       std::vector<int> ranks, std::optional<DeviceType> device_type)
    : world_(std::move(world)) {
  LOOM_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
  device_type_ = checked_device_type(*world_, device_type);
  init(std::move(dim_names), std::move(shape), std::move(ranks));
  create_groups();
}

void DeviceMesh::init(std::vector<std::string> dim_names, std::vector<int64_t> shape,
                      std::vector<int> ranks) {
  LOOM_CHECK(
      !shape.empty() && dim_names.size() == shape.size(),
      "DeviceMesh: got {} dim names [{}] for a mesh shape with {} dims; pass one name per dim",
      dim_names.size(), fmt::join(dim_names, ", "), shape.size());
  std::set<std::string> seen;
  for (const auto& name : dim_names) {
    LOOM_CHECK(!name.empty(), "DeviceMesh: empty dim name in [{}]", fmt::join(dim_names, ", "));
    LOOM_CHECK(seen.insert(name).second, "DeviceMesh: dim name '{}' appears twice in [{}]", name,
               fmt::join(dim_names, ", "));
  }
  int64_t count = 1;
  for (int64_t s : shape) {
    LOOM_CHECK(s >= 1, "DeviceMesh: mesh shape {} has a dim of size {}",
               mesh_desc(dim_names, shape), s);
    count *= s;
  }
  LOOM_CHECK(count == static_cast<int64_t>(ranks.size()),
             "DeviceMesh: mesh shape {} needs {} ranks but {} were given",
             mesh_desc(dim_names, shape), count, ranks.size());
  std::set<int> unique(ranks.begin(), ranks.end());
  LOOM_CHECK(unique.size() == ranks.size(), "DeviceMesh: ranks [{}] contain duplicates",
             fmt::join(ranks, ", "));
  for (int r : ranks) {
    LOOM_CHECK(r >= 0 && r < world_->size(), "DeviceMesh: rank {} is not in the world of size {}",
               r, world_->size());
  }
  rank_ = world_->rank();
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  LOOM_CHECK(it != ranks.end(), "DeviceMesh: rank {} is not in the mesh {} over ranks [{}]", rank_,
             mesh_desc(dim_names, shape), fmt::join(ranks, ", "));
  const int64_t flat = it - ranks.begin();
  const auto strides = row_major_strides(shape);
  coordinate_.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) coordinate_[d] = (flat / strides[d]) % shape[d];
  dim_names_ = std::move(dim_names);
  shape_ = std::move(shape);
  ranks_ = std::move(ranks);
}

void DeviceMesh::create_groups() {
  // This mesh is a root: the layout its slices and flattenings refer to.
  root_ = std::make_shared<const RootLayout>(RootLayout{shape_, ranks_});
  root_dims_.clear();
  groups_.clear();
  group_ranks_by_coordinate_.clear();
  for (int64_t d = 0; d < ndim(); ++d) {
    root_dims_.push_back({d});
    LineGroup mine = create_line_groups({d}, dim_names_[d]);
    groups_.push_back(std::move(mine.group));
    group_ranks_by_coordinate_.push_back(std::move(mine.group_ranks));
  }
}

DeviceMesh::LineGroup DeviceMesh::create_line_groups(const std::vector<int64_t>& span,
                                                     const std::string& name) const {
  // Every rank takes part in creating every line of the root along `span` (new_group is
  // collective over the world), keeping the one it belongs to. A line starts at each root
  // position whose coordinates along `span` are all 0, in ascending order.
  const auto strides = row_major_strides(root_->shape);
  std::vector<int64_t> span_shape;
  for (int64_t d : span) span_shape.push_back(root_->shape[d]);
  const auto span_strides = row_major_strides(span_shape);
  int64_t line_size = 1;
  for (int64_t s : span_shape) line_size *= s;
  const int64_t total = static_cast<int64_t>(root_->ranks.size());
  LineGroup mine;
  for (int64_t start = 0; start < total; ++start) {
    bool is_start = true;
    for (int64_t d : span) is_start = is_start && (start / strides[d]) % root_->shape[d] == 0;
    if (!is_start) continue;
    std::vector<int> line;
    for (int64_t i = 0; i < line_size; ++i) {
      int64_t position = start;
      for (size_t k = 0; k < span.size(); ++k)
        position += ((i / span_strides[k]) % span_shape[k]) * strides[span[k]];
      line.push_back(root_->ranks[position]);
    }
    comm::ProcessGroupOptions options{.name = fmt::format("mesh/{}", name),
                                      .timeout = world_->timeout()};
    auto group = world_->new_group(line, options);
    if (!group) continue;
    // new_group numbers group ranks in ascending rank order, whatever the line's order.
    std::vector<int> sorted = line;
    std::sort(sorted.begin(), sorted.end());
    mine.group_ranks.clear();
    for (int r : line) {
      mine.group_ranks.push_back(
          static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), r) - sorted.begin()));
    }
    mine.group = std::move(group);
    mine.line = std::move(line);
  }
  LOOM_INTERNAL_ASSERT(mine.group != nullptr, "rank {} got no group for mesh dim {}", rank_, name);
  return mine;
}

const std::vector<int>& DeviceMesh::group_ranks_by_coordinate(int64_t mesh_dim) const {
  LOOM_CHECK(mesh_dim >= 0 && mesh_dim < ndim(),
             "DeviceMesh: mesh_dim {} out of range for {} with {} dims", mesh_dim, str(), ndim());
  return group_ranks_by_coordinate_[mesh_dim];
}

int64_t DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(dim_names_.begin(), dim_names_.end(), name);
  LOOM_CHECK(it != dim_names_.end(), "DeviceMesh: no dim named '{}' in {}; its dims are [{}]", name,
             str(), fmt::join(dim_names_, ", "));
  return it - dim_names_.begin();
}

int64_t DeviceMesh::size(int64_t mesh_dim) const {
  LOOM_CHECK(mesh_dim >= 0 && mesh_dim < ndim(),
             "DeviceMesh: mesh_dim {} out of range for {} with {} dims", mesh_dim, str(), ndim());
  return shape_[mesh_dim];
}

int64_t DeviceMesh::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

const std::shared_ptr<comm::ProcessGroup>& DeviceMesh::group(int64_t mesh_dim) const {
  LOOM_CHECK(mesh_dim >= 0 && mesh_dim < ndim(),
             "DeviceMesh: mesh_dim {} out of range for {} with {} dims", mesh_dim, str(), ndim());
  return groups_[mesh_dim];
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  LOOM_CHECK(!names.empty(), "DeviceMesh: slicing {} needs at least one dim name", str());
  std::vector<int64_t> dims;
  for (const auto& name : names) {
    const int64_t d = dim_index(name);
    LOOM_CHECK(std::find(dims.begin(), dims.end(), d) == dims.end(),
               "DeviceMesh: dim '{}' named twice in slice of {}", name, str());
    dims.push_back(d);
  }
  const auto strides = row_major_strides(shape_);
  // The base position: this rank's coordinate with the kept dims at 0.
  int64_t base = 0;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) base += coordinate_[d] * strides[d];
  }
  DeviceMesh out;
  out.world_ = world_;
  out.device_type_ = device_type_;
  out.rank_ = rank_;
  std::vector<int64_t> sub_shape;
  for (int64_t d : dims) {
    out.dim_names_.push_back(dim_names_[d]);
    sub_shape.push_back(shape_[d]);
    out.coordinate_.push_back(coordinate_[d]);
    out.groups_.push_back(groups_[d]);
    out.group_ranks_by_coordinate_.push_back(group_ranks_by_coordinate_[d]);
    out.root_dims_.push_back(root_dims_[d]);
  }
  out.root_ = root_;
  const auto sub_strides = row_major_strides(sub_shape);
  int64_t count = 1;
  for (int64_t s : sub_shape) count *= s;
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t position = base;
    for (size_t i = 0; i < dims.size(); ++i)
      position += ((flat / sub_strides[i]) % sub_shape[i]) * strides[dims[i]];
    out.ranks_.push_back(ranks_[position]);
  }
  out.shape_ = std::move(sub_shape);
  return out;
}

std::vector<int64_t> DeviceMesh::adjacent_dims(const std::vector<std::string>& names,
                                               const char* operation) const {
  LOOM_CHECK(!names.empty(), "DeviceMesh: {} of {} needs at least one dim name", operation, str());
  std::vector<int64_t> dims;
  for (const auto& name : names) dims.push_back(dim_index(name));
  for (size_t i = 1; i < dims.size(); ++i) {
    LOOM_CHECK(dims[i] == dims[i - 1] + 1,
               "DeviceMesh: {} of {} needs adjacent dims in mesh order, got [{}]", operation, str(),
               fmt::join(names, ", "));
  }
  return dims;
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names,
                               const std::string& new_name) const {
  const std::vector<int64_t> dims = adjacent_dims(names, "flatten");
  std::vector<std::string> new_names;
  std::vector<int64_t> new_shape;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d == dims.front()) {
      int64_t size = 1;
      for (int64_t f : dims) size *= shape_[f];
      new_names.push_back(new_name);
      new_shape.push_back(size);
    } else if (d > dims.front() && d <= dims.back()) {
      continue;
    } else {
      LOOM_CHECK(dim_names_[d] != new_name,
                 "DeviceMesh: flatten name '{}' already names a dim of {}", new_name, str());
      new_names.push_back(dim_names_[d]);
      new_shape.push_back(shape_[d]);
    }
  }
  // Row-major order is unchanged by merging adjacent dims, so the rank array carries over.
  DeviceMesh out;
  out.world_ = world_;
  out.device_type_ = device_type_;
  out.init(std::move(new_names), std::move(new_shape), ranks_);
  // Reuse the untouched dims' groups; create the flattened dim's group (collective over the
  // world: the lines of the root along the flattened dims' root dims, i.e. of every slice).
  const int64_t flat_dim = dims.front();
  out.root_ = root_;
  std::vector<int64_t> span;
  for (int64_t d : dims) span.insert(span.end(), root_dims_[d].begin(), root_dims_[d].end());
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d > flat_dim && d <= dims.back()) continue;
    out.root_dims_.push_back(d == flat_dim ? span : root_dims_[d]);
    out.groups_.push_back(d == flat_dim ? nullptr : groups_[d]);
    out.group_ranks_by_coordinate_.push_back(d == flat_dim ? std::vector<int>{}
                                                           : group_ranks_by_coordinate_[d]);
  }
  LineGroup mine = out.create_line_groups(span, new_name);
  // This rank's line along the flattened dim, from the rank array.
  const auto strides = row_major_strides(out.shape_);
  int64_t start = 0;
  for (int64_t d = 0; d < out.ndim(); ++d) {
    if (d != flat_dim) start += out.coordinate_[d] * strides[d];
  }
  std::vector<int> line;
  for (int64_t i = 0; i < out.shape_[flat_dim]; ++i)
    line.push_back(out.ranks_[start + i * strides[flat_dim]]);
  LOOM_INTERNAL_ASSERT(line == mine.line,
                       "flatten of {}: rank {}'s line [{}] is [{}] in the root layout", str(),
                       rank_, fmt::join(line, ", "), fmt::join(mine.line, ", "));
  out.groups_[flat_dim] = std::move(mine.group);
  out.group_ranks_by_coordinate_[flat_dim] = std::move(mine.group_ranks);
  return out;
}

DeviceMesh DeviceMesh::unflatten(const std::vector<std::string>& names,
                                 const std::vector<std::string>& new_names,
                                 const std::vector<int64_t>& new_sizes) const {
  const std::vector<int64_t> dims = adjacent_dims(names, "unflatten");
  LOOM_CHECK(!new_names.empty() && new_names.size() == new_sizes.size(),
             "DeviceMesh: unflatten of {} got {} new dim names [{}] for {} sizes [{}]; pass one "
             "name per size",
             str(), new_names.size(), fmt::join(new_names, ", "), new_sizes.size(),
             fmt::join(new_sizes, ", "));
  int64_t old_size = 1;
  for (int64_t d : dims) old_size *= shape_[d];
  int64_t new_size = 1;
  for (int64_t s : new_sizes) new_size *= s;
  LOOM_CHECK(new_size == old_size,
             "DeviceMesh: unflatten of [{}] (of size {}) in {} into {} of size {}; the new sizes "
             "must multiply to the old",
             fmt::join(names, ", "), old_size, str(), mesh_desc(new_names, new_sizes), new_size);
  // Its new dims' groups are created over the world, line by line of this mesh: every rank must
  // see the same mesh, so a slice (each rank its own) cannot be unflattened.
  LOOM_CHECK(numel() == world_->size(),
             "DeviceMesh: unflatten of {} (of {} ranks) needs a mesh over the whole world of {} "
             "ranks; unflatten the mesh it was sliced from",
             str(), numel(), world_->size());
  std::vector<std::string> out_names;
  std::vector<int64_t> out_shape;
  // Per dim of the result: the dim of this mesh it keeps, or -1 for a new one.
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (d == dims.front()) {
      for (size_t i = 0; i < new_names.size(); ++i) {
        out_names.push_back(new_names[i]);
        out_shape.push_back(new_sizes[i]);
        kept.push_back(-1);
      }
    } else if (d < dims.front() || d > dims.back()) {
      out_names.push_back(dim_names_[d]);
      out_shape.push_back(shape_[d]);
      kept.push_back(d);
    }
  }
  // Row-major order is unchanged by splitting adjacent dims, so the rank array carries over, and
  // so does every line along a kept dim: its group serves the result.
  DeviceMesh out;
  out.world_ = world_;
  out.device_type_ = device_type_;
  out.init(std::move(out_names), std::move(out_shape), ranks_);
  out.root_ = std::make_shared<const RootLayout>(RootLayout{out.shape_, out.ranks_});
  for (int64_t d = 0; d < out.ndim(); ++d) {
    out.root_dims_.push_back({d});
    if (kept[d] >= 0) {
      out.groups_.push_back(groups_[kept[d]]);
      out.group_ranks_by_coordinate_.push_back(group_ranks_by_coordinate_[kept[d]]);
    } else {
      LineGroup mine = out.create_line_groups({d}, out.dim_names_[d]);
      out.groups_.push_back(std::move(mine.group));
      out.group_ranks_by_coordinate_.push_back(std::move(mine.group_ranks));
    }
  }
  return out;
}

DeviceMesh DeviceMesh::concatenate(const std::vector<DeviceMesh>& meshes) {
  LOOM_CHECK(!meshes.empty(), "DeviceMesh::concatenate: needs at least one mesh");
  const DeviceMesh& first = meshes.front();
  DeviceMesh out;
  out.world_ = first.world_;
  out.device_type_ = first.device_type_;
  out.rank_ = first.rank_;
  out.root_ = first.root_;
  std::set<int64_t> used_root_dims;
  for (const DeviceMesh& mesh : meshes) {
    LOOM_CHECK(mesh.root_ == first.root_ && mesh.world_ == first.world_,
               "DeviceMesh::concatenate: {} and {} are not slices of one root mesh; slice both "
               "from the mesh the job built",
               first.str(), mesh.str());
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      for (int64_t r : mesh.root_dims_[d]) {
        LOOM_CHECK(used_root_dims.insert(r).second,
                   "DeviceMesh::concatenate: dim '{}' of {} overlaps a dim of an earlier mesh; "
                   "the meshes must span disjoint dims",
                   mesh.dim_names_[d], mesh.str());
      }
      out.dim_names_.push_back(mesh.dim_names_[d]);
      out.shape_.push_back(mesh.shape_[d]);
      out.coordinate_.push_back(mesh.coordinate_[d]);
      out.groups_.push_back(mesh.groups_[d]);
      out.group_ranks_by_coordinate_.push_back(mesh.group_ranks_by_coordinate_[d]);
      out.root_dims_.push_back(mesh.root_dims_[d]);
    }
  }
  std::set<std::string> names(out.dim_names_.begin(), out.dim_names_.end());
  LOOM_CHECK(names.size() == out.dim_names_.size(),
             "DeviceMesh::concatenate: dim names [{}] repeat a name",
             fmt::join(out.dim_names_, ", "));
  // The ranks: this rank's root position with the spanned root dims moved along, row-major over
  // the new dims, each new dim's index spread over its root dims row-major.
  const RootLayout& root = *out.root_;
  const auto root_strides = row_major_strides(root.shape);
  const auto mine = std::find(root.ranks.begin(), root.ranks.end(), out.rank_);
  LOOM_INTERNAL_ASSERT(mine != root.ranks.end(), "rank {} is not in its root mesh", out.rank_);
  int64_t base = mine - root.ranks.begin();
  for (int64_t r : used_root_dims)
    base -= ((base / root_strides[r]) % root.shape[r]) * root_strides[r];
  const auto strides = row_major_strides(out.shape_);
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    int64_t position = base;
    for (int64_t d = 0; d < out.ndim(); ++d) {
      int64_t index = (flat / strides[d]) % out.shape_[d];
      const std::vector<int64_t>& span = out.root_dims_[d];
      for (size_t k = span.size(); k-- > 0;) {
        position += (index % root.shape[span[k]]) * root_strides[span[k]];
        index /= root.shape[span[k]];
      }
    }
    out.ranks_.push_back(root.ranks[position]);
  }
  return out;
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return dim_names_ == other.dim_names_ && shape_ == other.shape_ && ranks_ == other.ranks_ &&
         device_type_ == other.device_type_;
}

std::string DeviceMesh::str() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < dim_names_.size(); ++i)
    parts.push_back(fmt::format("{}={}", dim_names_[i], shape_[i]));
  parts.push_back(device_type_ == DeviceType::kCUDA ? "cuda" : Device{device_type_, 0}.str());
  return fmt::format("DeviceMesh({})", fmt::join(parts, ", "));
}

}  // namespace loom
