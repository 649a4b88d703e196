// The two transitions that need no communication.
#include "dtensor/shard_math.h"
#include "dtensor/transitions/transitions.h"
#include "tensor/ops.h"

namespace loom::transitions {

Tensor replicate_to_shard(const Tensor& local, const MeshDimContext& ctx, int64_t tensor_dim,
                          int64_t dim_size) {
  const ShardRange mine = shard_range(dim_size, ctx.count, ctx.coordinate);
  return ops::contiguous(ops::narrow(local, tensor_dim, mine.offset, mine.size));
}

Tensor replicate_to_partial(const Tensor& local, const MeshDimContext& ctx, comm::ReduceOp op) {
  if (op == comm::ReduceOp::kSum && ctx.coordinate != 0) return ops::zeros_like(local);
  return local;
}

}  // namespace loom::transitions
