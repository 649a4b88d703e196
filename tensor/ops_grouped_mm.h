// Grouped matrix products: the rows of a matrix in contiguous groups, each group multiplied by
// its own matrix — a mixture of experts' expert GEMMs over tokens sorted by expert (torch's
// _grouped_mm with offsets). One call runs every group, on CPU (the one GEMM entry point,
// cpu/gemm.h) or CUDA (cuBLASLt), writing each group's product in place in one output: no
// per-group tensors, copies or concatenation.
//
//   // x: (N, K) rows sorted by group, w: (G, M, K), offsets: G + 1 row offsets
//   Tensor y = ops::grouped_mm(x, w, offsets, /*transpose_b=*/true);   // y[g rows] = x[g] @ w[g]^T
//
// `offsets` holds G + 1 non-decreasing row indices, offsets[0] = 0 and offsets[G] = N; group g
// is rows [offsets[g], offsets[g + 1]) (empty groups allowed). Not recorded by autograd:
// loom::grouped_mm (autograd/grouped_mm.h) is the differentiable one.
#pragma once

#include <cstdint>
#include <span>

#include "tensor/tensor.h"

namespace loom::ops {

// a: (N, K'), b: (G, R, C). transpose_b: group g's rows times b[g]^T (K' = C, out (N, R));
// otherwise times b[g] (K' = R, out (N, C)). Floating, one dtype (bf16 on CPU computes in f32 and
// returns bf16, as matmul does).
Tensor grouped_mm(const Tensor& a, const Tensor& b, std::span<const int64_t> offsets,
                  bool transpose_b);

// The weights' gradient of y = grouped_mm(x, w, offsets, true): dw[g] = dy[g rows]^T @ x[g rows],
// (G, M, K); a group without rows gets zeros. In x's dtype.
Tensor grouped_mm_weight_grad(const Tensor& dy, const Tensor& x, std::span<const int64_t> offsets);

// Throws naming the offsets when they are not G + 1 non-decreasing row indices from 0 to rows.
void check_group_offsets(std::span<const int64_t> offsets, int64_t groups, int64_t rows,
                         std::string_view op);

}  // namespace loom::ops
