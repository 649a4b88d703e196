// Rotary position embeddings (tensor/ops_nn.h's rope): one pass over x, no tables broadcast to
// x's shape and no halves concatenated, where the composed form (narrow, four muls, cat) made
// five temporaries the size of x.
#include <string_view>

#include "base/error.h"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/device.h"
#include "tensor/dispatch.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_nn_internal.h"

namespace loom::ops {

using nn_internal::as_f32;
using nn_internal::check_floating;

Tensor rope(const Tensor& x_in, const Tensor& cos, const Tensor& sin, bool inverse) {
  if (auto r = dispatch_op(OpId::rope, {x_in, cos, sin}, {inverse})) return (*r)[0];
  constexpr std::string_view op = "rope";
  check_floating(x_in, op, "x");
  check_floating(cos, op, "cos");
  check_floating(sin, op, "sin");
  LOOM_CHECK(x_in.dim() >= 3 && x_in.size(-1) % 2 == 0,
             "rope: x must be (..., T, heads, head_dim) with an even head_dim (pairs (2i, 2i+1) "
             "rotate together), got shape {}",
             shape_str(x_in.shape()));
  const int64_t time = x_in.size(-3), heads = x_in.size(-2), half = x_in.size(-1) / 2;
  const Shape table{time, half};
  LOOM_CHECK(cos.shape() == table && sin.shape() == table,
             "rope: cos and sin must be (T, head_dim / 2) = {} for x of shape {}, got {} and {} "
             "(narrow the tables to the sequence's positions)",
             shape_str(table), shape_str(x_in.shape()), shape_str(cos.shape()),
             shape_str(sin.shape()));
  const Device device = op_device(op, {x_in, cos, sin});
  const int64_t pairs = time * heads * half;
  if (!allocates_like_cpu(device)) {
    // A GPU's kernel (or a meta trace of one) takes x in its own dtype, the tables in f32.
    const Tensor x = contiguous(x_in), c = as_f32(cos), s = as_f32(sin);
    Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
    if (device.is_cuda()) {
      cuda::kernels::rope_forward(x.dtype(), out.raw_data(), x.raw_data(), c.data<float>(),
                                  s.data<float>(), pairs == 0 ? 0 : x.numel() / (pairs * 2), time,
                                  heads, half, inverse, device.index);
    }
    return out;
  }
  const Tensor x = as_f32(x_in), c = as_f32(cos), s = as_f32(sin);
  Tensor out = Tensor::empty(x.shape(), kFloat32, device);
  const int64_t outer = time * heads * half == 0 ? 0 : x.numel() / (time * heads * half * 2);
  const float* px = x.data<float>();
  const float* pc = c.data<float>();
  const float* ps = s.data<float>();
  float* po = out.data<float>();
  if (!device.is_cpu()) return to(out, x_in.dtype());  // meta traced as a CPU: no kernel
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < time; ++t) {
      const float* ct = pc + t * half;
      const float* st = ps + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((o * time + t) * heads + h) * half * 2;
        const float* xr = px + base;
        float* orow = po + base;
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = xr[2 * i], x1 = xr[2 * i + 1], sn = sign * st[i];
          orow[2 * i] = x0 * ct[i] - x1 * sn;
          orow[2 * i + 1] = x0 * sn + x1 * ct[i];
        }
      }
    }
  }
  return to(out, x_in.dtype());
}

}  // namespace loom::ops
