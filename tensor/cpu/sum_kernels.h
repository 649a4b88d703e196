// Vectorized, threaded sums of contiguous f32 data, accumulated in f64 (the CPU `sum`'s
// accumulator type): a whole array, the columns of a (rows, cols) matrix (reducing leading dims:
// bias and norm-weight gradients), and its rows (reducing trailing dims). Built as AVX-512 and
// AVX2 clones like vector_math.h, split over the kernel threads (parallel.h).
//
// Orders, so that values do not depend on the thread count:
//   sum_f32       fixed blocks of kSumBlock elements, each summed in vector lanes, then the
//                 block sums in block order;
//   column_sums   each column in row order, exactly the serial loop's f64 value;
//   row_sums      each row in vector lanes, then the lanes.
#pragma once

#include <cstdint>

namespace loom::cpu {

inline constexpr int64_t kSumBlock = 4096;

double sum_f32(const float* x, int64_t n);
// out[c] = sum over r of x[r * cols + c]
void column_sums_f32(const float* x, int64_t rows, int64_t cols, double* out);
// out[r] = sum over c of x[r * cols + c]
void row_sums_f32(const float* x, int64_t rows, int64_t cols, double* out);

}  // namespace loom::cpu
