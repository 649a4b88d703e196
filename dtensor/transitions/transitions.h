// One function per redistribute step kind, acting on this rank's local shard along one mesh
// dim. `dim_size` is the size of `tensor_dim` at this mesh dim: the chunk that the outer mesh
// dims leave (the full size when none of them shards it). `mesh_dim`'s group communicates.
#pragma once

#include <vector>

#include "comm/process_group.h"
#include "comm/types.h"
#include "tensor/tensor.h"

namespace loom::transitions {

struct MeshDimContext {
  comm::ProcessGroup& group;  // the mesh dim's group
  int64_t coordinate;         // this rank's index along the mesh dim
  int64_t count;              // the mesh dim's size
  // The group rank of each coordinate (DeviceMesh::group_ranks_by_coordinate): collectives take
  // per-rank lists in group-rank order, chunks are numbered by coordinate.
  const std::vector<int>& group_ranks;
};

// `per_coordinate` (entry c for coordinate c) in the group-rank order a collective expects.
inline std::vector<Tensor> in_group_rank_order(const std::vector<Tensor>& per_coordinate,
                                               const MeshDimContext& ctx) {
  std::vector<Tensor> out(per_coordinate.size());
  for (size_t c = 0; c < per_coordinate.size(); ++c) out[ctx.group_ranks[c]] = per_coordinate[c];
  return out;
}

// S(d) -> R: all-gather the (possibly uneven) chunks of `tensor_dim`.
Tensor shard_to_replicate(const Tensor& local, const MeshDimContext& ctx, int64_t tensor_dim,
                          int64_t dim_size);
// P(op) -> R: all-reduce.
Tensor partial_to_replicate(const Tensor& local, const MeshDimContext& ctx, comm::ReduceOp op);
// P(op) -> S(d): reduce-scatter this rank's chunk of `tensor_dim`.
Tensor partial_to_shard(const Tensor& local, const MeshDimContext& ctx, comm::ReduceOp op,
                        int64_t tensor_dim, int64_t dim_size);
// S(a) -> S(b): all-to-all; `from_size` / `to_size` are the sizes of dims a and b at this mesh dim.
Tensor shard_to_shard(const Tensor& local, const MeshDimContext& ctx, int64_t from_dim,
                      int64_t from_size, int64_t to_dim, int64_t to_size);
// R -> S(d): this rank's chunk, no communication.
Tensor replicate_to_shard(const Tensor& local, const MeshDimContext& ctx, int64_t tensor_dim,
                          int64_t dim_size);
// R -> P(op): sum keeps the value on coordinate 0 and zeros elsewhere; avg/max/min keep it
// everywhere.
Tensor replicate_to_partial(const Tensor& local, const MeshDimContext& ctx, comm::ReduceOp op);

}  // namespace loom::transitions
