// loom::cpu::sgemm / sgemm_batched against a naive triple loop in double precision.
//
// Tolerance: each element is checked as |c - ref| <= (K + 2) * FLT_EPSILON * scale, where
// scale = |alpha| * sum_k |a_ik * b_kj| + |beta * c0_ij| is the magnitude of the terms summed.
// This is the standard worst-case bound for a float dot product of length K in any summation
// order (gamma_K = K * u, u = FLT_EPSILON / 2), plus the alpha and beta roundings, with a factor
// of 2 to spare. It is relative to the terms, not to the result, because cancellation can make
// the result itself arbitrarily small.
#include "tensor/cpu/gemm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::cpu {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::random_floats;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A row-major matrix as stored: `rows` x `cols` with row stride `ld` >= cols.
struct Stored {
  int64_t rows, cols, ld;
  std::vector<float> data;
  float at(int64_t r, int64_t col) const { return data[r * ld + col]; }
};

Stored make_stored(int64_t rows, int64_t cols, int64_t pad, uint32_t seed) {
  const int64_t ld = std::max<int64_t>(1, cols + pad);
  return {rows, cols, ld,
          random_floats(static_cast<size_t>(std::max<int64_t>(rows, 1) * ld), seed)};
}

// op(X)[r][col] for a stored matrix.
float op_at(const Stored& x, bool transposed, int64_t r, int64_t col) {
  return transposed ? x.at(col, r) : x.at(r, col);
}

// Checks C (ldc) against alpha * op(A) @ op(B) + beta * C0 computed in double; C0 is C's
// content before the call (NaN entries count as 0 when beta == 0, BLAS semantics).
void expect_gemm_close(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const Stored& a, const Stored& b, float beta, const float* c0,
                       const float* c, int64_t ldc, const std::string& where) {
  int failures = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, abs_dot = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = double(op_at(a, ta, i, p)) * double(op_at(b, tb, p, j));
        dot += term;
        abs_dot += std::abs(term);
      }
      const double before = beta == 0.0f ? 0.0 : double(c0[i * ldc + j]);
      const double ref = double(alpha) * dot + double(beta) * before;
      const double scale = std::abs(double(alpha)) * abs_dot + std::abs(double(beta) * before);
      const double tol = (k + 2) * double(FLT_EPSILON) * scale;
      const double got = c[i * ldc + j];
      if (!(std::abs(got - ref) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << where << ": C[" << i << "][" << j << "] = " << got << ", expected " << ref
                      << " (tolerance " << tol << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << where << ": " << failures << " elements out of tolerance";
}

// ---- sgemm: all transpose combinations x odd sizes x padded leading dims ----

class SgemmTest
    : public ::testing::TestWithParam<std::tuple<bool, bool, std::tuple<int, int, int>>> {};

TEST_P(SgemmTest, MatchesDoubleReference) {
  const auto [ta, tb, mnk] = GetParam();
  const auto [m, n, k] = mnk;
  for (const auto& [alpha, beta, pad] :
       {std::tuple{1.0f, 0.0f, 0}, std::tuple{1.5f, -0.75f, 3}, std::tuple{-0.5f, 1.0f, 1}}) {
    const Stored a = ta ? make_stored(k, m, pad, 1) : make_stored(m, k, pad, 1);
    const Stored b = tb ? make_stored(n, k, pad, 2) : make_stored(k, n, pad, 2);
    const int64_t ldc = n + pad;
    std::vector<float> c0 = random_floats(static_cast<size_t>(m * ldc), 3);
    if (beta == 0.0f) std::fill(c0.begin(), c0.end(), kNaN);  // must be overwritten, not read
    std::vector<float> c = c0;
    sgemm(ta, tb, m, n, k, alpha, a.data.data(), a.ld, b.data.data(), b.ld, beta, c.data(), ldc);
    const std::string where = "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                              " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                              " k=" + std::to_string(k) + " alpha=" + std::to_string(alpha) +
                              " beta=" + std::to_string(beta) + " pad=" + std::to_string(pad);
    expect_gemm_close(ta, tb, m, n, k, alpha, a, b, beta, c0.data(), c.data(), ldc, where);
    // Padding between rows of C is left alone.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = n; j < ldc; ++j) {
        EXPECT_EQ(std::memcmp(&c[i * ldc + j], &c0[i * ldc + j], sizeof(float)), 0) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, SgemmTest,
    ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(std::tuple{1, 1, 1}, std::tuple{7, 13, 5},
                                         std::tuple{33, 17, 65}, std::tuple{1, 40, 9},
                                         std::tuple{70, 1, 130}, std::tuple{96, 130, 257})));

// ---- Degenerate sizes ----

TEST(Sgemm, KZeroScalesCByBeta) {
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  sgemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, c.data(), 3);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  std::vector<float> nan_c(6, kNaN);
  sgemm(true, true, 2, 3, 0, 1.0f, nullptr, 2, nullptr, 1, 0.0f, nan_c.data(), 3);
  EXPECT_EQ(nan_c, std::vector<float>(6, 0.0f)) << "beta == 0 must overwrite C, NaN included";
}

