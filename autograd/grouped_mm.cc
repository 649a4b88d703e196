#include "autograd/grouped_mm.h"

#include "autograd/function.h"
#include "autograd/node.h"
#include "base/error.h"
#include "tensor/ops_grouped_mm.h"

namespace loom {

Tensor grouped_mm(const Tensor& x, const Tensor& w, std::vector<int64_t> offsets) {
  for (const Tensor* t : {&x, &w}) {
    LOOM_CHECK(!t->defined() || t->extension() == nullptr,
               "grouped_mm: {} is a wrapper tensor (a DTensor: {}); the groups' products run on "
               "this process's tensors: pass local tensors (to_local; expert parallelism's "
               "weights are read through GroupedExperts' weight view)",
               t == &x ? "x" : "w", t->description());
  }
  Tensor y = ops::grouped_mm(x, w, offsets, /*transpose_b=*/true);
  return autograd::record("GroupedMm", {x, w}, std::move(y),
                          [x, w, offsets = std::move(offsets)](const std::vector<Tensor>& grads) {
                            const Tensor& dy = grads[0];
                            return std::vector<Tensor>{
                                ops::grouped_mm(dy, w, offsets, /*transpose_b=*/false),
                                ops::grouped_mm_weight_grad(dy, x, offsets)};
                          });
}

}  // namespace loom
