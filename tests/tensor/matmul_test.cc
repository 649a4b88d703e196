// ops::matmul (tensor/ops_matmul.h) against a naive f64 implementation of torch.matmul.
//
// Tolerance (f32): |c - ref| <= (K + 2) * FLT_EPSILON * sum_k |a_ik * b_kj| per element, the
// worst-case bound for an f32 dot product of length K in any summation order (gamma_K = K * u,
// u = FLT_EPSILON / 2), with a factor of 2 to spare; relative to the terms because cancellation
// can make the result itself tiny. The reference runs on the exact f32 (or bf16/f16) input
// values. bf16/f16 results are the f32 product rounded once, so they add half an ulp of the
// result (2^-8 / 2^-11 relative).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/ops_matmul.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom::ops {
namespace {

using testing::error_of;
using testing::expect_close;
using testing::random_floats;
using testing::Values;

// Seeded uniform values in [-1, 1), stored as `dtype`.
Tensor random_tensor(const Shape& shape, uint32_t seed, DType dtype = kFloat32) {
  return from_vector(random_floats(shape_numel(shape), seed), shape, dtype);
}

struct Reference {
  Shape shape;
  Values values;
  Values magnitude;  // sum_k |a_ik b_kj| per output element
  int64_t k = 0;
};

// torch.matmul in f64, written from its definition: 1-D operands promoted (and the added dim
// dropped), batch dims broadcast by NumPy rules.
Reference reference_matmul(const Tensor& a_in, const Tensor& b_in) {
  const Values av = to_vector(a_in), bv = to_vector(b_in);
  Shape as = a_in.shape(), bs = b_in.shape();
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  EXPECT_EQ(bs[bs.size() - 2], k);
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const size_t nb = std::max(ab.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t sa = i < nb - ab.size() ? 1 : ab[i - (nb - ab.size())];
    const int64_t sb = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    batch[i] = sa == 1 ? sb : sa;
  }
  // Row-major batch offset of broadcast index `idx` in a batch shape `own` (right-aligned).
  auto batch_offset = [&](const std::vector<int64_t>& idx, const Shape& own) {
    int64_t offset = 0;
    for (size_t i = 0; i < own.size(); ++i) {
      const int64_t coord = own[i] == 1 ? 0 : idx[i + (nb - own.size())];
      offset = offset * own[i] + coord;
    }
    return offset;
  };
  Reference r;
  r.k = k;
  const int64_t batch_count = shape_numel(batch);
  r.values.assign(batch_count * m * n, 0.0);
  r.magnitude.assign(batch_count * m * n, 0.0);
  std::vector<int64_t> idx(nb, 0);
  for (int64_t bi = 0; bi < batch_count; ++bi) {
    int64_t rem = bi;
    for (size_t i = nb; i-- > 0;) {
      idx[i] = rem % batch[i];
      rem /= batch[i];
    }
    const int64_t ao = batch_offset(idx, ab) * m * k, bo = batch_offset(idx, bb) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double t = av[ao + i * k + p] * bv[bo + p * n + j];
          acc += t;
          mag += std::abs(t);
        }
        r.values[(bi * m + i) * n + j] = acc;
        r.magnitude[(bi * m + i) * n + j] = mag;
      }
  }
  r.shape = batch;
  if (!a_vec) r.shape.push_back(m);
  if (!b_vec) r.shape.push_back(n);
  return r;
}

// Checks matmul(a, b) against the reference; returns the result.
Tensor check_matmul(const Tensor& a, const Tensor& b) {
  const Reference r = reference_matmul(a, b);
  const Tensor c = matmul(a, b);
  EXPECT_EQ(c.shape(), r.shape);
  EXPECT_EQ(c.dtype(), a.dtype());
  const Values cv = to_vector(c);
  EXPECT_EQ(cv.size(), r.values.size());
  const double out_ulp = a.dtype() == kBFloat16  ? 0x1.0p-8
                         : a.dtype() == kFloat16 ? 0x1.0p-11
                                                 : 0.0;
  for (size_t i = 0; i < std::min(cv.size(), r.values.size()); ++i) {
    const double tol = (r.k + 2) * FLT_EPSILON * r.magnitude[i] + out_ulp * std::abs(r.values[i]);
    EXPECT_NEAR(cv[i], r.values[i], tol) << "element " << i << " of " << shape_str(r.shape);
  }
  return c;
}

