#include "tensor/cpu/transpose.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace loom::cpu {

namespace {

// The 8 x 8 block at src (leading dim src_ld) written transposed at dst (leading dim dst_ld):
// unpack pairs of rows, shuffle quads, swap 128-bit halves.
inline void transpose_8x8(const float* src, int64_t src_ld, float* dst, int64_t dst_ld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_ld);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1)
    const __m256 lo = t[4 * h], hi = t[4 * h + 1], lo2 = t[4 * h + 2], hi2 = t[4 * h + 3];
    r[4 * h + 0] = _mm256_shuffle_ps(lo, lo2, _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * h + 1] = _mm256_shuffle_ps(lo, lo2, _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * h + 2] = _mm256_shuffle_ps(hi, hi2, _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * h + 3] = _mm256_shuffle_ps(hi, hi2, _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_ld, _mm256_permute2f128_ps(r[i], r[4 + i], 0x20));
    _mm256_storeu_ps(dst + (4 + i) * dst_ld, _mm256_permute2f128_ps(r[i], r[4 + i], 0x31));
  }
}

// Rows and columns of a cache tile: its source lines (kTile rows of kTile floats) and its
// destination's stay in L1 even where the leading dims alias to a few cache sets.
constexpr int64_t kTile = 32;

}  // namespace

void transpose_f32(const float* src, int64_t src_ld, int64_t rows, int64_t cols, float* dst,
                   int64_t dst_ld) {
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      int64_t r = r0;
      for (; r + 8 <= r1; r += 8) {
        int64_t c = c0;
        for (; c + 8 <= c1; c += 8)
          transpose_8x8(src + r * src_ld + c, src_ld, dst + c * dst_ld + r, dst_ld);
        for (; c < c1; ++c) {
          for (int64_t i = r; i < r + 8; ++i) dst[c * dst_ld + i] = src[i * src_ld + c];
        }
      }
      for (; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) dst[c * dst_ld + r] = src[r * src_ld + c];
      }
    }
  }
}

void arith_f32_matrix(Arith op, MatrixView a, MatrixView b, float* out, int64_t out_ld,
                      int64_t row_begin, int64_t row_end, int64_t cols) {
  // A transposed operand's (rows, cols) tile, copied row-major (kTile x kTile floats each).
  alignas(64) float tile_a[kTile * kTile], tile_b[kTile * kTile];
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kTile) {
    const int64_t rows = std::min(row_end, r0 + kTile) - r0;
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t width = std::min(cols, c0 + kTile) - c0;
      // Each operand's tile as (pointer, leading dim): in place when row-major.
      const auto tile = [&](const MatrixView& m,
                            float* buffer) -> std::pair<const float*, int64_t> {
        const float* corner = m.data + r0 * m.row_stride + c0 * m.col_stride;
        if (m.row_major()) return {corner, m.row_stride};
        // Stored transposed: (width, rows) row-major at leading dim col_stride.
        transpose_f32(corner, m.col_stride, width, rows, buffer, kTile);
        return {buffer, kTile};
      };
      const auto [pa, lda] = tile(a, tile_a);
      const auto [pb, ldb] = tile(b, tile_b);
      arith_f32_block(op, pa, lda, pb, ldb, out + r0 * out_ld + c0, out_ld, rows, width);
    }
  }
}

void copy_f32_matrix(MatrixView src, float* dst, int64_t dst_row_stride, int64_t dst_col_stride,
                     int64_t row_begin, int64_t row_end, int64_t cols) {
  const int64_t rows = row_end - row_begin;
  const float* s = src.data + row_begin * src.row_stride;
  float* d = dst + row_begin * dst_row_stride;
  const bool dst_row_major = dst_col_stride == 1;
  if (src.row_major() && dst_row_major) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(d + r * dst_row_stride, s + r * src.row_stride, cols * sizeof(float));
    }
  } else if (!src.row_major() && !dst_row_major) {  // both transposed: columns are runs
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(d + c * dst_col_stride, s + c * src.col_stride, rows * sizeof(float));
    }
  } else if (src.row_major()) {  // dst transposed: its memory is (cols, rows) at dst_col_stride
    transpose_f32(s, src.row_stride, rows, cols, d, dst_col_stride);
  } else {  // src transposed: its memory is (cols, rows) at src.col_stride
    transpose_f32(s, src.col_stride, cols, rows, d, dst_row_stride);
  }
}

}  // namespace loom::cpu
