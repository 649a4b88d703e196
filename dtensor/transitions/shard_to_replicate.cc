#include "base/error.h"
#include "dtensor/shard_math.h"
#include "dtensor/transitions/layout.h"
#include "dtensor/transitions/transitions.h"
#include "tensor/ops.h"

namespace loom::transitions {

Tensor shard_to_replicate(const Tensor& local, const MeshDimContext& ctx, int64_t tensor_dim,
                          int64_t dim_size) {
  if (tensor_dim > 0 && dim_size % ctx.count == 0) {
    // Even chunks: each rank's contiguous shard lands as it is, stacked in front; one copy puts
    // the stack in place.
    LOOM_CHECK(local.size(tensor_dim) == dim_size / ctx.count,
               "redistribute Shard({}) -> Replicate: this rank's local shard has {} along dim {}, "
               "expected {} (a global size of {} over {} ranks); the local tensor does not match "
               "its DTensor's shape",
               tensor_dim, local.size(tensor_dim), tensor_dim, dim_size / ctx.count, dim_size,
               ctx.count);
    const Tensor input = ops::contiguous(local);
    Shape stacked_shape{ctx.count};
    stacked_shape.insert(stacked_shape.end(), local.shape().begin(), local.shape().end());
    Tensor stacked = ops::empty(stacked_shape, local.dtype(), local.device());
    std::vector<Tensor> outputs;
    for (int64_t c = 0; c < ctx.count; ++c) {
      outputs.push_back(ops::reshape(ops::narrow(stacked, 0, c, 1), local.shape()));
    }
    ctx.group.all_gather(in_group_rank_order(outputs, ctx), input)->wait();
    return chunks_from_front(stacked, tensor_dim);
  }
  const Tensor input = dim_to_front(local, tensor_dim);
  // The chunks land in place in one buffer (each a contiguous block of its leading dim), so no
  // concatenation copies them again: the gathered tensor is written once.
  Tensor gathered =
      ops::empty(front_shape(local.shape(), tensor_dim, dim_size), local.dtype(), local.device());
  std::vector<Tensor> outputs;
  for (int64_t c = 0; c < ctx.count; ++c) {
    const ShardRange range = shard_range(dim_size, ctx.count, c);
    outputs.push_back(ops::narrow(gathered, 0, range.offset, range.size));
  }
  ctx.group.all_gather(in_group_rank_order(outputs, ctx), input)->wait();
  return dim_from_front(gathered, tensor_dim);
}

}  // namespace loom::transitions
