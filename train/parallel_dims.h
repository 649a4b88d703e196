// The parallel degrees of a job, one per named mesh dim (torchtitan's ParallelDims), validated
// once, and the mesh they make.
//
// Mesh order: pp outermost, then dp_replicate and dp_shard, tp innermost, so tensor-parallel
// peers are neighbouring ranks (on one node, on one NVLink island), FSDP's all-gathers run
// between near ranks, and pipeline stages are the farthest apart (torchtitan's order). A later
// dimension (context parallel) is one more field here and one more name in names(): every job,
// test and example builds its mesh through this struct.
//
// The data-parallel degree is dp_replicate x dp_shard: DDP over dp_replicate when dp_shard is 1,
// FSDP over dp_shard when dp_replicate is 1, HSDP with both (models/data_parallel.h). The
// data-parallel rank (which share of the batch a rank takes) is dp_replicate's coordinate x
// dp_shard + dp_shard's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "mesh/device_mesh.h"

namespace loom::train {

struct ParallelDims {
  int64_t pp = 1;            // pipeline stages
  int64_t dp_replicate = 1;  // data-parallel replicas (DDP, or HSDP's replicate dim)
  int64_t dp_shard = 1;      // data-parallel shards (FSDP); -1: whatever the world leaves
  int64_t tp = 1;            // tensor-parallel shards (Megatron-style, with sequence parallelism)

  // The data-parallel degree: dp_replicate x dp_shard.
  int64_t dp() const { return dp_replicate * dp_shard; }
  // dp_shard -1 resolved against `world_size` (the ranks the others leave); throws naming the
  // degrees when they do not divide it.
  ParallelDims resolved(int64_t world_size) const;

  // "pp", "dp_replicate", "dp_shard", "tp": the mesh's dim names, outermost first.
  std::vector<std::string> names() const;
  // The degrees in the order of names().
  std::vector<int64_t> sizes() const;
  // pp x dp_replicate x dp_shard x tp.
  int64_t world_size() const;
  // "pp=2 x dp_shard=2 x tp=2": the degrees above 1 (pp=1 when every one is 1).
  std::string str() const;

  // Throws loom::Error naming the degree when one is below 1 (dp_shard -1 unresolved included),
  // and naming every degree when their product is not `world_size` ("ParallelDims: dp_replicate=2
  // x tp=2 = 4 ranks, but the world has 3").
  void validate(int64_t world_size) const;

  // The ("pp", "dp_replicate", "dp_shard", "tp") mesh over every rank of `world` (validates
  // first).
  std::shared_ptr<const DeviceMesh> build_mesh(std::shared_ptr<comm::ProcessGroup> world) const;
};

// The data-parallel degree and this rank's data-parallel index on a mesh with dims
// "dp_replicate" and "dp_shard" (ParallelDims::build_mesh's): which share of a global batch the
// rank takes.
int64_t data_parallel_size(const DeviceMesh& mesh);
int64_t data_parallel_rank(const DeviceMesh& mesh);

}  // namespace loom::train
