#include "tensor/ops_reduce.h"

#include <fmt/ranges.h>

#include <limits>
#include <type_traits>

#include "base/error.h"
#include "tensor/cpu/element_types.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cpu/sum_kernels.h"
#include "tensor/dispatch.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_views.h"

namespace loom::ops {

namespace {

// Normalized, deduplicated reduction mask over self's dims (all dims when `dims` is empty).
std::vector<bool> reduced_mask(const Tensor& self, const std::vector<int64_t>& dims,
                               std::string_view op) {
  std::vector<bool> mask(self.dim(), dims.empty());
  for (int64_t d : dims) {
    const int64_t n = normalize_dim(d, self.dim(), op);
    if (self.dim() == 0) continue;
    LOOM_CHECK(!mask[n], "{}: dim {} appears twice in ({})", op, n, fmt::join(dims, ", "));
    mask[n] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// A contiguous f32 sum whose reduced dims are all leading (column sums), all trailing (row
// sums) or all dims, into `acc` (f64, one per kept element): the vectorized, threaded kernels
// (cpu/sum_kernels.h). False when the layout is another (the generic loop then runs).
bool fast_f32_sum(const Tensor& self, const std::vector<bool>& mask, std::vector<double>& acc) {
  if (self.dtype() != kFloat32 || !self.is_contiguous() || self.numel() == 0) return false;
  // The non-unit dims as runs of reduced / kept dims: [R R K] is {(reduced, n0 n1), (kept, n2)}.
  std::vector<std::pair<bool, int64_t>> runs;
  for (size_t d = 0; d < mask.size(); ++d) {
    const int64_t size = self.shape()[d];
    if (size == 1) continue;
    if (!runs.empty() && runs.back().first == mask[d]) {
      runs.back().second *= size;
    } else {
      runs.emplace_back(mask[d], size);
    }
  }
  const float* x = self.data<float>();
  if (runs.size() == 1 && runs[0].first) {
    acc.assign(1, cpu::sum_f32(x, self.numel()));
    return true;
  }
  if (runs.size() != 2) return false;
  const int64_t rows = runs[0].second, cols = runs[1].second;
  if (runs[0].first) {
    acc.resize(static_cast<size_t>(cols));
    cpu::column_sums_f32(x, rows, cols, acc.data());
  } else {
    acc.resize(static_cast<size_t>(rows));
    cpu::row_sums_f32(x, rows, cols, acc.data());
  }
  return true;
}

}  // namespace

Tensor sum(const Tensor& self, const std::vector<int64_t>& dims, bool keepdim) {
  if (auto out = dispatch_op(OpId::sum, {self}, {dims, keepdim})) return std::move((*out)[0]);
  const auto mask = reduced_mask(self, dims, "sum");
  if (self.device().is_meta()) {  // shapes only (tensor/device.h)
    return Tensor::empty(reduced_shape(self.shape(), mask, keepdim), self.dtype(), self.device());
  }
  if (self.device().is_cuda()) return cuda_backend::sum(self, mask, keepdim, 1.0);
  const Shape kept = reduced_shape(self.shape(), mask, /*keepdim=*/true);
  // Accumulator strides: contiguous over kept dims, 0 over reduced ones.
  Strides acc_strides = contiguous_strides(kept);
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) acc_strides[d] = 0;
  }
  Tensor out = Tensor::empty(reduced_shape(self.shape(), mask, keepdim), self.dtype());
  if (std::vector<double> acc; fast_f32_sum(self, mask, acc)) {
    float* o = out.data<float>();
    for (size_t i = 0; i < acc.size(); ++i) o[i] = static_cast<float>(acc[i]);
    return out;
  }
  cpu::visit_dtype(self.dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Floating sums accumulate in f64; integer sums in i64, exactly (a double would round i64
    // values above 2^53).
    using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    std::vector<Acc> acc(shape_numel(kept), Acc{0});
    const T* in = static_cast<const T*>(self.raw_data());
    cpu::for_each_run<2>(self.shape(), {acc_strides, self.strides()},
                         [&](const auto& off, int64_t count, const auto& st) {
                           Acc* a = acc.data() + off[0];
                           const T* x = in + off[1];
                           if (st[0] == 0) {
                             Acc s = 0;
                             for (int64_t j = 0; j < count; ++j)
                               s += static_cast<Acc>(cpu::to_compute(x[j * st[1]]));
                             *a += s;
                           } else {
                             for (int64_t j = 0; j < count; ++j)
                               a[j * st[0]] += static_cast<Acc>(cpu::to_compute(x[j * st[1]]));
                           }
                         });
    T* o = static_cast<T*>(out.raw_data());
    for (size_t i = 0; i < acc.size(); ++i) o[i] = cpu::from_compute<T>(acc[i]);
  });
  return out;
}

Tensor mean(const Tensor& self, const std::vector<int64_t>& dims, bool keepdim) {
  if (auto out = dispatch_op(OpId::mean, {self}, {dims, keepdim})) return std::move((*out)[0]);
  LOOM_CHECK(is_floating(self.dtype()), "mean: expected a floating tensor, got dtype {}",
             dtype_name(self.dtype()));
  const auto mask = reduced_mask(self, dims, "mean");
  int64_t count = 1;
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) count *= self.shape()[d];
  }
  if (self.device().is_meta()) {
    return Tensor::empty(reduced_shape(self.shape(), mask, keepdim), self.dtype(), self.device());
  }
  if (self.device().is_cuda()) {
    return cuda_backend::sum(self, mask, keepdim, 1.0 / static_cast<double>(count));
  }
  const Tensor total = sum(self, dims, keepdim);
  // Divide in f64 before rounding to the output dtype.
  Tensor out = Tensor::empty(total.shape(), total.dtype());
  cpu::visit_dtype(total.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(total.raw_data());
    T* o = static_cast<T*>(out.raw_data());
    for (int64_t i = 0; i < total.numel(); ++i) {
      o[i] = cpu::from_compute<T>(static_cast<double>(cpu::to_compute(s[i])) /
                                  static_cast<double>(count));
    }
  });
  return out;
}

