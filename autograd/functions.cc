#include "autograd/functions.h"

#include "autograd/function.h"
#include "base/error.h"
#include "tensor/grad_mode.h"

namespace loom {

Tensor detach(const Tensor& self) {
  Tensor out = ops::alias(self);
  // A wrapper's detached handle wraps the same data (detach of a DTensor is a DTensor with its
  // placements, as torch's); ops::alias alone is a plain handle onto the wrapper's bytes.
  out.impl()->extension = self.extension();
  return out;
}

std::vector<Tensor> unbind(const Tensor& self, int64_t dim) {
  LOOM_CHECK(self.defined(), "unbind: the tensor is undefined");
  LOOM_CHECK(self.dim() >= 1 && dim >= -self.dim() && dim < self.dim(),
             "unbind: dim {} is out of range for a tensor of shape {} (expected [{}, {}))", dim,
             shape_str(self.shape()), -self.dim(), self.dim());
  const int64_t d = dim < 0 ? dim + self.dim() : dim;
  std::vector<Tensor> slices;
  {
    BelowAutogradGuard below;  // the narrows must not record nodes of their own
    for (int64_t i = 0; i < self.size(d); ++i) {
      slices.push_back(ops::squeeze(ops::narrow(self, d, i, 1), d));
    }
  }
  const std::vector<Tensor> raw = slices;  // for zeros_like: the closure may keep raw outputs
  return autograd::record(
      "UnbindBackward", std::span<const Tensor>(&self, 1), std::move(slices),
      [raw, d](const std::vector<Tensor>& grads) {
        std::vector<Tensor> parts;
        for (size_t i = 0; i < raw.size(); ++i) {
          parts.push_back(grads[i].defined() ? grads[i] : ops::zeros_like(raw[i]));
        }
        // Gradients already written side by side (the fused attention's dq, dk, dv) stack as
        // a view; others are copied together.
        Tensor stacked = ops::stacked_view(parts, d);
        return std::vector<Tensor>{stacked.defined() ? stacked : ops::stack(parts, d)};
      });
}

}  // namespace loom
