// DeviceMesh: an n-D grid of ranks with named dims (torch's init_device_mesh / DeviceMesh).
//
//   DeviceMesh mesh(world, {"dp", "tp"}, {2, 2});   // ranks [[0, 1], [2, 3]], row-major
//   mesh.size("tp");          // 2
//   mesh.coordinate();        // this rank's index along each dim, e.g. {1, 0} on rank 2
//   mesh.group("tp");         // the ProcessGroup of this rank's row along "tp": {2, 3}
//   mesh["tp"];               // the 1-D sub-mesh this rank belongs to along "tp"
//   mesh.flatten({"dp", "tp"}, "dp_tp");   // one dim over both
//
// Collective contract: constructing a mesh, flatten() and unflatten() are collective over the
// parent group (every rank calls them in the same order): they create one ProcessGroup per mesh
// dim, once; sub-meshes reuse them. Mesh dims are addressed by name or by index (`mesh_dim`).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "tensor/device.h"

namespace loom {

class DeviceMesh {
 public:
  // A mesh over every rank of `world`, row-major (rank = sum of coordinate * stride). Its device
  // type is the world group's (torch's DeviceMesh("cuda", ...)); one given must match it.
  DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, std::vector<std::string> dim_names,
             std::vector<int64_t> shape, std::optional<DeviceType> device_type = std::nullopt);
  // A mesh over an explicit row-major array of ranks of `world` (each at most once).
  DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, std::vector<std::string> dim_names,
             std::vector<int64_t> shape, std::vector<int> ranks,
             std::optional<DeviceType> device_type = std::nullopt);

  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  // Mesh dim index of `name`; throws listing the mesh's dims when unknown.
  int64_t dim_index(const std::string& name) const;
  int64_t size(int64_t mesh_dim) const;
  int64_t size(const std::string& name) const { return size(dim_index(name)); }
  // Number of ranks in the mesh.
  int64_t numel() const;
  // This rank's index along each mesh dim.
  const std::vector<int64_t>& coordinate() const { return coordinate_; }
  int64_t coordinate(int64_t mesh_dim) const { return coordinate_.at(mesh_dim); }
  // The ranks of `world` in the mesh, row-major.
  const std::vector<int>& ranks() const { return ranks_; }
  // This rank's rank in `world`.
  int rank() const { return rank_; }
  const std::shared_ptr<comm::ProcessGroup>& group(int64_t mesh_dim) const;
  const std::shared_ptr<comm::ProcessGroup>& group(const std::string& name) const {
    return group(dim_index(name));
  }
  // The rank in group(mesh_dim) of the rank at each coordinate along mesh_dim (on this rank's
  // line). Collectives address group ranks, which new_group numbers in ascending rank order, so
  // this is the identity unless an explicit rank array is not ascending along mesh_dim (e.g.
  // ranks [3, 2, 1, 0]); code that puts chunk c at coordinate c must map through it.
  const std::vector<int>& group_ranks_by_coordinate(int64_t mesh_dim) const;
  DeviceType device_type() const { return device_type_; }
  // The group every rank of the mesh is in (the one the mesh was made over).
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  // Where this rank's tensors on the mesh live: its process groups' device (the CPU on Gloo,
  // this rank's GPU on NCCL). DTensor factories allocate shards here.
  Device device() const { return world_->device(); }

  // The sub-mesh of the named dims (in the order given) containing this rank. Reuses the groups.
  DeviceMesh operator[](const std::string& name) const { return slice({name}); }
  DeviceMesh operator[](const std::vector<std::string>& names) const { return slice(names); }
  DeviceMesh slice(const std::vector<std::string>& names) const;
  // A mesh where adjacent dims `names` (in mesh order) become one dim `new_name`. Collective
  // over the world group: every rank creates the flattened dim's group of every slice of the
  // root mesh, so it works on slices too (each rank calling it on its own slice).
  DeviceMesh flatten(const std::vector<std::string>& names, const std::string& new_name) const;
  // A mesh over the same ranks where adjacent dims `names` (in mesh order), read row-major as one,
  // become dims `new_names` of sizes `new_sizes` (torch's DeviceMesh._unflatten, here of one or
  // more dims): e.g. (dp_shard=4, cp=2) read as (ep_shard=2, ep=4). The other dims keep their
  // groups; only the new dims' groups are created. Collective over the world group, like flatten,
  // so the mesh must span the world (the job's mesh or a flattening of it). The result is a root
  // of its own: its slices concatenate with each other, not with this mesh's.
  DeviceMesh unflatten(const std::vector<std::string>& names,
                       const std::vector<std::string>& new_names,
                       const std::vector<int64_t>& new_sizes) const;
  // The mesh whose dims are every dim of `meshes`, in the order given (torch's
  // DeviceMesh._concatenate): e.g. mesh["tp"] and mesh["dp_shard"] make the (tp, dp_shard) mesh
  // of a parameter FSDP shards on top of tensor parallelism. The meshes must be slices (or
  // flattenings) of one root mesh containing this rank, over disjoint dims of it. Not collective:
  // it reuses their groups.
  static DeviceMesh concatenate(const std::vector<DeviceMesh>& meshes);

  // Meshes are equal when they have the same dims, shape and ranks.
  bool operator==(const DeviceMesh& other) const;
  // "DeviceMesh(dp=2, tp=2, cpu)"
  std::string str() const;

 private:
  DeviceMesh() = default;
  // The layout of the mesh a constructor built: the root of every slice and flattening.
  struct RootLayout {
    std::vector<int64_t> shape;
    std::vector<int> ranks;
  };
  // The group made for a line of ranks along some root dims, and its group ranks by coordinate.
  struct LineGroup {
    std::shared_ptr<comm::ProcessGroup> group;
    std::vector<int> line;
    std::vector<int> group_ranks;
  };

  void init(std::vector<std::string> dim_names, std::vector<int64_t> shape, std::vector<int> ranks);
  void create_groups();
  // The indices of `names`, checked to be adjacent dims in mesh order (flatten, unflatten).
  std::vector<int64_t> adjacent_dims(const std::vector<std::string>& names,
                                     const char* operation) const;
  // Creates the group of every line of the root along root dims `span` (collective over the
  // world: every rank creates every line, in the same order) and returns this rank's.
  LineGroup create_line_groups(const std::vector<int64_t>& span, const std::string& name) const;

  std::shared_ptr<comm::ProcessGroup> world_;
  std::vector<std::string> dim_names_;
  std::vector<int64_t> shape_;
  std::vector<int> ranks_;
  std::vector<int64_t> coordinate_;
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;
  std::vector<std::vector<int>> group_ranks_by_coordinate_;  // per mesh dim
  std::shared_ptr<const RootLayout> root_;
  // Per mesh dim, the root dims it spans in row-major order (several for a flattened dim).
  std::vector<std::vector<int64_t>> root_dims_;
  int rank_ = 0;
  DeviceType device_type_ = DeviceType::kCPU;
};

}  // namespace loom