TEST(Sgemm, AlphaZeroDoesNotReadAOrB) {
  const std::vector<float> a(4, kNaN), b(4, kNaN);
  std::vector<float> c = {1, 2, 3, 4};
  sgemm(false, false, 2, 2, 2, 0.0f, a.data(), 2, b.data(), 2, 2.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8}));
}

TEST(Sgemm, EmptyMOrNLeavesCUntouched) {
  const std::vector<float> a = random_floats(12, 1), b = random_floats(12, 2);
  std::vector<float> c = {7, 7, 7};
  sgemm(false, false, 0, 3, 4, 1.0f, a.data(), 4, b.data(), 3, 0.0f, c.data(), 3);
  sgemm(false, false, 3, 0, 4, 1.0f, a.data(), 4, b.data(), 1, 0.0f, c.data(), 1);
  sgemm(false, false, 0, 0, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1);
  EXPECT_EQ(c, (std::vector<float>{7, 7, 7}));
}

// ---- Batched ----

// batch entries of (m,k) @ (k,n); a broadcast operand has stride 0.
void check_batched(bool ta, bool tb, bool broadcast_a, bool broadcast_b) {
  const int64_t batch = 5, m = 9, n = 11, k = 7, pad = 2;
  const float alpha = 0.75f, beta = -1.25f;
  const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  const int64_t stride_a = broadcast_a ? 0 : a_rows * lda + 5;  // gaps between matrices too
  const int64_t stride_b = broadcast_b ? 0 : b_rows * ldb + 3;
  const int64_t stride_c = m * ldc + 4;
  const std::vector<float> a =
      random_floats(static_cast<size_t>(stride_a * (batch - 1) + a_rows * lda), 11);
  const std::vector<float> b =
      random_floats(static_cast<size_t>(stride_b * (batch - 1) + b_rows * ldb), 12);
  const std::vector<float> c0 = random_floats(static_cast<size_t>(stride_c * batch), 13);
  std::vector<float> c = c0;
  sgemm_batched(batch, ta, tb, m, n, k, alpha, a.data(), lda, stride_a, b.data(), ldb, stride_b,
                beta, c.data(), ldc, stride_c);
  for (int64_t i = 0; i < batch; ++i) {
    const Stored ai{
        a_rows, a_cols, lda,
        std::vector<float>(a.begin() + i * stride_a, a.begin() + i * stride_a + a_rows * lda)};
    const Stored bi{
        b_rows, b_cols, ldb,
        std::vector<float>(b.begin() + i * stride_b, b.begin() + i * stride_b + b_rows * ldb)};
    expect_gemm_close(ta, tb, m, n, k, alpha, ai, bi, beta, c0.data() + i * stride_c,
                      c.data() + i * stride_c, ldc,
                      "batch entry " + std::to_string(i) + " ta=" + std::to_string(ta) + " tb=" +
                          std::to_string(tb) + " broadcast_a=" + std::to_string(broadcast_a) +
                          " broadcast_b=" + std::to_string(broadcast_b));
  }
  // The gaps between C matrices are left alone.
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t e = (m - 1) * ldc + n; e < stride_c; ++e) {
      EXPECT_EQ(c[i * stride_c + e], c0[i * stride_c + e])
          << "gap element " << e << " of entry " << i;
    }
  }
}

TEST(SgemmBatched, IndependentMatrices) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) check_batched(ta, tb, false, false);
  }
}

TEST(SgemmBatched, StrideZeroBroadcastsA) { check_batched(false, true, true, false); }
TEST(SgemmBatched, StrideZeroBroadcastsB) { check_batched(true, false, false, true); }
TEST(SgemmBatched, StrideZeroBroadcastsBoth) { check_batched(false, false, true, true); }

