// f32 kernels for operands stored transposed (a weight's gradient taken through a transposed view,
// a `.contiguous()` of a transpose): row by row, such an operand costs a cache line per element and
// a (1536, 768) add ran 12x slower than a contiguous one. These walk 8 x 8 blocks (AVX2 shuffles,
// the x86-64-v3 baseline) inside cache tiles instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/cpu/strided_loop.h"
#include "tensor/cpu/vector_math.h"

namespace loom::cpu {

// dst[c * dst_ld + r] = src[r * src_ld + c] for r < rows, c < cols. One thread.
void transpose_f32(const float* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst,
                   int64_t dst_ld);

// A (rows, cols) f32 matrix in memory: element (r, c) at data[r * row_stride + c * col_stride],
// one of the two strides 1 (row-major: col_stride 1; transposed: row_stride 1).
struct MatrixView {
  const float* data = nullptr;
  int64_t row_stride = 0, col_stride = 1;
  bool row_major() const { return col_stride == 1; }
};

// Whether the kernels below are the way to run `layout`: some operand strides across rows
// (strides_across_rows) and every operand is row-major or transposed in the last two dims.
template <size_t N>
bool takes_matrix_layout(const RunLayout<N>& layout) {
  if (!strides_across_rows(layout)) return false;
  const size_t last = layout.sizes.size() - 1;
  for (const auto& st : layout.strides) {
    if (st[last] != 1 && st[last - 1] != 1) return false;
  }
  return true;
}

// Operand k of a takes_matrix_layout layout as the (rows, cols) matrix whose (0, 0) is at `data`.
template <size_t N>
MatrixView matrix_view(const float* data, const RunLayout<N>& layout, size_t k) {
  const size_t last = layout.sizes.size() - 1;
  return {data, layout.strides[k][last - 1], layout.strides[k][last]};
}

// out[r * out_ld + c] = a(r, c) (op) b(r, c) for the rows [row_begin, row_end) and every column:
// the transposed operands go through a tile buffer, then arith_f32_block's vector loop (IEEE's
// operations, so the values are exactly the element loop's). One thread.
void arith_f32_matrix(Arith op, MatrixView a, MatrixView b, float* out, int64_t out_ld,
                      int64_t row_begin, int64_t row_end, int64_t cols);

// dst(r, c) = src(r, c) for the rows [row_begin, row_end) and every column, where dst's element
// (r, c) is at dst[r * dst_row_stride + c * dst_col_stride] (one of them 1) and either side may
// be stored transposed. One thread.
void copy_f32_matrix(MatrixView src, float* dst, int64_t dst_row_stride, int64_t dst_col_stride,
                     int64_t row_begin, int64_t row_end, int64_t cols);

}  // namespace loom::cpu
