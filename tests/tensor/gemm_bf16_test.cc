// loom::cpu::gemm_bf16 against a double-precision loop over the same bf16 values. Operands are
// exact in f32, so the result is the f32 GEMM bound's: |c - ref| <= (K + 2) * FLT_EPSILON * scale
// (scale = sum_k |a_ik b_kj| + |bias_j|), plus half a bf16 ulp of the result when C is bf16 (one
// rounding). Without native bf16 instructions the GEMM is not used (callers convert to f32): the
// tests then skip, saying so.
#include "tensor/cpu/gemm_bf16.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "tensor/half.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::cpu {
namespace {

using testing::random_floats;

#define SKIP_WITHOUT_NATIVE_BF16()                                                            \
  if (!bf16_gemm_native())                                                                    \
  GTEST_SKIP() << "this CPU has no AVX512_BF16 (or LOOM_BF16_GEMM=0): bf16 GEMMs run in f32 " \
                  "through sgemm, tested by gemm_test"

struct Case {
  bool ta, tb;
  int64_t m, n, k, pad;  // pad: extra elements per stored row (leading dims > minimum)
  bool c_bf16, bias;
};

std::vector<uint16_t> bf16_values(size_t count, uint32_t seed) {
  std::vector<uint16_t> out;
  for (float v : random_floats(count, seed)) out.push_back(float_to_bf16(v));
  return out;
}

void check(const Case& c) {
  SCOPED_TRACE(::testing::Message()
               << "ta=" << c.ta << " tb=" << c.tb << " m=" << c.m << " n=" << c.n << " k=" << c.k
               << " pad=" << c.pad << " c_bf16=" << c.c_bf16 << " bias=" << c.bias);
  const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int64_t lda = std::max<int64_t>(a_cols, 1) + c.pad,
                ldb = std::max<int64_t>(b_cols, 1) + c.pad, ldc = std::max<int64_t>(c.n, 1) + c.pad;
  const auto a = bf16_values(static_cast<size_t>(a_rows * lda), 1);
  const auto b = bf16_values(static_cast<size_t>(b_rows * ldb), 2);
  const auto bias = bf16_values(static_cast<size_t>(c.n), 3);
  std::vector<float> c32(static_cast<size_t>(c.m * ldc), -7.0f);
  std::vector<uint16_t> c16(static_cast<size_t>(c.m * ldc), float_to_bf16(-7.0f));
  gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, a.data(), lda, b.data(), ldb,
            c.c_bf16 ? static_cast<void*>(c16.data()) : static_cast<void*>(c32.data()), c.c_bf16,
            ldc, c.bias ? bias.data() : nullptr);
  auto at_a = [&](int64_t i, int64_t p) {
    return bf16_to_float(c.ta ? a[p * lda + i] : a[i * lda + p]);
  };
  auto at_b = [&](int64_t p, int64_t j) {
    return bf16_to_float(c.tb ? b[j * ldb + p] : b[p * ldb + j]);
  };
  int64_t wrong = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double ref = c.bias ? bf16_to_float(bias[j]) : 0.0;
      double scale = std::abs(ref);
      for (int64_t p = 0; p < c.k; ++p) {
        ref += static_cast<double>(at_a(i, p)) * at_b(p, j);
        scale += std::abs(static_cast<double>(at_a(i, p)) * at_b(p, j));
      }
      const double got = c.c_bf16 ? bf16_to_float(c16[i * ldc + j]) : c32[i * ldc + j];
      const double tol =
          (c.k + 2) * FLT_EPSILON * scale + (c.c_bf16 ? 0x1.0p-8 * std::abs(ref) : 0.0);
      if (std::abs(got - ref) > tol && wrong++ < 5) {
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", expected " << ref
                      << " within " << tol;
      }
    }
    // Padding between rows stays untouched.
    for (int64_t j = c.n; j < ldc; ++j) {
      const double pad = c.c_bf16 ? bf16_to_float(c16[i * ldc + j]) : c32[i * ldc + j];
      EXPECT_EQ(pad, -7.0) << "padding of row " << i << " was written";
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(GemmBf16Test, EveryLayoutOutputAndBias) {
  SKIP_WITHOUT_NATIVE_BF16();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool c_bf16 : {false, true}) {
        check({ta, tb, 37, 29, 65, 0, c_bf16, false});
        check({ta, tb, 37, 29, 65, 3, c_bf16, true});
      }
    }
  }
  // Larger than a block, K of GPT-2's MLP.
  check({false, true, 130, 96, 768, 0, true, true});
  // Degenerate sizes: K == 0 gives the bias (or zeros).
  check({false, false, 4, 5, 0, 0, false, true});
  check({false, false, 4, 5, 0, 0, true, false});
  check({false, false, 0, 5, 3, 0, true, false});
}

TEST(GemmBf16Test, BatchedAtOffsetsEqualsOneByOne) {
  SKIP_WITHOUT_NATIVE_BF16();
  const int64_t m = 8, n = 6, k = 16, batch = 3;
  const auto a = bf16_values(static_cast<size_t>(batch * m * k + 5), 4);
  const auto b = bf16_values(static_cast<size_t>(k * n), 5);
  const std::vector<int64_t> a_off{5, 0, 2 * m * k}, b_off{0, 0, 0}, c_off{0, m * n, 2 * m * n};
  std::vector<uint16_t> batched(static_cast<size_t>(batch * m * n)), single(batched.size());
  gemm_bf16_batched_at(batch, false, false, m, n, k, a.data(), k, a_off, b.data(), n, b_off,
                       batched.data(), true, n, c_off);
  for (int64_t i = 0; i < batch; ++i) {
    gemm_bf16(false, false, m, n, k, a.data() + a_off[i], k, b.data(), n, single.data() + c_off[i],
              true, n);
  }
  EXPECT_EQ(batched, single);
}

TEST(GemmBf16Test, BadArgumentsAreNamed) {
  std::vector<uint16_t> x(64);
  EXPECT_THAT(
      [&] { gemm_bf16(false, false, 4, 4, 4, x.data(), 2, x.data(), 4, x.data(), true, 4); },
      ::testing::ThrowsMessage<std::exception>(::testing::HasSubstr("lda=2 is too small")));
  EXPECT_THAT(
      [&] { gemm_bf16(false, false, -1, 4, 4, x.data(), 4, x.data(), 4, x.data(), true, 4); },
      ::testing::ThrowsMessage<std::exception>(::testing::HasSubstr("sizes must be >= 0")));
}

}  // namespace
}  // namespace loom::cpu