// Entries at arbitrary offsets, as attention's heads lie in a (B, T, H, D) activation: entry
// (b, h) of A starts at b * T * H * D + h * D with row stride H * D. Values against the double
// reference on one thread and on two.
TEST(SgemmBatched, AtOffsetsHeadsAsTheyLie) {
  const int64_t batches = 3, heads = 4, t = 10, d = 6;
  const int64_t row = heads * d;
  const std::vector<float> a = random_floats(static_cast<size_t>(batches * t * row), 21);
  const std::vector<float> b = random_floats(static_cast<size_t>(batches * t * row), 22);
  std::vector<int64_t> offsets, c_offsets;
  for (int64_t bi = 0; bi < batches; ++bi) {
    for (int64_t h = 0; h < heads; ++h) {
      offsets.push_back(bi * t * row + h * d);
      c_offsets.push_back(static_cast<int64_t>(c_offsets.size()) * t * t);
    }
  }
  const int64_t batch = batches * heads;
  const std::vector<float> zeros(static_cast<size_t>(t * t), 0.0f);
  for (int threads : {1, 2}) {
    set_gemm_threads(threads);
    std::vector<float> c(static_cast<size_t>(batch * t * t), kNaN);
    // scores = q @ k^T per head: A (t, d) row stride `row`, B (t, d) transposed.
    sgemm_batched_at(batch, false, true, t, t, d, 1.0f, a.data(), row, offsets, b.data(), row,
                     offsets, 0.0f, c.data(), t, c_offsets);
    for (int64_t i = 0; i < batch; ++i) {
      Stored ai{
          t, d, row,
          std::vector<float>(a.begin() + offsets[i], a.begin() + offsets[i] + (t - 1) * row + d)};
      Stored bi{
          t, d, row,
          std::vector<float>(b.begin() + offsets[i], b.begin() + offsets[i] + (t - 1) * row + d)};
      ai.data.resize(static_cast<size_t>(t * row));
      bi.data.resize(static_cast<size_t>(t * row));
      expect_gemm_close(false, true, t, t, d, 1.0f, ai, bi, 0.0f, zeros.data(),
                        c.data() + c_offsets[i], t,
                        "head entry " + std::to_string(i) + ", threads " + std::to_string(threads));
    }
  }
  set_gemm_threads(2);
}

TEST(SgemmBatched, AtOffsetsNamesAMissingOffset) {
  std::vector<float> x(16, 1.0f), c(8);
  const std::vector<int64_t> two = {0, 4}, one = {0};
  EXPECT_THAT(error_of([&] {
                sgemm_batched_at(2, false, false, 2, 2, 2, 1, x.data(), 2, two, x.data(), 2, one, 0,
                                 c.data(), 2, two);
              }),
              HasSubstr("batch 2 needs 2 offsets per operand, got 2 (A), 1 (B), 2 (C)"));
  const std::vector<int64_t> negative = {0, -4};
  EXPECT_THAT(error_of([&] {
                sgemm_batched_at(2, false, false, 2, 2, 2, 1, x.data(), 2, negative, x.data(), 2,
                                 two, 0, c.data(), 2, two);
              }),
              HasSubstr("offsets must be >= 0, got A -4, B 4, C 4 at entry 1"));
}

TEST(SgemmBatched, KZeroAndEmptyBatch) {
  std::vector<float> c = {1, 2, 3, 4, kNaN, kNaN};
  // Two 1x2 matrices with a gap of one element between them... stride 3.
  sgemm_batched(2, false, false, 1, 2, 0, 1.0f, nullptr, 1, 0, nullptr, 2, 0, 0.0f, c.data(), 2, 3);
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_EQ(c[1], 0.0f);
  EXPECT_EQ(c[2], 3.0f);
  EXPECT_EQ(c[3], 0.0f);
  EXPECT_EQ(c[4], 0.0f);
  std::vector<float> d = {5, 6};
  sgemm_batched(0, false, false, 1, 2, 3, 1.0f, nullptr, 3, 3, nullptr, 2, 6, 0.0f, d.data(), 2, 2);
  EXPECT_EQ(d, (std::vector<float>{5, 6}));
}

// ---- Argument checks: loom::Error with the argument named ----