// Two results of the same product in different layouts agree within the f32 bound.
void expect_same_product(const Tensor& x, const Tensor& y, const Tensor& a, const Tensor& b) {
  const Reference r = reference_matmul(a, b);
  const Values xv = to_vector(x), yv = to_vector(y);
  ASSERT_EQ(x.shape(), y.shape());
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_NEAR(xv[i], yv[i], 2 * (r.k + 2) * FLT_EPSILON * r.magnitude[i]) << i;
  }
}

TEST(MatmulTest, TwoD) {
  const Tensor a = random_tensor({5, 7}, 1), b = random_tensor({7, 3}, 2);
  check_matmul(a, b);
  // A hand-checked product.
  const Tensor x = from_vector({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  const Tensor y = from_vector({7.f, 8.f, 9.f, 10.f, 11.f, 12.f}, {3, 2});
  EXPECT_EQ(to_vector(matmul(x, y)), (Values{58, 64, 139, 154}));
  // Larger than any blocking (several cache tiles), odd sizes.
  check_matmul(random_tensor({67, 129}, 3), random_tensor({129, 33}, 4));
}

TEST(MatmulTest, Batched) {
  check_matmul(random_tensor({4, 5, 6}, 5), random_tensor({4, 6, 3}, 6));
  check_matmul(random_tensor({2, 3, 4, 5}, 7), random_tensor({2, 3, 5, 2}, 8));
}

TEST(MatmulTest, BroadcastBatch) {
  const Tensor c = check_matmul(random_tensor({2, 1, 3, 4}, 9), random_tensor({5, 4, 6}, 10));
  EXPECT_EQ(c.shape(), (Shape{2, 5, 3, 6}));
  // A 2-D operand against a batch, both ways.
  EXPECT_EQ(check_matmul(random_tensor({3, 4}, 11), random_tensor({2, 4, 5}, 12)).shape(),
            (Shape{2, 3, 5}));
  EXPECT_EQ(check_matmul(random_tensor({2, 3, 4}, 13), random_tensor({4, 5}, 14)).shape(),
            (Shape{2, 3, 5}));
  // A 2-D operand shared by the batch: rows stacked evenly (one GEMM over batch x rows), rows
  // with padding between them (a narrowed view) and a transposed shared operand.
  check_matmul(random_tensor({2, 3, 5, 4}, 30), random_tensor({4, 6}, 31));
  check_matmul(narrow(random_tensor({3, 5, 6}, 32), 2, 1, 4), random_tensor({4, 2}, 33));
  check_matmul(random_tensor({3, 70, 9}, 34), transpose(random_tensor({11, 9}, 35), 0, 1));
  // Size-1 batch dims on both sides.
  EXPECT_EQ(check_matmul(random_tensor({1, 3, 2, 4}, 15), random_tensor({2, 1, 4, 3}, 16)).shape(),
            (Shape{2, 3, 2, 3}));
}

TEST(MatmulTest, OneDOperands) {
  const Tensor v = random_tensor({4}, 17);
  EXPECT_EQ(check_matmul(v, random_tensor({4, 3}, 18)).shape(), Shape{3});
  EXPECT_EQ(check_matmul(random_tensor({3, 4}, 19), v).shape(), Shape{3});
  const Tensor dot = check_matmul(v, random_tensor({4}, 20));
  EXPECT_EQ(dot.shape(), Shape{});
  EXPECT_EQ(check_matmul(random_tensor({2, 3, 4}, 21), v).shape(), (Shape{2, 3}));
  EXPECT_EQ(check_matmul(v, random_tensor({2, 4, 5}, 22)).shape(), (Shape{2, 5}));
  EXPECT_EQ(
      matmul(from_vector({1.f, 2.f, 3.f}, {3}), from_vector({4.f, 5.f, 6.f}, {3})).item<float>(),
      32.0f);
  // A strided vector.
  const Tensor sv = slice(random_tensor({8}, 23), 0, 0, 8, 2);
  check_matmul(random_tensor({3, 4}, 24), sv);
  check_matmul(sv, random_tensor({4, 2}, 25));
}

TEST(MatmulTest, TransposedViews) {
  const Tensor a = random_tensor({6, 5}, 26);  // a.T is (5, 6)
  const Tensor b = random_tensor({6, 4}, 27);
  const Tensor bt = random_tensor({4, 6}, 28);  // bt.T is (6, 4)
  const Tensor at = transpose(a, 0, 1);
  const Tensor btt = transpose(bt, 0, 1);
  ASSERT_FALSE(at.is_contiguous());
  // a.T @ b, a.T @ bt.T, (a.T @ b).T-like combos: each equals the product of contiguous copies.
  expect_same_product(check_matmul(at, b), matmul(contiguous(at), b), at, b);
  expect_same_product(check_matmul(at, btt), matmul(contiguous(at), contiguous(btt)), at, btt);
  const Tensor c = random_tensor({5, 6}, 29);
  expect_same_product(check_matmul(c, btt), matmul(c, contiguous(btt)), c, btt);
  // Batched transposes of the last two dims, and a transpose that moves a batch dim.
  const Tensor x = transpose(random_tensor({3, 4, 5}, 30), -1, -2);  // (3, 5, 4)
  const Tensor y = transpose(random_tensor({3, 2, 4}, 31), 1, 2);    // (3, 4, 2)
  expect_same_product(check_matmul(x, y), matmul(contiguous(x), contiguous(y)), x, y);
  const Tensor z = transpose(random_tensor({5, 3, 4}, 32), 0, 1);  // (3, 5, 4): batch stride 4
  expect_same_product(check_matmul(z, y), matmul(contiguous(z), y), z, y);
  // Transposed single rows / columns (degenerate strides).
  check_matmul(transpose(random_tensor({4, 1}, 33), 0, 1), random_tensor({4, 3}, 34));
  check_matmul(random_tensor({3, 4}, 35), transpose(random_tensor({1, 4}, 36), 0, 1));
}

TEST(MatmulTest, NonContiguousNonTransposedOperands) {
  // Column steps: neither row- nor column-major.
  const Tensor a = slice(random_tensor({5, 12}, 37), 1, 0, 12, 3);  // (5, 4), strides (12, 3)
  const Tensor b = slice(random_tensor({8, 6}, 38), 0, 1, 8, 2);    // (4, 6), strides (12, 1)
  expect_same_product(check_matmul(a, b), matmul(contiguous(a), contiguous(b)), a, b);
  // Narrowed columns (leading dim > cols) and rows.
  const Tensor n = narrow(random_tensor({4, 9}, 39), 1, 2, 5);  // (4, 5), strides (9, 1), offset 2
  check_matmul(n, narrow(random_tensor({7, 3}, 40), 0, 1, 5));
  // Expanded batch (stride 0) and stepped batch.
  const Tensor e = expand(random_tensor({1, 3, 4}, 41), {4, 3, 4});
  check_matmul(e, random_tensor({4, 4, 2}, 42));
  const Tensor sb = slice(random_tensor({6, 3, 4}, 43), 0, 0, 6, 2);  // batch stride 24
  check_matmul(sb, random_tensor({3, 4, 2}, 44));
  // Permuted batch dims (irregular batch strides).
  const Tensor p = permute(random_tensor({3, 2, 4, 5}, 45), {1, 0, 2, 3});  // (2, 3, 4, 5)
  check_matmul(p, random_tensor({2, 3, 5, 2}, 46));
  // Row broadcast inside the matrix dims (stride-0 rows).
  check_matmul(expand(random_tensor({1, 4}, 47), {3, 4}), random_tensor({4, 2}, 48));
}

TEST(MatmulTest, LowPrecision) {
  for (DType dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor c =
        check_matmul(random_tensor({3, 5}, 49, dtype), random_tensor({5, 4}, 50, dtype));
    EXPECT_EQ(c.dtype(), dtype);
    check_matmul(transpose(random_tensor({2, 6, 3}, 51, dtype), 1, 2),
                 random_tensor({2, 6, 2}, 52, dtype));
    check_matmul(random_tensor({4}, 53, dtype), random_tensor({4}, 54, dtype));
  }
}

TEST(MatmulTest, ZeroSizeDims) {
  // K = 0: an empty sum, so zeros.
  const Tensor z = matmul(zeros({3, 0}), zeros({0, 4}));
  EXPECT_EQ(z.shape(), (Shape{3, 4}));
  EXPECT_EQ(to_vector(z), Values(12, 0.0));
  const Tensor zb = matmul(zeros({2, 3, 0}), zeros({2, 0, 5}));
  EXPECT_EQ(zb.shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(to_vector(zb), Values(30, 0.0));
  EXPECT_EQ(to_vector(matmul(zeros({0}), zeros({0}))), Values{0.0});
  EXPECT_EQ(to_vector(matmul(zeros({3, 0}, kBFloat16), zeros({0, 2}, kBFloat16))), Values(6, 0.0));
  // M = 0, N = 0, batch = 0.
  EXPECT_EQ(matmul(zeros({0, 3}), zeros({3, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(matmul(zeros({2, 3}), zeros({3, 0})).shape(), (Shape{2, 0}));
  EXPECT_EQ(matmul(zeros({2, 0, 3}), zeros({2, 3, 4})).shape(), (Shape{2, 0, 4}));
  EXPECT_EQ(matmul(zeros({2, 3, 4}), zeros({2, 4, 0})).shape(), (Shape{2, 3, 0}));
  EXPECT_EQ(matmul(zeros({0, 3, 4}), zeros({0, 4, 5})).shape(), (Shape{0, 3, 5}));
  EXPECT_EQ(matmul(zeros({0, 3, 4}), zeros({4, 5})).shape(), (Shape{0, 3, 5}));
}

TEST(MatmulTest, Errors) {
  EXPECT_EQ(error_of([] {
              matmul(zeros({4, 3}), zeros({5, 2}));
            }),
            "matmul: shapes (4, 3) and (5, 2) cannot be multiplied (3 != 5)");
  EXPECT_EQ(error_of([] { matmul(zeros({3}), zeros({4})); }),
            "matmul: shapes (3,) and (4,) cannot be multiplied (3 != 4)");
  EXPECT_EQ(error_of([] {
              matmul(zeros({2, 3, 4}), zeros({3, 5}));
            }),
            "matmul: shapes (2, 3, 4) and (3, 5) cannot be multiplied (4 != 3)");
  EXPECT_EQ(error_of([] {
              matmul(zeros({2, 3, 4}), zeros({3, 4, 5}));
            }),
            "matmul: shapes (2,) and (3,) cannot be broadcast (2 != 3 at dim 0)");
  EXPECT_EQ(error_of([] { matmul(zeros({}), zeros({3})); }),
            "matmul: both operands need at least 1 dim, got shapes () and (3,)");
  EXPECT_EQ(error_of([] {
              matmul(zeros({2, 2}), zeros({2, 2}, kBFloat16));
            }),
            "matmul: expected two floating tensors of one dtype, got f32 and bf16");
  EXPECT_EQ(error_of([] {
              matmul(zeros({2, 2}, kInt64), zeros({2, 2}, kInt64));
            }),
            "matmul: expected two floating tensors of one dtype, got i64 and i64");
}

TEST(MatmulTest, OutputIsFreshAndContiguous) {
  const Tensor a = random_tensor({2, 3}, 55), b = random_tensor({3, 2}, 56);
  const Tensor c = matmul(a, b);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), a.storage());
  EXPECT_NE(c.storage(), b.storage());
  // Inputs are not modified.
  const Values before = to_vector(a);
  matmul(transpose(a, 0, 1), transpose(b, 0, 1));
  EXPECT_EQ(to_vector(a), before);
}

// ops::linear = input @ weight^T + bias with the bias fused into the GEMM (the CPU GEMM
// accumulates into rows that start as the bias): against the same f64 reference, the bias
// counted in the bound's magnitude.
Tensor check_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Reference r = reference_matmul(x, transpose(w, 0, 1));
  const Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), r.shape);
  EXPECT_EQ(y.dtype(), x.dtype());
  const Values yv = to_vector(y), bv = b.defined() ? to_vector(b) : Values(w.size(0), 0.0);
  EXPECT_EQ(yv.size(), r.values.size());
  const double out_ulp = x.dtype() == kBFloat16  ? 0x1.0p-8
                         : x.dtype() == kFloat16 ? 0x1.0p-11
                                                 : 0.0;
  for (size_t i = 0; i < std::min(yv.size(), r.values.size()); ++i) {
    const double bias = bv[i % bv.size()], expected = r.values[i] + bias;
    const double tol =
        (r.k + 3) * FLT_EPSILON * (r.magnitude[i] + std::abs(bias)) + out_ulp * std::abs(expected);
    EXPECT_NEAR(yv[i], expected, tol) << "element " << i << " of " << shape_str(r.shape);
  }
  return y;
}

TEST(LinearTest, FusedBiasMatchesTheReference) {
  check_linear(random_tensor({5, 7}, 60), random_tensor({3, 7}, 61), random_tensor({3}, 62));
  // Batch dims flatten into the GEMM's rows; sizes past any blocking.
  check_linear(random_tensor({2, 33, 129}, 63), random_tensor({67, 129}, 64),
               random_tensor({67}, 65));
  // A non-contiguous input (a transposed view) and no bias.
  check_linear(transpose(random_tensor({7, 5}, 66), 0, 1), random_tensor({4, 7}, 67),
               random_tensor({4}, 68));
  check_linear(random_tensor({5, 7}, 69), random_tensor({3, 7}, 70), Tensor());
  // A bias that is not contiguous takes the composed path (matmul, then add).
  check_linear(random_tensor({5, 7}, 71), random_tensor({3, 7}, 72),
               view(narrow(random_tensor({3, 2}, 73), 1, 0, 1), {3}));
  for (DType dtype : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    check_linear(random_tensor({2, 3, 5}, 74, dtype), random_tensor({4, 5}, 75, dtype),
                 random_tensor({4}, 76, dtype));
  }
}

TEST(LinearTest, FusedAndComposedAgree) {
  // The fused GEMM adds the bias where the composed path adds it after: equal to rounding.
  const Tensor x = random_tensor({8, 16, 32}, 77), w = random_tensor({48, 32}, 78),
               b = random_tensor({48}, 79);
  expect_close({.actual = linear(x, w, b),
                .expected = add(matmul(x, transpose(w, 0, 1)), b),
                .tol = {.rtol = 1e-5, .atol = 1e-5}});
}

TEST(LinearTest, ZeroSizesAndErrors) {
  // K = 0: the empty product is zeros, so every row is the bias.
  EXPECT_EQ(to_vector(linear(zeros({2, 0}), zeros({3, 0}), from_vector({1.f, 2.f, 3.f}, {3}))),
            (Values{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(linear(zeros({0, 4}), zeros({3, 4}), zeros({3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(error_of([] {
              linear(zeros({2, 4}), zeros({3, 5}), zeros({3}));
            }),
            "linear: input of shape (2, 4) does not end in in_features=5 (weight shape (3, 5), "
            "expected (out, in))");
  EXPECT_EQ(error_of([] {
              linear(zeros({2, 4}), zeros({3, 4}), zeros({4}));
            }),
            "linear: the bias must have shape (3), got (4,)");
  EXPECT_EQ(error_of([] {
              linear(zeros({2, 4}), zeros({3, 4}), zeros({3}, kBFloat16));
            }),
            "linear: expected floating input, weight and bias of one dtype, got f32, f32 and bf16");
}

}  // namespace
}  // namespace loom::ops
