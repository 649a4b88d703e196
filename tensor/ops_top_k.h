// The indices of each row's k largest values (torch.topk(x, k).indices, sorted), for choosing
// among scores without copying them to the host: a mixture of experts' router copies its
// (tokens, k) choices instead of its (tokens, experts) scores.
//
// Order: largest first; equal values go to the lower index first (a total order, so every
// device gives the same indices and runs repeat bit for bit). A row holding a NaN has no order:
// all its k indices are -1, which callers check (nn/moe/moe.cc names the token). Infinities
// order as numbers.
//
// Not a dispatched op (as ops_foreach.h): plain tensors only, nothing differentiates it.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace loom::ops {

// x (..., n) floating, n >= k >= 1, on any device; returns int64 (..., k) on x's device.
// Throws naming the shape and k otherwise, or a DTensor (take its local tensor).
Tensor top_k_indices(const Tensor& x, int64_t k);

}  // namespace loom::ops
