// Moving a tensor dim to the front and back, so collectives see each chunk as one contiguous
// block (shared by the transitions).
#pragma once

#include "tensor/tensor.h"

namespace loom::transitions {

// `t` with `tensor_dim` moved to dim 0, contiguous.
Tensor dim_to_front(const Tensor& t, int64_t tensor_dim);
// Inverse of dim_to_front for a tensor of rank `ndim`.
Tensor dim_from_front(const Tensor& t, int64_t tensor_dim);
// Shape of `shape` with dim `tensor_dim` set to `size` and moved to the front.
Shape front_shape(const Shape& shape, int64_t tensor_dim, int64_t size);

}  // namespace loom::transitions
