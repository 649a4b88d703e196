#include "parallel/ft/replicas.h"

#include "base/error.h"
#include "tensor/ops.h"

namespace loom::parallel::ft {

bool average_over_members(comm::ProcessGroup& group, const std::vector<Tensor>& grads, int members,
                          const Replicas::Agreement& agree, std::string& failure) {
  // One flat buffer: one all_reduce; `grads` change only once every rank of this replica
  // succeeded (`agree`), so a retry starts from the same gradients everywhere.
  std::vector<Tensor> flat;
  for (const Tensor& g : grads) flat.push_back(ops::reshape(ops::contiguous(g), {g.numel()}));
  Tensor buffer = ops::contiguous(ops::cat(flat, 0));
  bool ok = true;
  try {
    group.all_reduce(buffer, comm::ReduceOp::kSum)->wait();
  } catch (const Error& e) {
    failure = e.what();
    ok = false;
  }
  if (agree) ok = agree(ok);
  if (!ok) return false;
  buffer = ops::div(buffer, static_cast<double>(members));
  int64_t offset = 0;
  for (const Tensor& g : grads) {
    ops::copy_(g, ops::reshape(ops::narrow(buffer, 0, offset, g.numel()), g.shape()));
    offset += g.numel();
  }
  return true;
}

}  // namespace loom::parallel::ft
