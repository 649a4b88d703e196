#include "base/error.h"
#include "dtensor/shard_math.h"
#include "dtensor/transitions/layout.h"
#include "dtensor/transitions/transitions.h"
#include "tensor/ops.h"

namespace loom::transitions {

Tensor shard_to_replicate(const Tensor& local, const MeshDimContext& ctx, int64_t tensor_dim,
                          int64_t dim_size) {
  const Tensor input = dim_to_front(local, tensor_dim);
  std::vector<Tensor> outputs;
  for (int64_t c = 0; c < ctx.count; ++c) {
    const int64_t size = shard_range(dim_size, ctx.count, c).size;
    outputs.push_back(
        ops::empty(front_shape(local.shape(), tensor_dim, size), local.dtype(), local.device()));
  }
  ctx.group.all_gather(in_group_rank_order(outputs, ctx), input)->wait();
  return dim_from_front(ops::cat(outputs, 0), tensor_dim);
}

}  // namespace loom::transitions
