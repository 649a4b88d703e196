// Reductions (loom::ops; they record autograd through tensor/dispatch.h like every op). Floating
// results accumulate in f64.
#pragma once

#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::ops {

// Sum over `dims` (all dims when empty); keepdim keeps them as size 1.
Tensor sum(const Tensor& self, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& self, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max over one dim: (values, i64 indices of the first maximum), like torch.max(x, dim).
std::pair<Tensor, Tensor> max(const Tensor& self, int64_t dim, bool keepdim = false);
// Max over all elements (a scalar tensor).
Tensor max(const Tensor& self);
// Gradient of max(self, dim, keepdim) for a `self` of `input_shape`: `grad` at the positions
// `indices` (max's second output) along `dim`, zeros elsewhere.
Tensor max_dim_backward(const Tensor& grad, const Tensor& indices, const Shape& input_shape,
                        int64_t dim, bool keepdim);
// Sums a broadcast gradient back to `shape` (the inverse of broadcasting `shape` to
// grad.shape()): the reduction every broadcasting op's backward needs.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace loom::ops