std::pair<Tensor, Tensor> max(const Tensor& self, int64_t dim, bool keepdim) {
  if (auto out = dispatch_op(OpId::max_dim, {self}, {dim, keepdim})) return {(*out)[0], (*out)[1]};
  dim = normalize_dim(dim, self.dim(), "max");
  LOOM_CHECK(self.dim() == 0 || self.shape()[dim] > 0,
             "max: cannot reduce over dim {} of size 0 (tensor shape {})", dim,
             shape_str(self.shape()));
  const Tensor moved = self.dim() == 0 ? reshape(self, {1}) : contiguous(transpose(self, dim, -1));
  const int64_t row = moved.shape().back();
  const int64_t rows = moved.numel() / std::max<int64_t>(row, 1);
  Shape out_shape = self.shape();
  if (self.dim() > 0) {
    if (keepdim)
      out_shape[dim] = 1;
    else
      out_shape.erase(out_shape.begin() + dim);
  }
  // Results come out in the moved layout (dim last); build them there, then move back.
  Shape moved_out = moved.shape();
  moved_out.back() = 1;
  Tensor values = Tensor::empty(moved_out, self.dtype(), self.device());
  Tensor indices = Tensor::empty(moved_out, kInt64, self.device());
  if (self.device().is_meta()) {
    // shapes only
  } else if (self.device().is_cuda()) {
    cuda_backend::max_rows(values, indices, moved, rows, row);
  } else {
    cpu::visit_dtype(self.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(moved.raw_data());
      T* v = static_cast<T*>(values.raw_data());
      int64_t* ix = indices.data<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const T* x = in + r * row;
        auto best = cpu::to_compute(x[0]);
        int64_t best_index = 0;
        for (int64_t j = 1; j < row; ++j) {
          const auto value = cpu::to_compute(x[j]);
          if (value > best || (value != value && best == best)) {  // NaN wins, as in PyTorch
            best = value;
            best_index = j;
          }
        }
        v[r] = x[best_index];
        ix[r] = best_index;
      }
    });
  }
  if (self.dim() == 0) return {reshape(values, {}), reshape(indices, {})};
  values = transpose(values, dim, -1);
  indices = transpose(indices, dim, -1);
  return {reshape(contiguous(values), out_shape), reshape(contiguous(indices), out_shape)};
}

Tensor max(const Tensor& self) {
  LOOM_CHECK(self.numel() > 0, "max: cannot reduce a tensor with no elements (shape {})",
             shape_str(self.shape()));
  return max(reshape(self, {-1}), 0, false).first;
}

Tensor max_dim_backward(const Tensor& grad, const Tensor& indices, const Shape& input_shape,
                        int64_t dim, bool keepdim) {
  if (auto out =
          dispatch_op(OpId::max_dim_backward, {grad, indices}, {input_shape, dim, keepdim})) {
    return std::move((*out)[0]);
  }
  const int64_t ndim = static_cast<int64_t>(input_shape.size());
  if (ndim == 0) return grad;
  dim = normalize_dim(dim, ndim, "max_dim_backward");
  // One-hot of the chosen index along `dim`, times the gradient.
  const Tensor index = keepdim ? indices : unsqueeze(indices, dim);
  Shape positions_shape(ndim, 1);
  positions_shape[dim] = input_shape[dim];
  const Tensor positions = to(reshape(arange(input_shape[dim]), positions_shape), grad.device());
  const Tensor hit = eq(expand(index, input_shape), positions);
  return mul(to(hit, grad.dtype()), keepdim ? grad : unsqueeze(grad, dim));
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  LOOM_CHECK(lead >= 0, "sum_to: cannot reduce shape {} to the larger shape {}",
             shape_str(grad.shape()), shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && grad.shape()[d] != 1) {
      dims.push_back(d);
    } else {
      LOOM_CHECK(shape[d - lead] == grad.shape()[d], "sum_to: shape {} is not a broadcast of {}",
                 shape_str(grad.shape()), shape_str(shape));
    }
  }
  Tensor reduced = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reshape(reduced, shape);
}

}  // namespace loom::ops