TEST(SgemmChecks, RejectsBadLeadingDimsAndSizes) {
  std::vector<float> buf(64, 1.0f);
  const float* p = buf.data();
  float* c = buf.data();
  EXPECT_THAT(error_of([&] { sgemm(false, false, 4, 5, 6, 1, p, 5, p, 5, 0, c, 5); }),
              HasSubstr("lda=5 is too small"));
  EXPECT_THAT(error_of([&] { sgemm(true, false, 4, 5, 6, 1, p, 3, p, 5, 0, c, 5); }),
              HasSubstr("lda must be >= max(1, 4)"));
  EXPECT_THAT(error_of([&] { sgemm(false, false, 4, 5, 6, 1, p, 6, p, 4, 0, c, 5); }),
              HasSubstr("ldb=4 is too small"));
  EXPECT_THAT(error_of([&] { sgemm(false, true, 4, 5, 6, 1, p, 6, p, 5, 0, c, 5); }),
              HasSubstr("ldb must be >= max(1, 6)"));
  EXPECT_THAT(error_of([&] { sgemm(false, false, 4, 5, 6, 1, p, 6, p, 5, 0, c, 4); }),
              HasSubstr("ldc=4 is too small"));
  EXPECT_THAT(error_of([&] { sgemm(false, false, 0, 0, 0, 1, p, 0, p, 1, 0, c, 1); }),
              HasSubstr("lda=0"));
  EXPECT_THAT(error_of([&] { sgemm(false, false, -1, 5, 6, 1, p, 6, p, 5, 0, c, 5); }),
              HasSubstr("sizes must be >= 0, got m=-1"));
  EXPECT_THAT(error_of([&] { sgemm(false, false, 2, 2, 2, 1, nullptr, 2, p, 2, 0, c, 2); }),
              HasSubstr("A is null"));
}

TEST(SgemmChecks, RejectsOverlappingOrNegativeBatchStrides) {
  std::vector<float> buf(256, 1.0f);
  const float* p = buf.data();
  float* c = buf.data();
  EXPECT_THAT(
      error_of([&] { sgemm_batched(2, false, false, 3, 4, 2, 1, p, 2, 6, p, 4, 8, 0, c, 4, 0); }),
      HasSubstr("stride_c must be >= (m-1)*ldc + n = 12"));
  EXPECT_THAT(
      error_of([&] { sgemm_batched(2, false, false, 3, 4, 2, 1, p, 2, -6, p, 4, 8, 0, c, 4, 12); }),
      HasSubstr("strides must be >= 0"));
  EXPECT_THAT(
      error_of([&] { sgemm_batched(-1, false, false, 3, 4, 2, 1, p, 2, 6, p, 4, 8, 0, c, 4, 12); }),
      HasSubstr("batch must be >= 0"));
  // One entry may use any stride_c: nothing can overlap.
  EXPECT_NO_THROW(sgemm_batched(1, false, false, 3, 4, 2, 1, p, 2, 6, p, 4, 8, 0, c, 4, 0));
}

// ---- Library and threads ----

TEST(GemmLibrary, NamesOneDnn) {
  EXPECT_THAT(std::string(gemm_library_name()), HasSubstr("oneDNN"));
  EXPECT_THAT(std::string(gemm_library_name()), HasSubstr("dnnl_sgemm"));
}

TEST(GemmThreads, SetThreadsKeepsResultsAndAppliesToOtherThreads) {
  EXPECT_THAT(error_of([] { set_gemm_threads(0); }), HasSubstr("n must be >= 1, got 0"));
  const int64_t m = 64, n = 48, k = 96;
  const Stored a = make_stored(m, k, 0, 21), b = make_stored(k, n, 0, 22);
  for (int threads : {1, 2}) {
    set_gemm_threads(threads);
    std::vector<float> c_main(m * n), c_other(m * n);
    sgemm(false, false, m, n, k, 1.0f, a.data.data(), k, b.data.data(), n, 0.0f, c_main.data(), n);
    std::thread other([&] {
      sgemm(false, false, m, n, k, 1.0f, a.data.data(), k, b.data.data(), n, 0.0f, c_other.data(),
            n);
    });
    other.join();
    expect_gemm_close(false, false, m, n, k, 1.0f, a, b, 0.0f, c_main.data(), c_main.data(), n,
                      "main thread, threads=" + std::to_string(threads));
    expect_gemm_close(false, false, m, n, k, 1.0f, a, b, 0.0f, c_other.data(), c_other.data(), n,
                      "other thread, threads=" + std::to_string(threads));
  }
}

}  // namespace
}  // namespace loom::cpu
