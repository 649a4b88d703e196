// Views: new shape/strides/offset over the same storage, no copy (loom::ops, also spelled
// loom::view etc.; they record autograd through tensor/dispatch.h like every op).
// `reshape` copies only when no view is possible, as torch.reshape does.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace loom::ops {

// `shape` may hold one -1, inferred from the element count. Requires a viewable layout.
Tensor view(const Tensor& self, Shape shape);
Tensor reshape(const Tensor& self, Shape shape);
Tensor transpose(const Tensor& self, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& self, const std::vector<int64_t>& dims);
// Elements [start, start + length) of `dim`.
Tensor narrow(const Tensor& self, int64_t dim, int64_t start, int64_t length);
// Python-style slice [start:end:step] of `dim`; start/end are clamped, negative ones count from the
// end.
Tensor slice(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// Gradient of slice(self, dim, start, end, step) for a `self` of `input_shape`: a new tensor of
// zeros with `grad` written where the slice took its elements (torch's slice_backward). An op of
// its own (not zeros + copy_ into a view) so that extended tensors (DTensors) can dispatch it.
Tensor slice_backward(const Tensor& grad, const Shape& input_shape, int64_t dim, int64_t start,
                      int64_t end, int64_t step = 1);
// torch.chunk: `chunks` pieces of size ceil(n / chunks); trailing pieces may be smaller, and
// fewer than `chunks` pieces come back when n is small.
std::vector<Tensor> chunk(const Tensor& self, int64_t chunks, int64_t dim = 0);
// torch.split with one size: pieces of `split_size`, the last one smaller.
std::vector<Tensor> split(const Tensor& self, int64_t split_size, int64_t dim = 0);
// torch.split with explicit sizes, which must add up to the dim's size.
std::vector<Tensor> split_with_sizes(const Tensor& self, const std::vector<int64_t>& sizes,
                                     int64_t dim = 0);
// Broadcasts size-1 dims (stride 0) and prepends new leading dims; -1 keeps a size.
Tensor expand(const Tensor& self, Shape shape);
Tensor unsqueeze(const Tensor& self, int64_t dim);
Tensor squeeze(const Tensor& self, int64_t dim);
// Strides of a tensor of `shape` viewing `self`'s elements in row-major order, or empty
// when no such view exists (the layout would need a copy).
std::optional<Strides> view_strides(const Tensor& self, const Shape& shape);
// Resolves one -1 in `shape` against `numel`; checks the element count matches.
Shape infer_shape(Shape shape, int64_t numel, const Shape& from, std::string_view op);
// A new tensor handle over the same storage, shape and strides, without autograd state or
// extension (a wrapper's alias is a plain handle onto its own bytes). Used for saving tensors
// and by detach(), which keeps the extension.
Tensor alias(const Tensor& self);

}  // namespace loom::ops
