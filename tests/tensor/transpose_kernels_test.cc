// cpu::transpose_f32, copy_f32_matrix and arith_f32_matrix (tensor/cpu/transpose.h) against the
// element loop, on sizes that are and are not multiples of the 8 x 8 block and the 32 x 32 tile,
// with leading dims wider than the matrix; values compared exactly (copies, and IEEE's add and
// div computed once per element either way).
#include <gtest/gtest.h>

#include <vector>

#include "tensor/cpu/transpose.h"

namespace loom::cpu {
namespace {

struct Size {
  int64_t rows, cols;
};
const std::vector<Size> kSizes = {{1, 1}, {8, 8}, {3, 70}, {37, 45}, {64, 32}, {33, 8}, {100, 129}};

std::vector<float> numbered(int64_t n, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = offset + static_cast<float>(i) * 0.5f;
  return v;
}

TEST(TransposeF32, EveryElementLandsTransposedAndNothingElseIsWritten) {
  for (const Size s : kSizes) {
    const int64_t src_ld = s.cols + 3, dst_ld = s.rows + 5;
    const std::vector<float> src = numbered(s.rows * src_ld, 1);
    std::vector<float> dst(static_cast<size_t>(s.cols * dst_ld), -7.0f);
    transpose_f32(src.data(), src_ld, s.rows, s.cols, dst.data(), dst_ld);
    for (int64_t c = 0; c < s.cols; ++c) {
      for (int64_t r = 0; r < dst_ld; ++r) {
        const float want = r < s.rows ? src[r * src_ld + c] : -7.0f;  // padding untouched
        ASSERT_EQ(dst[c * dst_ld + r], want) << s.rows << "x" << s.cols << " at " << r << "," << c;
      }
    }
  }
}

// (r, c) of a matrix stored row-major (ld cols + 2) or transposed (ld rows + 2).
struct Stored {
  std::vector<float> data;
  MatrixView view;
  float at(int64_t r, int64_t c) const {
    return view.data[r * view.row_stride + c * view.col_stride];
  }
};

Stored store(Size s, bool transposed, float offset) {
  Stored m;
  const int64_t ld = transposed ? s.rows + 2 : s.cols + 2;
  m.data = numbered((transposed ? s.cols : s.rows) * ld, offset);
  m.view = transposed ? MatrixView{m.data.data(), 1, ld} : MatrixView{m.data.data(), ld, 1};
  return m;
}

TEST(CopyF32Matrix, AnyRowRangeCopiesBetweenRowMajorAndTransposedStorage) {
  for (const Size s : kSizes) {
    for (const bool src_t : {false, true}) {
      for (const bool dst_t : {false, true}) {
        const Stored src = store(s, src_t, 3);
        const int64_t dst_ld = dst_t ? s.rows + 1 : s.cols + 1;
        const int64_t drs = dst_t ? 1 : dst_ld, dcs = dst_t ? dst_ld : 1;
        std::vector<float> dst(static_cast<size_t>((dst_t ? s.cols : s.rows) * dst_ld), -1.0f);
        const int64_t cut = s.rows / 3;  // two row ranges, as two threads would take them
        copy_f32_matrix(src.view, dst.data(), drs, dcs, 0, cut, s.cols);
        copy_f32_matrix(src.view, dst.data(), drs, dcs, cut, s.rows, s.cols);
        for (int64_t r = 0; r < s.rows; ++r) {
          for (int64_t c = 0; c < s.cols; ++c) {
            ASSERT_EQ(dst[r * drs + c * dcs], src.at(r, c))
                << s.rows << "x" << s.cols << " src transposed " << src_t << " dst transposed "
                << dst_t << " at " << r << "," << c;
          }
        }
      }
    }
  }
}

TEST(ArithF32Matrix, EqualsTheElementLoopForEachStorageOfEachOperand) {
  for (const Size s : kSizes) {
    for (const bool a_t : {false, true}) {
      for (const bool b_t : {false, true}) {
        const Stored a = store(s, a_t, 1), b = store(s, b_t, 2);
        const int64_t ld = s.cols + 4;
        std::vector<float> sum(static_cast<size_t>(s.rows * ld), -1.0f), quotient = sum;
        arith_f32_matrix(Arith::kAdd, a.view, b.view, sum.data(), ld, 0, s.rows, s.cols);
        const int64_t cut = (s.rows + 1) / 2;
        arith_f32_matrix(Arith::kDiv, a.view, b.view, quotient.data(), ld, 0, cut, s.cols);
        arith_f32_matrix(Arith::kDiv, a.view, b.view, quotient.data(), ld, cut, s.rows, s.cols);
        for (int64_t r = 0; r < s.rows; ++r) {
          for (int64_t c = 0; c < ld; ++c) {
            const bool inside = c < s.cols;
            ASSERT_EQ(sum[r * ld + c], inside ? a.at(r, c) + b.at(r, c) : -1.0f)
                << s.rows << "x" << s.cols << " a transposed " << a_t << " b transposed " << b_t;
            ASSERT_EQ(quotient[r * ld + c], inside ? a.at(r, c) / b.at(r, c) : -1.0f)
                << s.rows << "x" << s.cols << " a transposed " << a_t << " b transposed " << b_t;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom::cpu
