#include "parallel/ft/replicas.h"

#include <algorithm>

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::parallel::ft {

bool average_over_members(comm::ProcessGroup& group, const std::vector<Tensor>& grads, int members,
                          const Replicas::Agreement& agree, std::string& failure) {
  // One flat buffer per dtype (one all_reduce each; usually one); `grads` change only once every
  // rank of this replica succeeded (`agree`), so a retry starts from the same gradients
  // everywhere.
  std::vector<DType> dtypes;
  for (const Tensor& g : grads) {
    if (std::find(dtypes.begin(), dtypes.end(), g.dtype()) == dtypes.end()) {
      dtypes.push_back(g.dtype());
    }
  }
  std::vector<Tensor> buffers;
  for (const DType dtype : dtypes) {
    std::vector<Tensor> flat;
    for (const Tensor& g : grads) {
      if (g.dtype() == dtype) flat.push_back(ops::reshape(ops::contiguous(g), {g.numel()}));
    }
    buffers.push_back(ops::contiguous(ops::cat(flat, 0)));
  }
  bool ok = true;
  try {
    for (Tensor& buffer : buffers) group.all_reduce(buffer, comm::ReduceOp::kSum)->wait();
  } catch (const Error& e) {
    failure = e.what();
    ok = false;
  }
  if (agree) ok = agree(ok);
  if (!ok) return false;
  for (size_t d = 0; d < dtypes.size(); ++d) {
    const Tensor mean = ops::div(buffers[d], static_cast<double>(members));
    int64_t offset = 0;
    for (const Tensor& g : grads) {
      if (g.dtype() != dtypes[d]) continue;
      ops::copy_(g, ops::reshape(ops::narrow(mean, 0, offset, g.numel()), g.shape()));
      offset += g.numel();
    }
  }
  return true;
}

}  // namespace loom::parallel::ft
