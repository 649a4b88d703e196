// Softmax, log-softmax, layer norm and RMS norm, with their backward kernels (tensor/ops_nn.h).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "tensor/cpu/norm_kernels.h"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/dispatch.h"
#include "tensor/op_device.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_nn.h"
#include "tensor/ops_nn_internal.h"

namespace loom::ops {

using nn_internal::as_f32;
using nn_internal::check_floating;

namespace {

// A contiguous tensor seen as (outer, n, inner) around the reduced dim: the elements of one row
// are `inner` apart, and row (o, i) starts at o * n * inner + i.
struct RowLayout {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
};

RowLayout row_layout(const Shape& shape, int64_t dim, std::string_view op) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  dim = normalize_dim(dim, ndim, op);
  RowLayout layout;
  if (ndim == 0) return layout;
  for (int64_t d = 0; d < dim; ++d) layout.outer *= shape[d];
  layout.n = shape[dim];
  for (int64_t d = dim + 1; d < ndim; ++d) layout.inner *= shape[d];
  return layout;
}

// Whether a norm can run on its tensors' own dtype (a GPU's kernels, or a meta trace of one):
// every defined tensor of one floating dtype, and f32 statistics. Otherwise it computes on f32
// copies and rounds back, as the CPU kernels always do.
bool in_own_dtype(Device device, const Tensor& x, std::initializer_list<Tensor> same,
                  std::initializer_list<Tensor> stats = {}) {
  if (allocates_like_cpu(device)) return false;
  for (const Tensor& t : same) {
    if (t.defined() && t.dtype() != x.dtype()) return false;
  }
  for (const Tensor& t : stats) {
    if (t.dtype() != kFloat32) return false;
  }
  return true;
}

const void* raw_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }
Tensor contiguous_or_none(const Tensor& t) { return t.defined() ? contiguous(t) : Tensor(); }

// Calls f(start, stride) for every row of the layout.
template <typename F>
void for_each_row(const RowLayout& l, F&& f) {
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) f(o * l.n * l.inner + i, l.inner);
  }
}

// softmax (log == false) or log_softmax (log == true) of x along dim, max-subtracted.
Tensor softmax_impl(const Tensor& x_in, int64_t dim, bool log, std::string_view op) {
  check_floating(x_in, op, "x");
  const RowLayout l = row_layout(x_in.shape(), dim, op);
  if (in_own_dtype(x_in.device(), x_in, {})) {  // a GPU's kernel, or a meta trace of it
    const Tensor x = contiguous(x_in);
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    if (x.device().is_cuda()) {
      cuda::kernels::softmax_forward(x.dtype(), out.raw_data(), x.raw_data(),
                                     {l.outer, l.n, l.inner}, log, x.device().index);
    }
    return out;
  }
  const Tensor x = as_f32(x_in);
  Tensor out = Tensor::empty(x.shape(), kFloat32, x.device());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  if (x.device().is_meta()) return to(out, x_in.dtype());  // the CPU's allocations, no values
  for_each_row(l, [&](int64_t start, int64_t stride) {
    const float* xr = px + start;
    float* orow = po + start;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < l.n; ++j) m = std::max(m, xr[j * stride]);
    double sum = 0.0;
    for (int64_t j = 0; j < l.n; ++j) {
      const float e = std::exp(xr[j * stride] - m);
      if (!log) orow[j * stride] = e;
      sum += e;
    }
    if (log) {
      const float lse = m + static_cast<float>(std::log(sum));
      for (int64_t j = 0; j < l.n; ++j) orow[j * stride] = xr[j * stride] - lse;
    } else {
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < l.n; ++j) orow[j * stride] *= inv;
    }
  });
  return to(out, x_in.dtype());
}

