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
  for (size_t i = 0; i < names.size() && i < shape.size(); ++i) parts.push_back(fmt::format("{}={}", names[i], shape[i]));
  return fmt::format("({})", fmt::join(parts, ", "));
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, std::vector<std::string> dim_names,
                       std::vector<int64_t> shape, DeviceType device_type)
    : world_(std::move(world)), device_type_(device_type) {
  LOOM_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
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

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, std::vector<std::string> dim_names,
                       std::vector<int64_t> shape, std::vector<int> ranks, DeviceType device_type)
    : world_(std::move(world)), device_type_(device_type) {
  LOOM_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
  init(std::move(dim_names), std::move(shape), std::move(ranks));
  create_groups();
}

void DeviceMesh::init(std::vector<std::string> dim_names, std::vector<int64_t> shape, std::vector<int> ranks) {
  LOOM_CHECK(!shape.empty() && dim_names.size() == shape.size(),
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
    LOOM_CHECK(s >= 1, "DeviceMesh: mesh shape {} has a dim of size {}", mesh_desc(dim_names, shape), s);
    count *= s;
  }
  LOOM_CHECK(count == static_cast<int64_t>(ranks.size()),
             "DeviceMesh: mesh shape {} needs {} ranks but {} were given", mesh_desc(dim_names, shape), count,
             ranks.size());
  std::set<int> unique(ranks.begin(), ranks.end());
  LOOM_CHECK(unique.size() == ranks.size(), "DeviceMesh: ranks [{}] contain duplicates", fmt::join(ranks, ", "));
  for (int r : ranks) {
    LOOM_CHECK(r >= 0 && r < world_->size(), "DeviceMesh: rank {} is not in the world of size {}", r, world_->size());
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
  // For each mesh dim, every rank takes part in creating every line of ranks along that dim
  // (new_group is collective over the world), keeping the one it belongs to.
  const auto strides = row_major_strides(shape_);
  groups_.assign(shape_.size(), nullptr);
  const int64_t total = numel();
  for (size_t d = 0; d < shape_.size(); ++d) {
    for (int64_t start = 0; start < total; ++start) {
      if ((start / strides[d]) % shape_[d] != 0) continue;  // only line starts along dim d
      std::vector<int> line;
      for (int64_t i = 0; i < shape_[d]; ++i) line.push_back(ranks_[start + i * strides[d]]);
      comm::ProcessGroupOptions options{.name = fmt::format("mesh/{}", dim_names_[d]), .timeout = world_->timeout()};
      auto group = world_->new_group(line, options);
      if (group) groups_[d] = std::move(group);
    }
    LOOM_INTERNAL_ASSERT(groups_[d] != nullptr, "rank {} got no group for mesh dim {}", rank_, dim_names_[d]);
  }
}

int64_t DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(dim_names_.begin(), dim_names_.end(), name);
  LOOM_CHECK(it != dim_names_.end(), "DeviceMesh: no dim named '{}' in {}; its dims are [{}]", name, str(),
             fmt::join(dim_names_, ", "));
  return it - dim_names_.begin();
}

int64_t DeviceMesh::size(int64_t mesh_dim) const {
  LOOM_CHECK(mesh_dim >= 0 && mesh_dim < ndim(), "DeviceMesh: mesh_dim {} out of range for {} with {} dims",
             mesh_dim, str(), ndim());
  return shape_[mesh_dim];
}

int64_t DeviceMesh::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

const std::shared_ptr<comm::ProcessGroup>& DeviceMesh::group(int64_t mesh_dim) const {
  LOOM_CHECK(mesh_dim >= 0 && mesh_dim < ndim(), "DeviceMesh: mesh_dim {} out of range for {} with {} dims",
             mesh_dim, str(), ndim());
  return groups_[mesh_dim];
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  LOOM_CHECK(!names.empty(), "DeviceMesh: slicing {} needs at least one dim name", str());
  std::vector<int64_t> dims;
  for (const auto& name : names) {
    const int64_t d = dim_index(name);
    LOOM_CHECK(std::find(dims.begin(), dims.end(), d) == dims.end(), "DeviceMesh: dim '{}' named twice in slice of {}",
               name, str());
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
  }
  const auto sub_strides = row_major_strides(sub_shape);
  int64_t count = 1;
  for (int64_t s : sub_shape) count *= s;
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t position = base;
    for (size_t i = 0; i < dims.size(); ++i) position += ((flat / sub_strides[i]) % sub_shape[i]) * strides[dims[i]];
    out.ranks_.push_back(ranks_[position]);
  }
  out.shape_ = std::move(sub_shape);
  return out;
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names, const std::string& new_name) const {
  LOOM_CHECK(!names.empty(), "DeviceMesh: flatten of {} needs at least one dim name", str());
  std::vector<int64_t> dims;
  for (const auto& name : names) dims.push_back(dim_index(name));
  for (size_t i = 1; i < dims.size(); ++i) {
    LOOM_CHECK(dims[i] == dims[i - 1] + 1, "DeviceMesh: flatten of {} needs adjacent dims in mesh order, got [{}]",
               str(), fmt::join(names, ", "));
  }
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
      LOOM_CHECK(dim_names_[d] != new_name, "DeviceMesh: flatten name '{}' already names a dim of {}", new_name, str());
      new_names.push_back(dim_names_[d]);
      new_shape.push_back(shape_[d]);
    }
  }
  // Row-major order is unchanged by merging adjacent dims, so the rank array carries over.
  DeviceMesh out;
  out.world_ = world_;
  out.device_type_ = device_type_;
  out.init(std::move(new_names), std::move(new_shape), ranks_);
  // Reuse the untouched dims' groups; create the flattened dim's group (collective).
  const auto strides = row_major_strides(out.shape_);
  const int64_t flat_dim = dims.front();
  out.groups_.assign(out.shape_.size(), nullptr);
  for (int64_t d = 0, old = 0; d < out.ndim(); ++d) {
    if (d == flat_dim) {
      old = dims.back() + 1;
      continue;
    }
    out.groups_[d] = groups_[old++];
  }
  for (int64_t start = 0; start < out.numel(); ++start) {
    if ((start / strides[flat_dim]) % out.shape_[flat_dim] != 0) continue;
    std::vector<int> line;
    for (int64_t i = 0; i < out.shape_[flat_dim]; ++i) line.push_back(out.ranks_[start + i * strides[flat_dim]]);
    comm::ProcessGroupOptions options{.name = fmt::format("mesh/{}", new_name), .timeout = world_->timeout()};
    auto group = world_->new_group(line, options);
    if (group) out.groups_[flat_dim] = std::move(group);
  }
  return out;
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return dim_names_ == other.dim_names_ && shape_ == other.shape_ && ranks_ == other.ranks_ &&
         device_type_ == other.device_type_;
}

std::string DeviceMesh::str() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < dim_names_.size(); ++i) parts.push_back(fmt::format("{}={}", dim_names_[i], shape_[i]));
  parts.push_back(device_type_ == DeviceType::kCPU ? "cpu" : "cuda");
  return fmt::format("DeviceMesh({})", fmt::join(parts, ", "));
}

}  // namespace loom
