#include "dtensor/shard_math.h"
#include "dtensor/transitions/layout.h"
#include "dtensor/transitions/transitions.h"
#include "tensor/ops.h"

namespace loom::transitions {

// The rank at coordinate c holds chunk c of `from_dim` (whole `to_dim`); it sends rank j the piece
// of its chunk that falls in chunk j of `to_dim`, and receives from every rank c the piece (chunk c
// of from_dim) x (its own chunk of to_dim), which it concatenates along from_dim.
Tensor shard_to_shard(const Tensor& local, const MeshDimContext& ctx, int64_t from_dim,
                      int64_t from_size, int64_t to_dim, int64_t to_size) {
  std::vector<Tensor> inputs, outputs;
  const ShardRange mine = shard_range(to_size, ctx.count, ctx.coordinate);
  for (int64_t j = 0; j < ctx.count; ++j) {
    const ShardRange piece = shard_range(to_size, ctx.count, j);
    inputs.push_back(ops::contiguous(ops::narrow(local, to_dim, piece.offset, piece.size)));
    Shape shape = local.shape();
    shape[from_dim] = shard_range(from_size, ctx.count, j).size;
    shape[to_dim] = mine.size;
    outputs.push_back(ops::empty(shape, local.dtype(), local.device()));
  }
  ctx.group.all_to_all(in_group_rank_order(outputs, ctx), in_group_rank_order(inputs, ctx))->wait();
  return ops::cat(outputs, from_dim);
}

}  // namespace loom::transitions