// Shared checks and layout of the two softmax backwards.
Tensor softmax_backward_impl(const Tensor& grad_out, const Tensor& out_in, int64_t dim, bool log,
                             std::string_view op) {
  check_floating(grad_out, op, "grad_out");
  check_floating(out_in, op, "out");
  LOOM_CHECK(grad_out.shape() == out_in.shape(),
             "{}: grad_out shape {} does not match out shape {}", op, shape_str(grad_out.shape()),
             shape_str(out_in.shape()));
  const RowLayout l = row_layout(out_in.shape(), dim, op);
  const Device device = op_device(op, {grad_out, out_in});
  if (in_own_dtype(device, out_in, {grad_out})) {  // a GPU's kernel, or a meta trace of it
    const Tensor g = contiguous(grad_out), y = contiguous(out_in);
    Tensor grad_x = Tensor::empty(y.shape(), y.dtype(), device);
    if (device.is_cuda()) {
      cuda::kernels::softmax_backward(y.dtype(), grad_x.raw_data(), g.raw_data(), y.raw_data(),
                                      {l.outer, l.n, l.inner}, log, device.index);
    }
    return grad_x;
  }
  const Tensor g = as_f32(grad_out);
  const Tensor y = as_f32(out_in);
  Tensor grad_x = Tensor::empty(y.shape(), kFloat32, device);
  const float* pg = g.data<float>();
  const float* py = y.data<float>();
  float* pd = grad_x.data<float>();
  if (device.is_meta()) return to(grad_x, out_in.dtype());  // the CPU's allocations, no values
  for_each_row(l, [&](int64_t start, int64_t stride) {
    const float* gr = pg + start;
    const float* yr = py + start;
    float* dr = pd + start;
    double acc = 0.0;
    if (log) {
      // d/dx_j of sum_i g_i (x_i - lse) = g_j - softmax_j * sum_i g_i, softmax = exp(out).
      for (int64_t j = 0; j < l.n; ++j) acc += gr[j * stride];
      const float s = static_cast<float>(acc);
      for (int64_t j = 0; j < l.n; ++j)
        dr[j * stride] = gr[j * stride] - std::exp(yr[j * stride]) * s;
    } else {
      for (int64_t j = 0; j < l.n; ++j) acc += static_cast<double>(gr[j * stride]) * yr[j * stride];
      const float s = static_cast<float>(acc);
      for (int64_t j = 0; j < l.n; ++j) dr[j * stride] = yr[j * stride] * (gr[j * stride] - s);
    }
  });
  return to(grad_x, out_in.dtype());
}

// Checks that `t`, when defined, is a floating tensor of shape `normalized_shape`.
void check_affine(const Tensor& t, const Shape& normalized_shape, std::string_view op,
                  std::string_view name) {
  if (!t.defined()) return;
  check_floating(t, op, name);
  LOOM_CHECK(t.shape() == normalized_shape, "{}: {} shape {} does not match normalized shape {}",
             op, name, shape_str(t.shape()), shape_str(normalized_shape));
}

// Checks normalized_shape against x's trailing dims; returns (rows, row length) and the stats'
// shape x.shape[:-len(normalized_shape)].
struct NormLayout {
  int64_t rows = 1;
  int64_t n = 1;
  Shape stats_shape;
};

NormLayout norm_layout(const Tensor& x, const Shape& normalized_shape, std::string_view op) {
  const size_t k = normalized_shape.size();
  LOOM_CHECK(k >= 1, "{}: normalized shape must have at least one dim, got () for input shape {}",
             op, shape_str(x.shape()));
  const bool fits =
      x.shape().size() >= k &&
      std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k);
  LOOM_CHECK(fits, "{}: normalized shape {} does not match the last dims of input shape {}", op,
             shape_str(normalized_shape), shape_str(x.shape()));
  NormLayout l;
  l.stats_shape.assign(x.shape().begin(), x.shape().end() - k);
  l.rows = shape_numel(l.stats_shape);
  l.n = shape_numel(normalized_shape);
  return l;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (auto out = dispatch_op(OpId::softmax, {x}, {dim})) return std::move((*out)[0]);
  return softmax_impl(x, dim, /*log=*/false, "softmax");
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (auto out = dispatch_op(OpId::log_softmax, {x}, {dim})) return std::move((*out)[0]);
  return softmax_impl(x, dim, /*log=*/true, "log_softmax");
}

Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  if (auto r = dispatch_op(OpId::softmax_backward, {grad_out, out}, {dim})) return (*r)[0];
  return softmax_backward_impl(grad_out, out, dim, /*log=*/false, "softmax_backward");
}

Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  if (auto r = dispatch_op(OpId::log_softmax_backward, {grad_out, out}, {dim})) return (*r)[0];
  return softmax_backward_impl(grad_out, out, dim, /*log=*/true, "log_softmax_backward");
}

