// Reductions over contiguous data. Floating sums accumulate in f64 (as the CPU kernels do) and
// round once to the dtype; integer sums accumulate in i64.
#pragma once

#include <cstdint>

#include "tensor/cuda/kernels/kernel_args.h"

namespace loom::cuda::kernels {

// out[r] = scale * sum_j in[r * n + j] for r < rows; out and in of `dtype`, contiguous.
// Rows few and long split into sum_rows_chunks(rows, n) chunks each (`workspace`: chunks x rows
// 8-byte accumulators on the device, unused for one chunk), added in chunk order.
int64_t sum_rows_chunks(int64_t rows, int64_t n);
void sum_rows(DType dtype, void* out, const void* in, int64_t rows, int64_t n, double scale,
              void* workspace, int device);
// out[c] = scale * sum_i in[i * cols + c] for c < cols: reducing the leading dim, coalesced.
// Many rows split into sum_cols_chunks(n) chunks summed by separate blocks into `workspace`
// (chunks x cols 8-byte accumulators on the device; unused, may be null, for one chunk), then
// added in chunk order: deterministic.
int64_t sum_cols_chunks(int64_t n);
void sum_cols(DType dtype, void* out, const void* in, int64_t n, int64_t cols, double scale,
              void* workspace, int device);
// values[r] = max_j in[r * n + j], indices[r] = the first j holding it; NaN wins (PyTorch). n > 0.
void max_rows(DType dtype, void* values, int64_t* indices, const void* in, int64_t rows, int64_t n,
              int device);
// indices[r * k + c] = the index of row r's c-th largest value (ties: the lower index first), or
// -1 in all k slots of a row holding a NaN; in contiguous (rows, n) of `dtype`, 1 <= k <= n.
void top_k_rows(DType dtype, int64_t* indices, const void* in, int64_t rows, int64_t n, int64_t k,
                int device);

}  // namespace loom::cuda::kernels
