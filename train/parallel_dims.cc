#include "train/parallel_dims.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::train {

const std::vector<ParallelDims::Dim>& ParallelDims::dims() {
  static const std::vector<Dim> kDims = {{kPipelineDim, &ParallelDims::pp},
                                         {kReplicateDim, &ParallelDims::dp_replicate},
                                         {kShardDim, &ParallelDims::dp_shard},
                                         {kContextDim, &ParallelDims::cp},
                                         {kTensorDim, &ParallelDims::tp}};
  return kDims;
}

std::vector<std::string> ParallelDims::names() const {
  std::vector<std::string> out;
  for (const Dim& dim : dims()) out.emplace_back(dim.name);
  return out;
}

std::vector<int64_t> ParallelDims::sizes() const {
  std::vector<int64_t> out;
  for (const Dim& dim : dims()) out.push_back(this->*dim.degree);
  return out;
}

int64_t ParallelDims::world_size() const {
  int64_t world = 1;
  for (const Dim& dim : dims()) world *= this->*dim.degree;
  return world;
}

std::string ParallelDims::str() const {
  std::vector<std::string> parts;
  for (const Dim& dim : dims()) {
    if (this->*dim.degree != 1) parts.push_back(fmt::format("{}={}", dim.name, this->*dim.degree));
  }
  if (ep != 1) parts.push_back(fmt::format("{}={} (of dp_shard x cp)", kExpertDim, ep));
  return parts.empty() ? fmt::format("{}=1", kPipelineDim)
                       : fmt::format("{}", fmt::join(parts, " x "));
}

ParallelDims ParallelDims::resolved(int64_t world_size) const {
  if (dp_shard != -1) return *this;
  ParallelDims out = *this;
  out.dp_shard = 1;
  const int64_t others = out.world_size();
  std::vector<std::string> degrees;  // every other dim's, e.g. "pp=1 x dp_replicate=1 x tp=3"
  for (const Dim& dim : dims()) {
    if (dim.degree != &ParallelDims::dp_shard) {
      degrees.push_back(fmt::format("{}={}", dim.name, out.*dim.degree));
    }
  }
  LOOM_CHECK(others >= 1 && world_size % others == 0,
             "ParallelDims: {} -1 takes the ranks the other degrees leave, but {} = {} does not "
             "divide the world of {}",
             kShardDim, fmt::join(degrees, " x "), others, world_size);
  out.dp_shard = world_size / others;
  return out;
}

void ParallelDims::validate(int64_t world_size) const {
  for (const Dim& dim : dims()) {
    const int64_t degree = this->*dim.degree;
    LOOM_CHECK(degree >= 1, "ParallelDims: {} must be at least 1{}, got {}", dim.name,
               dim.degree == &ParallelDims::dp_shard
                   ? " (or -1, resolved first: ParallelDims::resolved)"
                   : "",
               degree);
  }
  LOOM_CHECK(ep >= 1 && (dp_shard * cp) % ep == 0,
             "ParallelDims: ep {} must divide dp_shard x cp = {} x {} (expert parallelism takes "
             "its ranks from the fully sharded data-parallel ones); raise --dp-shard or lower --ep",
             ep, dp_shard, cp);
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

parallel::ParallelMeshes ParallelDims::meshes(const std::shared_ptr<const DeviceMesh>& mesh) {
  LOOM_CHECK(mesh != nullptr, "ParallelDims::meshes: the mesh is null");
  const auto slice = [&](std::vector<std::string> names) {
    return std::make_shared<const DeviceMesh>(mesh->slice(names));
  };
  parallel::ParallelMeshes out{.mesh = mesh,
                               .pp = slice({kPipelineDim}),
                               .tp = slice({kTensorDim}),
                               .dp_replicate = slice({kReplicateDim}),
                               .dp_shard = slice({kShardDim}),
                               .cp = slice({kContextDim})};
  if (out.cp->size(0) > 1) {
    // cp ranks reduce gradients with dp_shard's: FSDP shards over both flattened (collective:
    // every rank of the mesh makes the flattened dim's groups, in the same order).
    const auto flat = std::make_shared<const DeviceMesh>(
        mesh->flatten({kShardDim, kContextDim}, kShardContextDim));
    out.dp_shard = std::make_shared<const DeviceMesh>(flat->slice({kShardContextDim}));
    out.fsdp =
        out.dp_replicate->size(0) > 1
            ? std::make_shared<const DeviceMesh>(flat->slice({kReplicateDim, kShardContextDim}))
            : out.dp_shard;
    return out;
  }
  out.fsdp = out.dp_replicate->size(0) > 1 ? slice({kReplicateDim, kShardDim}) : out.dp_shard;
  return out;
}

parallel::ParallelMeshes ParallelDims::meshes_with_experts(
    const std::shared_ptr<const DeviceMesh>& mesh) const {
  parallel::ParallelMeshes out = meshes(mesh);
  if (ep == 1) return out;
  // The same ranks, row-major, with dp_shard x cp read as ep_shard x ep (ep innermost): the ep
  // groups are runs of ep consecutive dp_shard x cp ranks. The pp, dp_replicate and tp groups
  // are the job's own.
  const int64_t shard = mesh->size(kShardDim) * mesh->size(kContextDim);
  LOOM_CHECK(shard % ep == 0, "ParallelDims: ep {} does not divide dp_shard x cp = {}", ep, shard);
  const auto experts = std::make_shared<const DeviceMesh>(
      mesh->unflatten({kShardDim, kContextDim}, {kExpertShardDim, kExpertDim}, {shard / ep, ep}));
  out.ep = std::make_shared<const DeviceMesh>(experts->slice({kExpertDim}));
  out.ep_shard = std::make_shared<const DeviceMesh>(experts->slice({kExpertShardDim}));
  out.ep_fsdp =
      out.dp_replicate->size(0) > 1
          ? std::make_shared<const DeviceMesh>(experts->slice({kReplicateDim, kExpertShardDim}))
          : out.ep_shard;
  return out;
}

int64_t data_parallel_size(const DeviceMesh& mesh) {
  return mesh.size(kReplicateDim) * mesh.size(kShardDim);
}

int64_t data_parallel_rank(const DeviceMesh& mesh) {
  return mesh.coordinate(mesh.dim_index(kReplicateDim)) * mesh.size(kShardDim) +
         mesh.coordinate(mesh.dim_index(kShardDim));
}

int64_t context_parallel_size(const DeviceMesh& mesh) { return mesh.size(kContextDim); }

int64_t context_parallel_rank(const DeviceMesh& mesh) {
  return mesh.coordinate(mesh.dim_index(kContextDim));
}

std::vector<std::shared_ptr<comm::ProcessGroup>> data_parallel_groups(const DeviceMesh& mesh) {
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups;
  for (const char* dim : {kContextDim, kShardDim, kReplicateDim}) {
    if (mesh.size(dim) > 1) groups.push_back(mesh.group(dim));
  }
  return groups;
}

std::vector<int64_t> sum_over_data_parallel(const std::vector<int64_t>& counts,
                                            const DeviceMesh& mesh) {
  if (counts.empty()) return counts;
  Tensor t =
      ops::to(ops::from_vector_i64(counts, {static_cast<int64_t>(counts.size())}), mesh.device());
  for (const auto& group : data_parallel_groups(mesh)) {
    group->all_reduce(t, comm::ReduceOp::kSum)->wait();
  }
  std::vector<int64_t> out;
  for (double v : ops::to_vector(t)) out.push_back(std::llround(v));
  return out;
}

}  // namespace loom::train
