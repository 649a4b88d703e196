// The differentiable grouped matrix product (tensor/ops_grouped_mm.h): a mixture of experts'
// expert GEMMs, tokens sorted by expert, each expert's rows times its own weight.
//
//   Tensor h = loom::grouped_mm(x_sorted, w1, offsets);   // (N, K) x (E, M, K) -> (N, M)
//
// One graph node; backward is two grouped calls: dx[g] = dy[g] @ w[g], dw[g] = dy[g]^T @ x[g]
// (an expert with no rows gets a zero gradient).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// y[rows of g] = x[rows of g] @ w[g]^T; offsets: E + 1 row offsets (ops::check_group_offsets).
Tensor grouped_mm(const Tensor& x, const Tensor& w, std::vector<int64_t> offsets);

}  // namespace loom
