#include "dtensor/shard_math.h"
#include "dtensor/transitions/layout.h"
#include "dtensor/transitions/transitions.h"
#include "tensor/ops.h"

namespace loom::transitions {

Tensor partial_to_shard(const Tensor& local, const MeshDimContext& ctx, comm::ReduceOp op,
                        int64_t tensor_dim, int64_t dim_size) {
  if (tensor_dim > 0 && dim_size % ctx.count == 0) {
    // Even chunks: one copy stacks them in front; this rank's chunk comes out in place.
    const Tensor stacked = chunks_to_front(local, tensor_dim, ctx.count);
    Shape chunk = local.shape();
    chunk[tensor_dim] = dim_size / ctx.count;
    std::vector<Tensor> inputs;
    for (int64_t c = 0; c < ctx.count; ++c) {
      inputs.push_back(ops::reshape(ops::narrow(stacked, 0, c, 1), chunk));
    }
    Tensor output = ops::empty(chunk, local.dtype(), local.device());
    ctx.group.reduce_scatter(output, in_group_rank_order(inputs, ctx), op)->wait();
    return output;
  }
  const Tensor front = dim_to_front(local, tensor_dim);
  std::vector<Tensor> inputs;
  for (int64_t c = 0; c < ctx.count; ++c) {
    const ShardRange range = shard_range(dim_size, ctx.count, c);
    inputs.push_back(ops::narrow(front, 0, range.offset, range.size));  // contiguous: leading dim
  }
  const ShardRange mine = shard_range(dim_size, ctx.count, ctx.coordinate);
  Tensor output =
      ops::empty(front_shape(local.shape(), tensor_dim, mine.size), local.dtype(), local.device());
  ctx.group.reduce_scatter(output, in_group_rank_order(inputs, ctx), op)->wait();
  return dim_from_front(output, tensor_dim);
}

}  // namespace loom::transitions
