#include "tensor/cpu/sum_kernels.h"

#include <algorithm>
#include <vector>

#include "tensor/cpu/parallel.h"

namespace loom::cpu {

namespace {

__attribute__((target_clones("avx512f", "default"))) double lanes_sum(const float* x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}

// Columns [begin, end) of every row added into out (f64), row by row, a tile of columns at a
// time: the tile's accumulators stay in L1 while every row passes (an (8, 1.2M) sum read its
// f64 accumulators from memory once per row before).
constexpr int64_t kColumnTile = 512;

__attribute__((target_clones("avx512f", "default"))) void add_rows(const float* x, int64_t rows,
                                                                   int64_t cols, int64_t begin,
                                                                   int64_t end, double* out) {
  double acc[kColumnTile];
  for (int64_t tile = begin; tile < end; tile += kColumnTile) {
    const int64_t width = std::min(kColumnTile, end - tile);
    for (int64_t c = 0; c < width; ++c) acc[c] = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * cols + tile;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) acc[c] += static_cast<double>(row[c]);
    }
    for (int64_t c = 0; c < width; ++c) out[tile + c] = acc[c];
  }
}

}  // namespace

double sum_f32(const float* x, int64_t n) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / kSumBlock), 1,
               [&](int64_t begin, int64_t end) {
                 for (int64_t b = begin; b < end; ++b) {
                   const int64_t first = b * kSumBlock;
                   partial[b] = lanes_sum(x + first, std::min(kSumBlock, n - first));
                 }
               });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void column_sums_f32(const float* x, int64_t rows, int64_t cols, double* out) {
  // Columns split over the threads, 64-aligned: each column is one thread's, in row order.
  parallel_for(cols, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(rows, 1)), 64,
               [&](int64_t begin, int64_t end) { add_rows(x, rows, cols, begin, end, out); });
}

void row_sums_f32(const float* x, int64_t rows, int64_t cols, double* out) {
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)), 1,
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) out[r] = lanes_sum(x + r * cols, cols);
               });
}

}  // namespace loom::cpu
