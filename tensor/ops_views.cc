#include "tensor/ops_views.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "base/error.h"
#include "tensor/dispatch.h"
#include "tensor/ops_copy.h"
#include "tensor/ops_create.h"

namespace loom::ops {

namespace {
Tensor restride(const Tensor& self, Shape shape, Strides strides, int64_t offset) {
  return Tensor::from_storage(self.storage(), std::move(shape), std::move(strides), offset,
                              self.dtype());
}

// normalize_dim accepts dim 0 / -1 on a scalar (wrap_scalar); ops that index shape()[dim] must
// reject scalars first.
void check_not_scalar(const Tensor& self, std::string_view op) {
  LOOM_CHECK(self.dim() > 0, "{}: cannot be applied to a scalar (shape ())", op);
}
}  // namespace

Tensor alias(const Tensor& self) {
  return restride(self, self.shape(), self.strides(), self.offset());
}

Shape infer_shape(Shape shape, int64_t numel, const Shape& from, std::string_view op) {
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      LOOM_CHECK(infer_at < 0, "{}: only one dim can be -1, got {}", op, shape_str(shape));
      infer_at = static_cast<int>(i);
    } else {
      LOOM_CHECK(shape[i] >= 0, "{}: invalid size {} in shape {}", op, shape[i], shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    LOOM_CHECK(known != 0 && numel % known == 0,
               "{}: shape {} is invalid for a tensor of shape {} ({} elements)", op,
               shape_str(shape), shape_str(from), numel);
    shape[infer_at] = numel / known;
  } else {
    LOOM_CHECK(known == numel, "{}: shape {} is invalid for a tensor of shape {} ({} elements)", op,
               shape_str(shape), shape_str(from), numel);
  }
  return shape;
}

std::optional<Strides> view_strides(const Tensor& self, const Shape& shape) {
  // Same algorithm as PyTorch's computeStride: walk old dims from the back in chunks that are
  // contiguous among themselves; each chunk must be covered exactly by a run of new dims.
  const Shape& old_shape = self.shape();
  const Strides& old_strides = self.strides();
  Strides strides(shape.size());
  if (self.numel() == 0 || old_shape.empty()) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                          old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

Tensor view(const Tensor& self, Shape shape) {
  if (auto out = dispatch_op(OpId::view, {self}, {shape})) return std::move((*out)[0]);
  shape = infer_shape(std::move(shape), self.numel(), self.shape(), "view");
  auto strides = view_strides(self, shape);
  LOOM_CHECK(strides.has_value(),
             "view: a tensor of shape {} and strides ({}) cannot be viewed as {} without a copy; "
             "use reshape",
             shape_str(self.shape()), fmt::join(self.strides(), ", "), shape_str(shape));
  return restride(self, std::move(shape), std::move(*strides), self.offset());
}

Tensor reshape(const Tensor& self, Shape shape) {
  if (auto out = dispatch_op(OpId::reshape, {self}, {shape})) return std::move((*out)[0]);
  shape = infer_shape(std::move(shape), self.numel(), self.shape(), "reshape");
  if (auto strides = view_strides(self, shape)) {
    return restride(self, std::move(shape), std::move(*strides), self.offset());
  }
  return view(contiguous(self), std::move(shape));
}

Tensor transpose(const Tensor& self, int64_t dim0, int64_t dim1) {
  if (auto out = dispatch_op(OpId::transpose, {self}, {dim0, dim1})) return std::move((*out)[0]);
  const int64_t ndim = self.dim();
  dim0 = normalize_dim(dim0, ndim, "transpose");
  dim1 = normalize_dim(dim1, ndim, "transpose");
  Shape shape = self.shape();
  Strides strides = self.strides();
  if (ndim > 0) {
    std::swap(shape[dim0], shape[dim1]);
    std::swap(strides[dim0], strides[dim1]);
  }
  return restride(self, std::move(shape), std::move(strides), self.offset());
}

Tensor permute(const Tensor& self, const std::vector<int64_t>& dims) {
  if (auto out = dispatch_op(OpId::permute, {self}, {dims})) return std::move((*out)[0]);
  const int64_t ndim = self.dim();
  LOOM_CHECK(static_cast<int64_t>(dims.size()) == ndim,
             "permute: got {} dims ({}) for a tensor of rank {}", dims.size(),
             fmt::join(dims, ", "), ndim);
  Shape shape(ndim);
  Strides strides(ndim);
  std::vector<bool> seen(ndim, false);
  for (int64_t i = 0; i < ndim; ++i) {
    const int64_t d = normalize_dim(dims[i], ndim, "permute");
    LOOM_CHECK(!seen[d], "permute: dim {} repeated in ({})", d, fmt::join(dims, ", "));
    seen[d] = true;
    shape[i] = self.shape()[d];
    strides[i] = self.strides()[d];
  }
  return restride(self, std::move(shape), std::move(strides), self.offset());
}

Tensor narrow(const Tensor& self, int64_t dim, int64_t start, int64_t length) {
  if (auto out = dispatch_op(OpId::narrow, {self}, {dim, start, length}))
    return std::move((*out)[0]);
  check_not_scalar(self, "narrow");
  dim = normalize_dim(dim, self.dim(), "narrow");
  const int64_t size = self.shape()[dim];
  if (start < 0) start += size;
  LOOM_CHECK(start >= 0 && length >= 0 && start + length <= size,
             "narrow: range [{}, {}) is outside dim {} of size {} (tensor shape {})", start,
             start + length, dim, size, shape_str(self.shape()));
  Shape shape = self.shape();
  shape[dim] = length;
  return restride(self, std::move(shape), self.strides(),
                  self.offset() + start * self.strides()[dim]);
}

Tensor slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (auto out = dispatch_op(OpId::slice, {self}, {dim, start, end, step}))
    return std::move((*out)[0]);
  check_not_scalar(self, "slice");
  dim = normalize_dim(dim, self.dim(), "slice");
  LOOM_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t size = self.shape()[dim];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = self.shape();
  Strides strides = self.strides();
  shape[dim] = (end - start + step - 1) / step;
  const int64_t offset = self.offset() + start * strides[dim];
  strides[dim] *= step;
  return restride(self, std::move(shape), std::move(strides), offset);
}

Tensor slice_backward(const Tensor& grad, const Shape& input_shape, int64_t dim, int64_t start,
                      int64_t end, int64_t step) {
  if (auto out = dispatch_op(OpId::slice_backward, {grad}, {input_shape, dim, start, end, step}))
    return std::move((*out)[0]);
  Tensor out = zeros(input_shape, grad.dtype(), grad.device());
  copy_uncounted_(slice(out, dim, start, end, step), grad);
  return out;
}

std::vector<Tensor> split_with_sizes(const Tensor& self, const std::vector<int64_t>& sizes,
                                     int64_t dim) {
  check_not_scalar(self, "split_with_sizes");
  dim = normalize_dim(dim, self.dim(), "split_with_sizes");
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  LOOM_CHECK(total == self.shape()[dim],
             "split_with_sizes: sizes ({}) add up to {} but dim {} has size {}",
             fmt::join(sizes, ", "), total, dim, self.shape()[dim]);
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t size : sizes) {
    pieces.push_back(narrow(self, dim, start, size));
    start += size;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& self, int64_t split_size, int64_t dim) {
  check_not_scalar(self, "split");
  dim = normalize_dim(dim, self.dim(), "split");
  LOOM_CHECK(split_size > 0, "split: split_size must be positive, got {}", split_size);
  const int64_t size = self.shape()[dim];
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += split_size) {
    sizes.push_back(std::min(split_size, size - start));
  }
  if (sizes.empty()) sizes.push_back(0);
  return split_with_sizes(self, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& self, int64_t chunks, int64_t dim) {
  LOOM_CHECK(chunks > 0, "chunk: chunks must be positive, got {}", chunks);
  check_not_scalar(self, "chunk");
  dim = normalize_dim(dim, self.dim(), "chunk");
  const int64_t size = self.shape()[dim];
  // torch.chunk gives `chunks` empty pieces for an empty dim (split would give one).
  if (size == 0) return split_with_sizes(self, std::vector<int64_t>(chunks, 0), dim);
  const int64_t chunk_size = (size + chunks - 1) / chunks;
  return split(self, chunk_size, dim);
}

Tensor expand(const Tensor& self, Shape shape) {
  if (auto out = dispatch_op(OpId::expand, {self}, {shape})) return std::move((*out)[0]);
  const int64_t ndim = static_cast<int64_t>(shape.size());
  LOOM_CHECK(ndim >= self.dim(), "expand: cannot expand shape {} to fewer dims {}",
             shape_str(self.shape()), shape_str(shape));
  Strides strides(ndim);
  const int64_t lead = ndim - self.dim();
  for (int64_t i = 0; i < ndim; ++i) {
    if (i < lead) {
      LOOM_CHECK(shape[i] >= 0, "expand: size -1 not allowed for a new leading dim in {}",
                 shape_str(shape));
      strides[i] = 0;
      continue;
    }
    const int64_t old = self.shape()[i - lead];
    if (shape[i] == -1) shape[i] = old;
    LOOM_CHECK(old == shape[i] || old == 1,
               "expand: shape {} cannot be expanded to {} (size {} at dim {} is not 1)",
               shape_str(self.shape()), shape_str(shape), old, i - lead);
    strides[i] = old == shape[i] ? self.strides()[i - lead] : 0;
  }
  return restride(self, std::move(shape), std::move(strides), self.offset());
}

Tensor unsqueeze(const Tensor& self, int64_t dim) {
  if (auto out = dispatch_op(OpId::unsqueeze, {self}, {dim})) return std::move((*out)[0]);
  dim = normalize_dim(dim, self.dim() + 1, "unsqueeze");
  Shape shape = self.shape();
  Strides strides = self.strides();
  const int64_t stride = dim < self.dim() ? strides[dim] * shape[dim] : 1;
  shape.insert(shape.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  return restride(self, std::move(shape), std::move(strides), self.offset());
}

Tensor squeeze(const Tensor& self, int64_t dim) {
  if (auto out = dispatch_op(OpId::squeeze, {self}, {dim})) return std::move((*out)[0]);
  dim = normalize_dim(dim, self.dim(), "squeeze");
  if (self.dim() == 0 || self.shape()[dim] != 1) return alias(self);
  Shape shape = self.shape();
  Strides strides = self.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return restride(self, std::move(shape), std::move(strides), self.offset());
}

}  // namespace loom::ops
