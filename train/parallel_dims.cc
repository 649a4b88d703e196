#include "train/parallel_dims.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"

namespace loom::train {

std::vector<std::string> ParallelDims::names() const {
  return {"pp", "dp_replicate", "dp_shard", "tp"};
}

std::vector<int64_t> ParallelDims::sizes() const { return {pp, dp_replicate, dp_shard, tp}; }

int64_t ParallelDims::world_size() const { return pp * dp_replicate * dp_shard * tp; }

std::string ParallelDims::str() const {
  std::vector<std::string> parts;
  const std::vector<std::string> dims = names();
  const std::vector<int64_t> degrees = sizes();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (degrees[i] != 1) parts.push_back(fmt::format("{}={}", dims[i], degrees[i]));
  }
  return parts.empty() ? "pp=1" : fmt::format("{}", fmt::join(parts, " x "));
}

ParallelDims ParallelDims::resolved(int64_t world_size) const {
  if (dp_shard != -1) return *this;
  ParallelDims out = *this;
  const int64_t others = pp * dp_replicate * tp;
  LOOM_CHECK(others >= 1 && world_size % others == 0,
             "ParallelDims: dp_shard -1 takes the ranks the other degrees leave, but pp={} x "
             "dp_replicate={} x tp={} = {} does not divide the world of {}",
             pp, dp_replicate, tp, others, world_size);
  out.dp_shard = world_size / others;
  return out;
}

void ParallelDims::validate(int64_t world_size) const {
  const std::vector<std::string> dims = names();
  const std::vector<int64_t> degrees = sizes();
  for (size_t i = 0; i < dims.size(); ++i) {
    LOOM_CHECK(degrees[i] >= 1, "ParallelDims: {} must be at least 1{}, got {}", dims[i],
               dims[i] == "dp_shard" ? " (or -1, resolved first: ParallelDims::resolved)" : "",
               degrees[i]);
  }
  LOOM_CHECK(this->world_size() == world_size,
             "ParallelDims: {} = {} ranks, but the world has {}; the degrees must multiply to "
             "the number of ranks",
             str(), this->world_size(), world_size);
}

std::shared_ptr<const DeviceMesh> ParallelDims::build_mesh(
    std::shared_ptr<comm::ProcessGroup> world) const {
  LOOM_CHECK(world != nullptr, "ParallelDims::build_mesh: the world group is null");
  validate(world->size());
  return std::make_shared<const DeviceMesh>(std::move(world), names(), sizes());
}

int64_t data_parallel_size(const DeviceMesh& mesh) {
  return mesh.size("dp_replicate") * mesh.size("dp_shard");
}

int64_t data_parallel_rank(const DeviceMesh& mesh) {
  return mesh.coordinate(mesh.dim_index("dp_replicate")) * mesh.size("dp_shard") +
         mesh.coordinate(mesh.dim_index("dp_shard"));
}

}  // namespace loom::train
