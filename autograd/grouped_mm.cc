#include "autograd/grouped_mm.h"

#include "autograd/function.h"
#include "autograd/node.h"
#include "tensor/ops_grouped_mm.h"

namespace loom {

Tensor grouped_mm(const Tensor& x, const Tensor& w, std::vector<int64_t> offsets) {
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
