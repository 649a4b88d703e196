// Rows gathered by an index known on the host, whose backward is a gather too: the token
// permutations of a mixture of experts (tokens into expert order, expert outputs back to each
// token's choices, each choice's score).
//
//   Tensor y = loom::gather_rows(x, index, {tokens, k});   // y[t, c] = x[index[t * k + c]]
//
// y has shape index_shape + (D) for x of (R, D); an index of -1 gives a row of zeros. Backward:
// grad_x[r] = the sum of grad_y's rows at the positions i with index[i] == r, which this op takes
// as a gather of those rows (in increasing i) and a sum over at most m of them, m the most
// positions any row has: deterministic on every device and in the tensors' own dtype, where
// embedding's backward (a scatter-add) accumulates in an f32 table on a CPU and sorts its
// indices on a GPU.
// One graph node.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace loom {

Tensor gather_rows(const Tensor& x, std::span<const int64_t> index, const Shape& index_shape);

}  // namespace loom
