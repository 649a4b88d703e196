#include "parallel/tp/loss_parallel.h"

#include "autograd/functions_nn.h"
#include "base/error.h"
#include "dtensor/dtensor.h"

namespace loom::tp {

Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                   int64_t ignore_index) {
  const DTensorSpec& spec = dtensor_spec(logits, "loss_parallel_cross_entropy");
  LOOM_CHECK(!is_dtensor(targets),
             "loss_parallel_cross_entropy: expected plain targets (the same on every rank), got {}",
             targets.description());
  const Tensor replicated =
      from_local(targets, spec.mesh, Placements(spec.mesh->ndim(), Replicate()));
  return full_tensor(cross_entropy(logits, replicated, ignore_index));
}

}  // namespace loom::tp
