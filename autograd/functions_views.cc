// Differentiable views, copies and concatenation.
#include <numeric>

#include "autograd/function.h"
#include "autograd/functions.h"

namespace loom {

using autograd::any_requires_grad;
using autograd::record;
using Grads = std::vector<Tensor>;

namespace {
// Backward of any op whose gradient is the output gradient reshaped to the input's shape.
Tensor record_reshape_like(const char* name, const Tensor& self, Tensor out) {
  if (!any_requires_grad({self})) return out;
  return record(name, {self}, std::move(out), [shape = self.shape()](const Grads& g) {
    return Grads{ops::reshape(g[0], shape)};
  });
}

// Gradient of a strided sub-view (narrow/slice of `dim` [start:end:step]): zeros of the input's
// shape with the output gradient written into the same sub-view.
Tensor record_subview(const char* name, const Tensor& self, Tensor out, int64_t dim, int64_t start, int64_t end,
                      int64_t step) {
  if (!any_requires_grad({self})) return out;
  return record(name, {self}, std::move(out), [shape = self.shape(), dim, start, end, step](const Grads& g) {
    return Grads{ops::slice_backward(g[0], shape, dim, start, end, step)};
  });
}

// narrow's [start, start + length) as a slice (negative start counts from the end).
int64_t narrow_start(const Tensor& self, int64_t dim, int64_t start) {
  return start < 0 ? start + self.size(normalize_dim(dim, self.dim(), "narrow")) : start;
}
}  // namespace

Tensor view(const Tensor& self, Shape shape) {
  return record_reshape_like("ViewBackward", self, ops::view(self, std::move(shape)));
}
Tensor reshape(const Tensor& self, Shape shape) {
  return record_reshape_like("ReshapeBackward", self, ops::reshape(self, std::move(shape)));
}
Tensor unsqueeze(const Tensor& self, int64_t dim) {
  return record_reshape_like("UnsqueezeBackward", self, ops::unsqueeze(self, dim));
}
Tensor squeeze(const Tensor& self, int64_t dim) {
  return record_reshape_like("SqueezeBackward", self, ops::squeeze(self, dim));
}

Tensor transpose(const Tensor& self, int64_t dim0, int64_t dim1) {
  Tensor out = ops::transpose(self, dim0, dim1);
  if (!any_requires_grad({self})) return out;
  return record("TransposeBackward", {self}, out, [dim0, dim1](const Grads& g) {
    return Grads{ops::transpose(g[0], dim0, dim1)};
  });
}

Tensor permute(const Tensor& self, const std::vector<int64_t>& dims) {
  Tensor out = ops::permute(self, dims);
  if (!any_requires_grad({self})) return out;
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i] < 0 ? dims[i] + self.dim() : dims[i];
    inverse[d] = static_cast<int64_t>(i);
  }
  return record("PermuteBackward", {self}, out, [inverse](const Grads& g) {
    return Grads{ops::permute(g[0], inverse)};
  });
}

Tensor narrow(const Tensor& self, int64_t dim, int64_t start, int64_t length) {
  Tensor out = ops::narrow(self, dim, start, length);
  const int64_t first = narrow_start(self, dim, start);
  return record_subview("NarrowBackward", self, std::move(out), dim, first, first + length, 1);
}

Tensor slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return record_subview("SliceBackward", self, ops::slice(self, dim, start, end, step), dim, start, end, step);
}

std::vector<Tensor> split_with_sizes(const Tensor& self, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> pieces = ops::split_with_sizes(self, sizes, dim);
  if (!any_requires_grad({self})) return pieces;
  // Each piece is recorded as a narrow of `self`, so pieces may be used independently.
  const int64_t d = normalize_dim(dim, self.dim(), "split_with_sizes");
  int64_t start = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int64_t length = sizes[i];
    pieces[i] = record_subview("SplitBackward", self, pieces[i], d, start, start + length, 1);
    start += length;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& self, int64_t split_size, int64_t dim) {
  std::vector<int64_t> sizes;
  for (const Tensor& piece : ops::split(self, split_size, dim)) sizes.push_back(piece.size(dim));
  return split_with_sizes(self, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& self, int64_t chunks, int64_t dim) {
  std::vector<int64_t> sizes;
  for (const Tensor& piece : ops::chunk(self, chunks, dim)) sizes.push_back(piece.size(dim));
  return split_with_sizes(self, sizes, dim);
}

Tensor expand(const Tensor& self, Shape shape) {
  Tensor out = ops::expand(self, std::move(shape));
  if (!any_requires_grad({self})) return out;
  return record("ExpandBackward", {self}, out, [shape = self.shape()](const Grads& g) {
    return Grads{ops::sum_to(g[0], shape)};
  });
}

Tensor contiguous(const Tensor& self) {
  if (self.is_contiguous()) return self;
  return clone(self);
}

Tensor clone(const Tensor& self) {
  Tensor out = ops::clone(self);
  if (!any_requires_grad({self})) return out;
  return record("CloneBackward", {self}, out, [](const Grads& g) { return Grads{g[0]}; });
}

Tensor to(const Tensor& self, DType dtype) {
  if (self.dtype() == dtype) return self;
  Tensor out = ops::to(self, dtype);
  if (!any_requires_grad({self}) || !is_floating(dtype)) return out;
  return record("ToDtypeBackward", {self}, out, [from = self.dtype()](const Grads& g) {
    return Grads{ops::to(g[0], from)};
  });
}

Tensor to(const Tensor& self, Device device) {
  if (self.device() == device) return self;
  Tensor out = ops::to(self, device);
  if (!any_requires_grad({self})) return out;
  return record("ToDeviceBackward", {self}, out, [from = self.device()](const Grads& g) {
    return Grads{ops::to(g[0], from)};
  });
}

Tensor cat(std::span<const Tensor> tensors, int64_t dim) {
  Tensor out = ops::cat(tensors, dim);
  if (!any_requires_grad(tensors)) return out;
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.size(dim));
  return autograd::record("CatBackward", tensors, {out}, [sizes, dim](const Grads& g) {
    return ops::split_with_sizes(g[0], sizes, dim);
  })[0];
}

Tensor stack(std::span<const Tensor> tensors, int64_t dim) {
  std::vector<Tensor> expanded;
  const int64_t d = tensors.empty() ? 0 : normalize_dim(dim, tensors[0].dim() + 1, "stack");
  for (const Tensor& t : tensors) expanded.push_back(unsqueeze(t, d));
  return cat(expanded, d);
}

Tensor detach(const Tensor& self) { return ops::alias(self); }

}  // namespace loom
