// The submeshes a model's parallel composition uses, one per role: what the layers below train/
// take instead of a mesh and dim names. train::ParallelDims owns the names and the mesh order and
// hands these out (ParallelDims::meshes), so models/ and parallel/ never spell a dim name; a new
// dim is a new role here only when the layers below use it on their own.
//
// Every field is set (a dim of degree 1 gives a mesh of size 1), all slices of one root mesh, so
// FSDP can concatenate a parameter's tp mesh with its dp_shard mesh.
#pragma once

#include <memory>

#include "mesh/device_mesh.h"

namespace loom::parallel {

struct ParallelMeshes {
  std::shared_ptr<const DeviceMesh> mesh;          // the whole mesh: its device, its first rank
  std::shared_ptr<const DeviceMesh> pp;            // 1-D: pipeline stages
  std::shared_ptr<const DeviceMesh> tp;            // 1-D: tensor parallelism
  std::shared_ptr<const DeviceMesh> dp_replicate;  // 1-D: DDP, or HSDP's replicated dim
  // 1-D: FSDP's shards: dp_shard, or dp_shard x cp flattened (dp_shard_cp) with context
  // parallelism, whose ranks reduce gradients together.
  std::shared_ptr<const DeviceMesh> dp_shard;
  std::shared_ptr<const DeviceMesh> cp;  // 1-D: context parallelism (the sequence's shards)
  // What fully_shard shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP.
  std::shared_ptr<const DeviceMesh> fsdp;
  // Expert parallelism (parallel/ep), null unless ep > 1: ep ranks taken from the dp_shard
  // (x cp) ranks, each holding experts / ep of every MoE's experts; ep_shard, the other
  // dp_shard (x cp) ranks holding the same experts (with dp_replicate: every copy of them).
  std::shared_ptr<const DeviceMesh> ep;
  std::shared_ptr<const DeviceMesh> ep_shard;
  // What fully_shard shards the experts over: ep_shard, or (dp_replicate, ep_shard) for HSDP.
  std::shared_ptr<const DeviceMesh> ep_fsdp;
};

}  // namespace loom::parallel
