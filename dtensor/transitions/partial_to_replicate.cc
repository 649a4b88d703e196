#include "dtensor/transitions/transitions.h"
#include "tensor/ops.h"

namespace loom::transitions {

Tensor partial_to_replicate(const Tensor& local, const MeshDimContext& ctx, comm::ReduceOp op) {
  Tensor out = ops::clone(local);
  ctx.group.all_reduce(out, op)->wait();
  return out;
}

}  // namespace loom::transitions