LayerNormResult layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight,
                           const Tensor& bias, double eps) {
  if (auto r = dispatch_op(OpId::layer_norm, {x_in, weight, bias}, {normalized_shape, eps})) {
    return {(*r)[0], (*r)[1], (*r)[2]};
  }
  constexpr std::string_view op = "layer_norm";
  check_floating(x_in, op, "x");
  check_affine(weight, normalized_shape, op, "weight");
  check_affine(bias, normalized_shape, op, "bias");
  LOOM_CHECK(eps >= 0.0, "layer_norm: eps must be >= 0, got {} (input shape {})", eps,
             shape_str(x_in.shape()));
  const NormLayout l = norm_layout(x_in, normalized_shape, op);
  const Device device = op_device(op, {x_in, weight, bias});
  if (in_own_dtype(device, x_in, {weight, bias})) {
    const Tensor x = contiguous(x_in), w = contiguous_or_none(weight), b = contiguous_or_none(bias);
    Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
    Tensor mean = Tensor::empty(l.stats_shape, kFloat32, device);
    Tensor rstd = Tensor::empty(l.stats_shape, kFloat32, device);
    if (device.is_cuda()) {
      cuda::kernels::layer_norm_forward(
          x.dtype(), out.raw_data(), mean.data<float>(), rstd.data<float>(), x.raw_data(),
          raw_or_null(w), raw_or_null(b), l.rows, l.n, static_cast<float>(eps), device.index);
    }
    return {out, mean, rstd};
  }
  const Tensor x = as_f32(x_in);
  const Tensor w = weight.defined() ? as_f32(weight) : Tensor();
  const Tensor b = bias.defined() ? as_f32(bias) : Tensor();
  Tensor out = Tensor::empty(x.shape(), kFloat32, device);
  Tensor mean = Tensor::empty(l.stats_shape, kFloat32, device);
  Tensor rstd = Tensor::empty(l.stats_shape, kFloat32, device);
  const float* px = x.data<float>();
  const float* pw = w.defined() ? w.data<float>() : nullptr;
  const float* pb = b.defined() ? b.data<float>() : nullptr;
  float* po = out.data<float>();
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
  const int64_t n = l.n;
  if (!device.is_cpu()) {  // CUDA, or meta: the same outputs without the kernel
    if (device.is_cuda())
      cuda::kernels::layer_norm_forward(kFloat32, po, pm, pr, px, pw, pb, l.rows, n,
                                        static_cast<float>(eps), device.index);
    return {to(out, x_in.dtype()), mean, rstd};
  }
  cpu::layer_norm_forward_f32(px, pw, pb, po, pm, pr, l.rows, n, eps);
  return {to(out, x_in.dtype()), mean, rstd};
}

LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x_in, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& weight,
                                   const Shape& normalized_shape) {
  if (auto r = dispatch_op(OpId::layer_norm_backward, {grad_out, x_in, mean, rstd, weight},
                           {normalized_shape})) {
    return {(*r)[0], (*r)[1], (*r)[2]};
  }
  constexpr std::string_view op = "layer_norm_backward";
  check_floating(grad_out, op, "grad_out");
  check_floating(x_in, op, "x");
  check_floating(mean, op, "mean");
  check_floating(rstd, op, "rstd");
  check_affine(weight, normalized_shape, op, "weight");
  const NormLayout l = norm_layout(x_in, normalized_shape, op);
  LOOM_CHECK(grad_out.shape() == x_in.shape(), "{}: grad_out shape {} does not match x shape {}",
             op, shape_str(grad_out.shape()), shape_str(x_in.shape()));
  LOOM_CHECK(mean.shape() == l.stats_shape && rstd.shape() == l.stats_shape,
             "{}: mean shape {} and rstd shape {} must both be {} for x shape {} and normalized "
             "shape {}",
             op, shape_str(mean.shape()), shape_str(rstd.shape()), shape_str(l.stats_shape),
             shape_str(x_in.shape()), shape_str(normalized_shape));
  const Device device = op_device(op, {grad_out, x_in, mean, rstd, weight});
  if (in_own_dtype(device, x_in, {grad_out, weight}, {mean, rstd})) {
    const Tensor g = contiguous(grad_out), x = contiguous(x_in), mu = contiguous(mean),
                 rs = contiguous(rstd), w = contiguous_or_none(weight);
    LayerNormGrads grads;
    grads.grad_x = Tensor::empty(x.shape(), x.dtype(), device);
    Tensor gw, gb;  // f32 sums, rounded once to the weight's dtype
    if (w.defined()) {
      gw = Tensor::empty(normalized_shape, kFloat32, device);
      gb = Tensor::empty(normalized_shape, kFloat32, device);
    }
    if (device.is_cuda()) {
      cuda::kernels::layer_norm_backward(
          x.dtype(), grads.grad_x.raw_data(), w.defined() ? gw.data<float>() : nullptr,
          w.defined() ? gb.data<float>() : nullptr, g.raw_data(), x.raw_data(), mu.data<float>(),
          rs.data<float>(), raw_or_null(w), l.rows, l.n, device.index);
    }
    if (w.defined()) {
      grads.grad_weight = to(gw, weight.dtype());
      grads.grad_bias = to(gb, weight.dtype());
    }
    return grads;
  }
  const Tensor g = as_f32(grad_out);
  const Tensor x = as_f32(x_in);
  const Tensor mu = as_f32(mean);
  const Tensor rs = as_f32(rstd);
  const Tensor w = weight.defined() ? as_f32(weight) : Tensor();
  const float* pg = g.data<float>();
  const float* px = x.data<float>();
  const float* pm = mu.data<float>();
  const float* pr = rs.data<float>();
  const float* pw = w.defined() ? w.data<float>() : nullptr;
  const int64_t n = l.n;
  Tensor grad_x = Tensor::empty(x.shape(), kFloat32, device);
  float* pd = grad_x.data<float>();
  if (!device.is_cpu()) {  // CUDA, or meta: the same outputs without the kernel
    LayerNormGrads grads;
    Tensor gw_out, gb_out;
    if (w.defined()) {
      gw_out = Tensor::empty(normalized_shape, kFloat32, device);
      gb_out = Tensor::empty(normalized_shape, kFloat32, device);
    }
    if (device.is_cuda())
      cuda::kernels::layer_norm_backward(kFloat32, pd, pw ? gw_out.data<float>() : nullptr,
                                         pw ? gb_out.data<float>() : nullptr, pg, px, pm, pr, pw,
                                         l.rows, n, device.index);
    grads.grad_x = to(grad_x, x_in.dtype());
    if (w.defined()) {
      grads.grad_weight = to(gw_out, weight.dtype());
      grads.grad_bias = to(gb_out, weight.dtype());
    }
    return grads;
  }
  LayerNormGrads grads;
  Tensor gw_out, gb_out;
  if (w.defined()) {
    gw_out = Tensor::empty(normalized_shape, kFloat32);
    gb_out = Tensor::empty(normalized_shape, kFloat32);
  }
  cpu::layer_norm_backward_f32(pg, px, pm, pr, pw, pd, pw ? gw_out.data<float>() : nullptr,
                               pw ? gb_out.data<float>() : nullptr, l.rows, n);
  grads.grad_x = to(grad_x, x_in.dtype());
  if (w.defined()) {
    grads.grad_weight = to(gw_out, weight.dtype());
    grads.grad_bias = to(gb_out, weight.dtype());
  }
  return grads;
}

RMSNormResult rms_norm(const Tensor& x_in, const Tensor& weight, double eps) {
  if (auto r = dispatch_op(OpId::rms_norm, {x_in, weight}, {eps})) return {(*r)[0], (*r)[1]};
  constexpr std::string_view op = "rms_norm";
  check_floating(x_in, op, "x");
  LOOM_CHECK(x_in.dim() >= 1, "rms_norm: x must have at least one dim, got shape {}",
             shape_str(x_in.shape()));
  const Shape normalized{x_in.size(-1)};
  check_affine(weight, normalized, op, "weight");
  LOOM_CHECK(eps >= 0.0, "rms_norm: eps must be >= 0, got {} (input shape {})", eps,
             shape_str(x_in.shape()));
  const NormLayout l = norm_layout(x_in, normalized, op);
  const Device device = op_device(op, {x_in, weight});
  if (in_own_dtype(device, x_in, {weight})) {
    const Tensor x = contiguous(x_in), w = contiguous_or_none(weight);
    Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
    Tensor rstd = Tensor::empty(l.stats_shape, kFloat32, device);
    if (device.is_cuda()) {
      cuda::kernels::rms_norm_forward(x.dtype(), out.raw_data(), rstd.data<float>(), x.raw_data(),
                                      raw_or_null(w), l.rows, l.n, static_cast<float>(eps),
                                      device.index);
    }
    return {out, rstd};
  }
  const Tensor x = as_f32(x_in);
  const Tensor w = weight.defined() ? as_f32(weight) : Tensor();
  Tensor out = Tensor::empty(x.shape(), kFloat32, device);
  Tensor rstd = Tensor::empty(l.stats_shape, kFloat32, device);
  const float* px = x.data<float>();
  const float* pw = w.defined() ? w.data<float>() : nullptr;
  float* po = out.data<float>();
  float* pr = rstd.data<float>();
  const int64_t n = l.n;
  if (!device.is_cpu()) {  // CUDA, or meta: the same outputs without the kernel
    if (device.is_cuda())
      cuda::kernels::rms_norm_forward(kFloat32, po, pr, px, pw, l.rows, n, static_cast<float>(eps),
                                      device.index);
    return {to(out, x_in.dtype()), rstd};
  }
  cpu::rms_norm_forward_f32(px, pw, po, pr, l.rows, n, eps);
  return {to(out, x_in.dtype()), rstd};
}

RMSNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x_in, const Tensor& rstd,
                               const Tensor& weight) {
  if (auto r = dispatch_op(OpId::rms_norm_backward, {grad_out, x_in, rstd, weight})) {
    return {(*r)[0], (*r)[1]};
  }
  constexpr std::string_view op = "rms_norm_backward";
  check_floating(grad_out, op, "grad_out");
  check_floating(x_in, op, "x");
  check_floating(rstd, op, "rstd");
  const Shape normalized{x_in.size(-1)};
  check_affine(weight, normalized, op, "weight");
  const NormLayout l = norm_layout(x_in, normalized, op);
  LOOM_CHECK(grad_out.shape() == x_in.shape() && rstd.shape() == l.stats_shape,
             "{}: grad_out shape {} and rstd shape {} must be {} and {}", op,
             shape_str(grad_out.shape()), shape_str(rstd.shape()), shape_str(x_in.shape()),
             shape_str(l.stats_shape));
  const Device device = op_device(op, {grad_out, x_in, rstd, weight});
  if (in_own_dtype(device, x_in, {grad_out, weight}, {rstd})) {
    const Tensor g = contiguous(grad_out), x = contiguous(x_in), rs = contiguous(rstd),
                 w = contiguous_or_none(weight);
    RMSNormGrads grads{Tensor::empty(x.shape(), x.dtype(), device), Tensor()};
    Tensor gw = w.defined() ? Tensor::empty(normalized, kFloat32, device) : Tensor();
    if (device.is_cuda()) {
      cuda::kernels::rms_norm_backward(
          x.dtype(), grads.grad_x.raw_data(), w.defined() ? gw.data<float>() : nullptr,
          g.raw_data(), x.raw_data(), rs.data<float>(), raw_or_null(w), l.rows, l.n, device.index);
    }
    if (w.defined()) grads.grad_weight = to(gw, weight.dtype());
    return grads;
  }
  const Tensor g = as_f32(grad_out), x = as_f32(x_in), rs = as_f32(rstd);
  const Tensor w = weight.defined() ? as_f32(weight) : Tensor();
  Tensor grad_x = Tensor::empty(x.shape(), kFloat32, device);
  const float* pg = g.data<float>();
  const float* px = x.data<float>();
  const float* pr = rs.data<float>();
  const float* pw = w.defined() ? w.data<float>() : nullptr;
  float* pd = grad_x.data<float>();
  const int64_t n = l.n;
  if (!device.is_cpu()) {  // CUDA, or meta: the same outputs without the kernel
    RMSNormGrads grads{Tensor(), Tensor()};
    Tensor gw_out = w.defined() ? Tensor::empty(normalized, kFloat32, device) : Tensor();
    if (device.is_cuda())
      cuda::kernels::rms_norm_backward(kFloat32, pd, pw ? gw_out.data<float>() : nullptr, pg, px,
                                       pr, pw, l.rows, n, device.index);
    grads.grad_x = to(grad_x, x_in.dtype());
    if (w.defined()) grads.grad_weight = to(gw_out, weight.dtype());
    return grads;
  }
  RMSNormGrads grads{Tensor(), Tensor()};
  Tensor gw_out = w.defined() ? Tensor::empty(normalized, kFloat32, device) : Tensor();
  cpu::rms_norm_backward_f32(pg, px, pr, pw, pd, pw ? gw_out.data<float>() : nullptr, l.rows, n);
  grads.grad_x = to(grad_x, x_in.dtype());
  if (w.defined()) grads.grad_weight = to(gw_out, weight.dtype());
  return grads;
}

}  // namespace loom::ops
