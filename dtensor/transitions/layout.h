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

// Even chunks: `count` chunks of `tensor_dim` of one size, stacked in front as collectives lay
// them, (count, A..., chunk, R...) contiguous, from the tensor's own (A..., count * chunk, R...)
// and back. One copy each way where moving the dim to the front and back takes two: a chunk of a
// contiguous shard is already one block (sequence parallelism's (B, T/n, C) activations).
Tensor chunks_to_front(const Tensor& full, int64_t tensor_dim, int64_t count);
Tensor chunks_from_front(const Tensor& stacked, int64_t tensor_dim);

}  // namespace loom::transitions
