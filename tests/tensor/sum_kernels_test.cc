// cpu::sum_f32 / column_sums_f32 / row_sums_f32 (the CPU `sum`'s fast paths) against serial f64
// loops: column sums equal the serial loop exactly (same order), whole and row sums within the
// f64 reordering bound (n * 2^-52 relative to the sum of magnitudes, far below f32's rounding),
// and every kernel bit-identical on 1, 2 and 3 threads. ops::sum takes the fast path for
// contiguous f32 and gives the generic loop's values on a strided view of the same numbers.
#include "tensor/cpu/sum_kernels.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::cpu {
namespace {

using testing::random_floats;

double serial_sum(const float* x, int64_t n, int64_t stride = 1) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i * stride]);
  return s;
}

double magnitude(const float* x, int64_t n, int64_t stride = 1) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(x[i * stride]));
  return s;
}

TEST(SumKernels, WholeArrayOnAnyThreadCount) {
  for (int64_t n : {int64_t{1}, int64_t{7}, kSumBlock - 1, kSumBlock + 3, int64_t{300001}}) {
    const std::vector<float> x = random_floats(static_cast<size_t>(n), 5);
    std::vector<double> by_threads;
    for (int threads : {1, 2, 3}) {
      set_gemm_threads(threads);
      by_threads.push_back(sum_f32(x.data(), n));
    }
    EXPECT_EQ(by_threads[0], by_threads[1]) << "n " << n;
    EXPECT_EQ(by_threads[0], by_threads[2]) << "n " << n;
    EXPECT_NEAR(by_threads[0], serial_sum(x.data(), n),
                static_cast<double>(n) * DBL_EPSILON * magnitude(x.data(), n))
        << "n " << n;
  }
  set_gemm_threads(2);
}

TEST(SumKernels, ColumnsEqualTheSerialLoopExactly) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1024, 768}, {3, 1000}, {50000, 3}}) {
    const std::vector<float> x = random_floats(static_cast<size_t>(rows * cols), 6);
    for (int threads : {1, 2, 3}) {
      set_gemm_threads(threads);
      std::vector<double> out(static_cast<size_t>(cols), -1.0);
      column_sums_f32(x.data(), rows, cols, out.data());
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(out[c], serial_sum(x.data() + c, rows, cols))
            << rows << "x" << cols << " column " << c << " threads " << threads;
      }
    }
  }
  set_gemm_threads(2);
}

TEST(SumKernels, RowsOnAnyThreadCount) {
  const int64_t rows = 1000, cols = 333;
  const std::vector<float> x = random_floats(static_cast<size_t>(rows * cols), 7);
  std::vector<std::vector<double>> by_threads;
  for (int threads : {1, 2, 3}) {
    set_gemm_threads(threads);
    std::vector<double> out(static_cast<size_t>(rows));
    row_sums_f32(x.data(), rows, cols, out.data());
    by_threads.push_back(out);
  }
  set_gemm_threads(2);
  EXPECT_EQ(by_threads[0], by_threads[1]);
  EXPECT_EQ(by_threads[0], by_threads[2]);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * cols;
    ASSERT_NEAR(by_threads[0][r], serial_sum(row, cols),
                static_cast<double>(cols) * DBL_EPSILON * magnitude(row, cols))
        << "row " << r;
  }
}

// ops::sum on a contiguous tensor (the kernels) and on a transposed copy viewed back (the
// generic strided loop) over the same numbers: equal f32 results.
TEST(SumKernels, OpsSumMatchesTheGenericLoop) {
  const Tensor x = ops::uniform({16, 64, 96}, 3, -1.0, 1.0);
  // The same values, laid out transposed: not contiguous, so the generic loop runs.
  const Tensor strided = ops::transpose(ops::contiguous(ops::transpose(x, 0, 2)), 0, 2);
  ASSERT_FALSE(strided.is_contiguous());
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{0, 1}, {2}, {1, 2}, {}, {0}, {0, 1, 2}}) {
    const Tensor fast = ops::sum(x, dims), generic = ops::sum(strided, dims);
    ASSERT_EQ(fast.shape(), generic.shape());
    const std::vector<double> a = ops::to_vector(fast), b = ops::to_vector(generic);
    for (size_t i = 0; i < a.size(); ++i) {
      // One f32 rounding of f64 sums that differ by reordering at most: within one f32 ulp.
      EXPECT_NEAR(a[i], b[i], std::fabs(b[i]) * FLT_EPSILON + 1e-30)
          << "dims size " << dims.size() << " element " << i;
    }
  }
}

}  // namespace
}  // namespace loom::cpu
