#include "tensor/ops_copy.h"

#include <cstring>

#include "base/error.h"
#include "tensor/cpu/element_types.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cpu/transpose.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/dispatch.h"
#include "tensor/flop_counter.h"
#include "tensor/ops_create.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_views.h"

namespace loom::ops {

namespace {

// Bytes of two contiguous tensors of one shape and dtype, across devices.
void move_bytes(const Tensor& dst, const Tensor& src) {
  const size_t bytes = static_cast<size_t>(src.numel()) * element_size(src.dtype());
  if (bytes == 0) return;
  if (src.device().is_cpu()) {
    cuda::copy_host_to_device(dst.raw_data(), src.raw_data(), bytes, dst.device().index);
  } else if (dst.device().is_cpu()) {
    cuda::copy_device_to_host(dst.raw_data(), src.raw_data(), bytes, src.device().index);
  } else {
    // Between two GPUs: cudaMemcpy infers the direction from unified addressing.
    cuda::copy_device_to_device(dst.raw_data(), src.raw_data(), bytes, dst.device().index);
  }
}

// Any layout and dtype: broadcast and convert on the source's device into a contiguous staging
// tensor, move the bytes, then lay them out on the destination's device if dst is strided.
void copy_across_devices(const Tensor& dst, const Tensor& src) {
  const Tensor source = src.shape() == dst.shape() ? src : expand(src, dst.shape());
  const Tensor staged = contiguous(to(source, dst.dtype()));
  const Tensor landing =
      dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  move_bytes(landing, staged);
  if (!landing.is_same(dst)) copy_uncounted_(dst, landing);
}

// An f32 copy where one side is stored transposed (copy_ or contiguous() of a transposed view),
// by cpu::copy_f32_matrix's blocked transposes over the row blocks of its (outer dims x rows,
// cols) layout; false when the layout is not one it takes (then the element loop does it).
bool copy_transposed_f32(const Tensor& dst, const Tensor& source) {
  if (dst.dtype() != kFloat32 || source.dtype() != kFloat32) return false;
  const auto layout = cpu::collapse_runs<2>(dst.shape(), {dst.strides(), source.strides()});
  if (!cpu::takes_matrix_layout(layout)) return false;
  const cpu::MatrixView out_view = cpu::matrix_view(nullptr, layout, 0);
  float* out = dst.data<float>();
  const float* in = source.data<float>();
  cpu::parallel_for_each_row_block(
      layout, [&](const std::array<int64_t, 2>& bases, int64_t r0, int64_t r1) {
        cpu::copy_f32_matrix(cpu::matrix_view(in + bases[1], layout, 1), out + bases[0],
                             out_view.row_stride, out_view.col_stride, r0, r1, layout.sizes.back());
      });
  return true;
}

// Element by element on host memory (the CPU, or meta storage that keeps values), converting
// dtypes; `source` already has dst's shape.
void copy_on_host(const Tensor& dst, const Tensor& source) {
  if (copy_transposed_f32(dst, source)) return;
  cpu::visit_dtype(dst.dtype(), [&](auto dst_tag) {
    using D = decltype(dst_tag);
    cpu::visit_dtype(source.dtype(), [&](auto src_tag) {
      using S = decltype(src_tag);
      D* out = static_cast<D*>(dst.raw_data());
      const S* in = static_cast<const S*>(source.raw_data());
      cpu::parallel_for_each_run<2>(dst.shape(), {dst.strides(), source.strides()},
                                    [&](const auto& offsets, int64_t count, const auto& inner) {
                                      D* o = out + offsets[0];
                                      const S* i = in + offsets[1];
                                      if constexpr (std::is_same_v<D, S>) {
                                        if (inner[0] == 1 && inner[1] == 1) {
                                          std::memcpy(o, i, count * sizeof(D));
                                          return;
                                        }
                                      }
                                      for (int64_t j = 0; j < count; ++j) {
                                        o[j * inner[0]] =
                                            cpu::from_compute<D>(cpu::to_compute(i[j * inner[1]]));
                                      }
                                    });
    });
  });
}

bool holds_values(const Tensor& t) { return !t.device().is_meta() || t.storage()->data(); }

// Meta tensors hold values only in small storage (tensor/device.h): those copy as host bytes.
// A source without values reads as zeros, as the values ops compute on meta do (a traced job's
// gradient norms and losses are zero), so a job's host-side logic runs on unchanged.
void copy_with_meta(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(!dst.device().is_cuda() && !src.device().is_cuda(),
             "copy_: cannot copy between {} and {}: meta tensors have no device memory; copy "
             "through the CPU",
             src.device().str(), dst.device().str());
  if (!holds_values(dst)) return;
  if (!holds_values(src)) {
    fill_uncounted_(dst, 0.0);
    return;
  }
  copy_on_host(dst, src.shape() == dst.shape() ? src : expand(src, dst.shape()));
}

void copy_plain(const Tensor& dst, const Tensor& src) {
  if (dst.device().is_meta() || src.device().is_meta()) {
    copy_with_meta(dst, src);
    return;
  }
  if (dst.device() != src.device()) {
    copy_across_devices(dst, src);
    return;
  }
  const Tensor source = src.shape() == dst.shape() ? src : expand(src, dst.shape());
  if (dst.device().is_cuda()) {
    cuda_backend::copy(dst, source);
    return;
  }
  copy_on_host(dst, source);
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  if (dispatch_op(OpId::copy_, {dst, src})) return;
  FlopCounter::record_in_place(dst, 2);
  copy_plain(dst, src);
}

void copy_uncounted_(const Tensor& dst, const Tensor& src) {
  if (dispatch_op(OpId::copy_, {dst, src})) return;
  copy_plain(dst, src);
}

Tensor contiguous(const Tensor& self) {
  if (self.is_contiguous() && !self.extension()) return self;
  return clone(self);
}

Tensor clone(const Tensor& self) {
  if (auto out = dispatch_op(OpId::clone, {self})) return std::move((*out)[0]);
  Tensor out = Tensor::empty(self.shape(), self.dtype(), self.device());
  copy_uncounted_(out, self);
  return out;
}

Tensor repeat_interleave(const Tensor& self, int64_t repeats, int64_t dim) {
  LOOM_CHECK(repeats >= 1, "repeat_interleave: repeats must be >= 1, got {}", repeats);
  LOOM_CHECK(dim >= -self.dim() && dim < self.dim(),
             "repeat_interleave: dim {} is out of range for a tensor of shape {}", dim,
             shape_str(self.shape()));
  if (repeats == 1) return self;
  const auto d = static_cast<size_t>(dim < 0 ? dim + self.dim() : dim);
  Shape grown = self.shape();
  grown.insert(grown.begin() + static_cast<std::ptrdiff_t>(d) + 1, repeats);
  Shape merged = self.shape();
  merged[d] *= repeats;
  return reshape(contiguous(expand(unsqueeze(self, static_cast<int64_t>(d) + 1), grown)), merged);
}

Tensor to(const Tensor& self, DType dtype) {
  if (auto out = dispatch_op(OpId::to_dtype, {self}, {dtype})) return std::move((*out)[0]);
  if (self.dtype() == dtype) return self;
  Tensor out = Tensor::empty(self.shape(), dtype, self.device());
  copy_uncounted_(out, self);
  return out;
}

Tensor to(const Tensor& self, Device device) {
  if (self.device() == device) return self;
  if (auto out = dispatch_op(OpId::to_device, {self},
                             {static_cast<int64_t>(device.type), int64_t{device.index}})) {
    return std::move((*out)[0]);
  }
  const Tensor source = contiguous(self);
  Tensor out = Tensor::empty(self.shape(), self.dtype(), device);
  copy_uncounted_(out, source);
  return out;
}

Tensor cat(std::span<const Tensor> tensors, int64_t dim) {
  if (auto out = dispatch_op(OpId::cat, tensors, {dim})) return std::move((*out)[0]);
  LOOM_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  const Tensor& first = tensors[0];
  LOOM_CHECK(first.dim() > 0,
             "cat: tensor 0 is a scalar (shape ()) and cannot be concatenated; use stack");
  dim = normalize_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    LOOM_CHECK(t.dim() == first.dim() && t.dtype() == first.dtype() && t.device() == first.device(),
               "cat: tensor {} is {} but tensor 0 is {}", i, t.description(), first.description());
    for (int64_t d = 0; d < first.dim(); ++d) {
      LOOM_CHECK(d == dim || t.shape()[d] == first.shape()[d],
                 "cat: tensor {} has shape {} but tensor 0 has shape {} (they may differ only in "
                 "dim {})",
                 i, shape_str(t.shape()), shape_str(first.shape()), dim);
    }
    shape[dim] += t.shape()[dim];
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    copy_uncounted_(narrow(out, dim, start, t.shape()[dim]), t);
    start += t.shape()[dim];
  }
  return out;
}

Tensor match_layout(const Tensor& value, const Tensor& like) {
  if (auto out = dispatch_op(OpId::match_layout, {value, like})) return std::move((*out)[0]);
  LOOM_CHECK(value.shape() == like.shape(),
             "match_layout: value of shape {} cannot take the layout of shape {}",
             shape_str(value.shape()), shape_str(like.shape()));
  return value;
}

Tensor stack(std::span<const Tensor> tensors, int64_t dim) {
  LOOM_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  dim = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOOM_CHECK(tensors[i].shape() == tensors[0].shape(),
               "stack: tensor {} has shape {} but tensor 0 has shape {}", i,
               shape_str(tensors[i].shape()), shape_str(tensors[0].shape()));
    expanded.push_back(unsqueeze(tensors[i], dim));
  }
  return cat(expanded, dim);
}

Tensor stacked_view(std::span<const Tensor> tensors, int64_t dim) {
  if (tensors.size() < 2) return Tensor();
  const Tensor& first = tensors[0];
  dim = normalize_dim(dim, first.dim() + 1, "stacked_view");
  const int64_t step = tensors[1].defined() ? tensors[1].offset() - first.offset() : 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!t.defined() || t.extension() || t.storage() != first.storage() ||
        t.shape() != first.shape() || t.strides() != first.strides() ||
        t.offset() != first.offset() + static_cast<int64_t>(i) * step) {
      return Tensor();
    }
  }
  Shape shape = first.shape();
  Strides strides = first.strides();
  shape.insert(shape.begin() + dim, static_cast<int64_t>(tensors.size()));
  strides.insert(strides.begin() + dim, step);
  if (step <= 0 || !non_overlapping_and_dense(shape, strides)) return Tensor();
  return Tensor::from_storage(first.storage(), std::move(shape), std::move(strides), first.offset(),
                              first.dtype());
}

}  // namespace loom::ops
