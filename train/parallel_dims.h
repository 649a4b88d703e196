// The parallel degrees of a job, one per named mesh dim (torchtitan's ParallelDims), validated
// once; the mesh they make; and the submeshes every layer below takes (meshes()): the one place
// the dim names are spelled.
//
// Mesh order: pp outermost, then dp_replicate, dp_shard and cp, tp innermost, so tensor-parallel
// peers are neighbouring ranks (on one node, on one NVLink island), FSDP's all-gathers run
// between near ranks, and pipeline stages are the farthest apart (torchtitan's order).
//
// Adding a dim (context parallel, expert parallel): a degree field and its row in dims() (its
// place in the mesh order), its role in parallel::ParallelMeshes when the layers below use it,
// and the code of the dim itself. Every job, test and example builds its mesh through this.
//
// The data-parallel degree is dp_replicate x dp_shard: DDP over dp_replicate when dp_shard is 1,
// FSDP over dp_shard when dp_replicate is 1, HSDP with both (parallel/data_parallel.h). The
// data-parallel rank (which share of the batch a rank takes) is dp_replicate's coordinate x
// dp_shard + dp_shard's.
//
// Context parallelism (cp > 1) shards every sequence over cp ranks that hold the same parameters
// and train on the same sequences: their gradients are reduced with the data-parallel ones, so
// FSDP shards over dp_shard x cp flattened (dp_shard_cp; HSDP: dp_replicate x dp_shard_cp), as
// torchtitan does, and the loss is averaged over cp as over dp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "mesh/device_mesh.h"
#include "parallel/meshes.h"

namespace loom::train {

// The dims' names: the only spelling of them in the code.
inline constexpr const char* kPipelineDim = "pp";
inline constexpr const char* kReplicateDim = "dp_replicate";
inline constexpr const char* kShardDim = "dp_shard";
inline constexpr const char* kContextDim = "cp";
inline constexpr const char* kTensorDim = "tp";
// dp_shard and cp flattened: what FSDP shards over (and reduces gradients over) with context
// parallelism, torchtitan's "dp_shard_cp".
inline constexpr const char* kShardContextDim = "dp_shard_cp";
// Expert parallelism's split of the dp_shard x cp ranks: ep_shard x ep, ep innermost.
inline constexpr const char* kExpertDim = "ep";
inline constexpr const char* kExpertShardDim = "ep_shard";

struct ParallelDims {
  int64_t pp = 1;            // pipeline stages
  int64_t dp_replicate = 1;  // data-parallel replicas (DDP, or HSDP's replicate dim)
  int64_t dp_shard = 1;      // data-parallel shards (FSDP); -1: whatever the world leaves
  int64_t cp = 1;            // context-parallel shards of every sequence (parallel/cp)
  int64_t tp = 1;            // tensor-parallel shards (Megatron-style, with sequence parallelism)
  // Expert parallelism: each MoE's experts split over ep ranks taken from the dp_shard x cp ranks
  // (torchtitan's: no mesh dim of its own, so the world is the product of the others). ep must
  // divide dp_shard x cp.
  int64_t ep = 1;

  // A mesh dim: its name and its degree's field.
  struct Dim {
    const char* name;
    int64_t ParallelDims::*degree;
  };
  // Every dim in mesh order, outermost first.
  static const std::vector<Dim>& dims();

  // The data-parallel degree: dp_replicate x dp_shard.
  int64_t dp() const { return dp_replicate * dp_shard; }
  // dp_shard -1 resolved against `world_size` (the ranks the others leave); throws naming the
  // degrees when they do not divide it.
  ParallelDims resolved(int64_t world_size) const;

  // "pp", "dp_replicate", "dp_shard", "tp": the mesh's dim names, outermost first.
  std::vector<std::string> names() const;
  // The degrees in the order of names().
  std::vector<int64_t> sizes() const;
  // The product of the degrees.
  int64_t world_size() const;
  // "pp=2 x dp_shard=2 x tp=2": the degrees above 1 (pp=1 when every one is 1).
  std::string str() const;

  // Throws loom::Error naming the degree when one is below 1 (dp_shard -1 unresolved included),
  // and naming every degree when their product is not `world_size` ("ParallelDims: dp_replicate=2
  // x tp=2 = 4 ranks, but the world has 3").
  void validate(int64_t world_size) const;

  // The mesh over every rank of `world`, dims in mesh order (validates first).
  std::shared_ptr<const DeviceMesh> build_mesh(std::shared_ptr<comm::ProcessGroup> world) const;

  // The submeshes of a mesh build_mesh made, by role (collective only where a mesh slice creates
  // groups: it does not, slices reuse the mesh's groups).
  static parallel::ParallelMeshes meshes(const std::shared_ptr<const DeviceMesh>& mesh);
  // meshes() with the expert-parallel meshes of this ep added (ep > 1: collective over the
  // world, which makes the ep_shard and ep groups; the others are the job mesh's).
  parallel::ParallelMeshes meshes_with_experts(const std::shared_ptr<const DeviceMesh>& mesh) const;
};

// The data-parallel degree and this rank's data-parallel index on a mesh build_mesh made: which
// share of a global batch the rank takes.
int64_t data_parallel_size(const DeviceMesh& mesh);
int64_t data_parallel_rank(const DeviceMesh& mesh);
// The context-parallel degree and this rank's index in its cp group (which chunks of every
// sequence it holds: parallel/cp/context_parallel.h).
int64_t context_parallel_size(const DeviceMesh& mesh);
int64_t context_parallel_rank(const DeviceMesh& mesh);
// The groups a step's loss is averaged over, innermost first (cp, dp_shard, then dp_replicate:
// equal groups and equal token counts, so the mean of means), those of size 1 left out.
std::vector<std::shared_ptr<comm::ProcessGroup>> data_parallel_groups(const DeviceMesh& mesh);
// `counts` summed over every data-parallel rank (data_parallel_groups, one all-reduce each) as
// integers, exact at any size: MoE's routed-slot counts. Collective over those groups.
std::vector<int64_t> sum_over_data_parallel(const std::vector<int64_t>& counts,
                                            const DeviceMesh& mesh);

}  // namespace loom::train
