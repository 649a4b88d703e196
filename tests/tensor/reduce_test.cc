// Reductions (tensor/ops_reduce.h): sum / mean / max / sum_to.
//
// Inputs are small integers (exact in f32 and in their f64 accumulators), so sums and means of
// them are compared exactly unless a comment says otherwise; random inputs are compared with a
// naive f64 loop within 1e-6 relative (the kernel accumulates in f64 and rounds once to f32,
// so the only error is that final rounding, 2^-24 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/ops_reduce.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::ops {
namespace {

using testing::error_of;
using testing::fv;
using testing::iota;
using testing::Values;

// x[i][j][k] = 12 i + 4 j + k for shape (2, 3, 4).
TEST(SumTest, SingleDims) {
  Tensor x = iota({2, 3, 4});
  Tensor s0 = sum(x, {0});
  EXPECT_EQ(s0.shape(), (Shape{3, 4}));
  EXPECT_EQ(to_vector(s0), (Values{12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34}));
  Tensor s1 = sum(x, {1});
  EXPECT_EQ(s1.shape(), (Shape{2, 4}));
  EXPECT_EQ(to_vector(s1), (Values{12, 15, 18, 21, 48, 51, 54, 57}));
  Tensor s2 = sum(x, {2});
  EXPECT_EQ(s2.shape(), (Shape{2, 3}));
  EXPECT_EQ(to_vector(s2), (Values{6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(to_vector(sum(x, {-1})), to_vector(s2));
  EXPECT_EQ(to_vector(sum(x, {-3})), to_vector(s0));
  EXPECT_EQ(s0.dtype(), kFloat32);
}

TEST(SumTest, MultipleAndAllDims) {
  Tensor x = iota({2, 3, 4});
  Tensor s02 = sum(x, {0, 2});
  EXPECT_EQ(s02.shape(), Shape{3});
  EXPECT_EQ(to_vector(s02), (Values{60, 92, 124}));
  EXPECT_EQ(to_vector(sum(x, {2, 0})), to_vector(s02));
  EXPECT_EQ(to_vector(sum(x, {-1, 0})), to_vector(s02));
  Tensor s12 = sum(x, {1, 2});
  EXPECT_EQ(to_vector(s12), (Values{66, 210}));
  Tensor all = sum(x);
  EXPECT_EQ(all.shape(), Shape{});
  EXPECT_EQ(all.item<double>(), 276);  // 0 + 1 + ... + 23
  EXPECT_EQ(sum(x, {0, 1, 2}).shape(), Shape{});
  EXPECT_EQ(sum(x, {0, 1, 2}).item<double>(), 276);
}

TEST(SumTest, Keepdim) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(sum(x, {1}, true).shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(to_vector(sum(x, {1}, true)), (Values{12, 15, 18, 21, 48, 51, 54, 57}));
  EXPECT_EQ(sum(x, {0, 2}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(sum(x, {}, true).shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(sum(x, {}, true).item<double>(), 276);
  EXPECT_EQ(mean(x, {-1}, true).shape(), (Shape{2, 3, 1}));
}

TEST(SumTest, NonContiguousInput) {
  Tensor x = iota({2, 3, 4});
  Tensor p = permute(x, {2, 0, 1});  // (4, 2, 3)
  Tensor pc = contiguous(p);
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {1, 2}, {}}) {
    EXPECT_EQ(to_vector(sum(p, dims)), to_vector(sum(pc, dims)));
    EXPECT_EQ(to_vector(sum(p, dims, true)), to_vector(sum(pc, dims, true)));
  }
  // Stepped and expanded views.
  Tensor s = slice(iota({4, 6}), 1, 1, 6, 2);  // cols 1, 3, 5
  EXPECT_EQ(to_vector(sum(s, {1})), (Values{9, 27, 45, 63}));
  EXPECT_EQ(to_vector(sum(s, {0})), (Values{40, 48, 56}));
  Tensor e = expand(fv({1, 2, 3}, {3, 1}), {3, 5});
  EXPECT_EQ(to_vector(sum(e, {1})), (Values{5, 10, 15}));
  EXPECT_EQ(sum(e).item<double>(), 30);
}

TEST(SumTest, ScalarsAndEmpty) {
  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(sum(s).item<float>(), 3.5f);
  EXPECT_EQ(sum(s, {0}).item<float>(), 3.5f);
  EXPECT_EQ(sum(s, {-1}).shape(), Shape{});
  EXPECT_EQ(sum(zeros({0, 3})).item<float>(), 0.0f);
  Tensor z = sum(zeros({0, 3}), {0});
  EXPECT_EQ(z.shape(), Shape{3});
  EXPECT_EQ(to_vector(z), (Values{0, 0, 0}));
  EXPECT_EQ(sum(zeros({2, 0}), {1}).shape(), Shape{2});
  EXPECT_EQ(to_vector(sum(zeros({2, 0}), {1})), (Values{0, 0}));
}

TEST(SumTest, LowPrecisionAccumulatesInF64) {
  // 4096 ones in bf16: a bf16 running sum would stall at 256 (256 + 1 rounds back to 256);
  // the f64 accumulator gets 4096, which bf16 holds exactly.
  Tensor ones_bf = ones({4096}, kBFloat16);
  Tensor s = sum(ones_bf);
  EXPECT_EQ(s.dtype(), kBFloat16);
  EXPECT_EQ(s.item<double>(), 4096);
  // Per-row, on a transposed bf16 input; 0.1 in bf16 is 0.10009765625, times 3 = 0.30029296875,
  // which rounds once to bf16 0.30078125 (0x3e9a).
  Tensor b = transpose(full({3, 2}, 0.1, kBFloat16), 0, 1);
  Tensor r = sum(b, {1});
  EXPECT_EQ(r.dtype(), kBFloat16);
  EXPECT_EQ(to_vector(r), (Values{0.30078125, 0.30078125}));
  // f16 too: 3000 ones sum to 3000, which f16 holds exactly (a f16 running sum stalls at 2048).
  EXPECT_EQ(sum(ones({3000}, kFloat16)).item<double>(), 3000);
  // mean of bf16.
  EXPECT_EQ(mean(fv({1, 2, 3, 6}, {4}, kBFloat16)).item<double>(), 3);
}

TEST(SumTest, IntegerSumsAreExact) {
  // i64 sums must not go through a double: 2^53 + 1 + 1 is 2^53 + 2 exactly, whereas a double
  // accumulator rounds 2^53 + 1 back to 2^53 twice.
  const int64_t p53 = int64_t{1} << 53;
  Tensor x = from_vector_i64(std::vector<int64_t>{p53, 1, 1}, {3});
  Tensor s = sum(x);
  EXPECT_EQ(s.dtype(), kInt64);
  EXPECT_EQ(s.item<int64_t>(), p53 + 2);
  Tensor big = from_vector_i64(
      std::vector<int64_t>{(int64_t{1} << 62) + 1, 3, -7, (int64_t{1} << 61) - 5}, {2, 2});
  EXPECT_EQ(sum(big, {1}).data<int64_t>()[0], (int64_t{1} << 62) + 4);
  EXPECT_EQ(sum(big, {1}).data<int64_t>()[1], (int64_t{1} << 61) - 12);
  EXPECT_EQ(sum(big, {0}).data<int64_t>()[0], (int64_t{1} << 62) - 6);
  EXPECT_EQ(sum(big, {0}).data<int64_t>()[1], (int64_t{1} << 61) - 2);
  // i32.
  Tensor i = iota({3, 4}, kInt32);
  Tensor si = sum(i, {0});
  EXPECT_EQ(si.dtype(), kInt32);
  EXPECT_EQ(to_vector(si), (Values{12, 15, 18, 21}));
  EXPECT_EQ(sum(i).item<int64_t>(), 66);
  EXPECT_EQ(error_of([&] { mean(i); }), "mean: expected a floating tensor, got dtype i32");
}

TEST(SumTest, RandomAgainstNaiveLoop) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(5 * 7 * 9);
  for (float& f : v) f = dist(rng);
  Tensor x = fv(v, {5, 7, 9});
  Tensor s = sum(x, {0, 2});
  Tensor m = mean(transpose(x, 0, 2), {0, 2});  // same elements per output, other layout
  const Values sv = to_vector(s), mv = to_vector(m);
  for (int j = 0; j < 7; ++j) {
    double ref = 0, abs_sum = 0;
    for (int i = 0; i < 5; ++i)
      for (int k = 0; k < 9; ++k) {
        ref += v[(i * 7 + j) * 9 + k];
        abs_sum += std::abs(v[(i * 7 + j) * 9 + k]);
      }
    // One f32 rounding of the f64 result (2^-24 relative), bounded via the term magnitudes.
    EXPECT_NEAR(sv[j], ref, 1e-6 * abs_sum) << j;
    EXPECT_NEAR(mv[j], ref / 45, 1e-6 * abs_sum / 45) << j;
  }
}

TEST(MeanTest, Values) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(to_vector(mean(x, {2})), (Values{1.5, 5.5, 9.5, 13.5, 17.5, 21.5}));
  EXPECT_EQ(to_vector(mean(x, {0, 1})), (Values{10, 11, 12, 13}));
  EXPECT_EQ(mean(x).item<double>(), 11.5);
  EXPECT_EQ(mean(x, {}, true).shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(to_vector(mean(transpose(x, 0, 2), {-1})),
            (Values{6, 10, 14, 7, 11, 15, 8, 12, 16, 9, 13, 17}));
  // Divided in f64 before rounding: 1/3 of 1 in f32 is the nearest float to 1/3.
  EXPECT_EQ(mean(fv({1, 0, 0}, {3})).item<float>(), 1.0f / 3.0f);
}

TEST(ReduceTest, RepeatedAndOutOfRangeDims) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(error_of([&] { sum(x, {1, 1}); }), "sum: dim 1 appears twice in (1, 1)");
  EXPECT_EQ(error_of([&] { sum(x, {0, -3}); }), "sum: dim 0 appears twice in (0, -3)");
  EXPECT_EQ(error_of([&] { mean(x, {2, -1}); }), "mean: dim 2 appears twice in (2, -1)");
  EXPECT_EQ(error_of([&] { sum(x, {3}); }),
            "sum: dim 3 out of range for a tensor of rank 3 (expected -3..2)");
}

TEST(MaxTest, ValuesAndIndicesPerDim) {
  Tensor x = fv({3, 1, 4, 1,  //
                 5, 9, 2, 6,  //
                 5, 3, 5, 8},
                {3, 4});
  auto [v1, i1] = max(x, 1);
  EXPECT_EQ(v1.shape(), Shape{3});
  EXPECT_EQ(i1.dtype(), kInt64);
  EXPECT_EQ(to_vector(v1), (Values{4, 9, 8}));
  EXPECT_EQ(to_vector(i1), (Values{2, 1, 3}));
  auto [v0, i0] = max(x, 0);
  EXPECT_EQ(to_vector(v0), (Values{5, 9, 5, 8}));
  EXPECT_EQ(to_vector(i0), (Values{1, 1, 2, 2}));  // first of the tied 5s in column 0
  auto [vk, ik] = max(x, -1, true);
  EXPECT_EQ(vk.shape(), (Shape{3, 1}));
  EXPECT_EQ(ik.shape(), (Shape{3, 1}));
  EXPECT_EQ(to_vector(ik), (Values{2, 1, 3}));
}

TEST(MaxTest, FirstMaximumOnTies) {
  Tensor x = fv({7, 7, 7, 2, 9, 9}, {2, 3});
  auto [v, i] = max(x, 1);
  EXPECT_EQ(to_vector(v), (Values{7, 9}));
  EXPECT_EQ(to_vector(i), (Values{0, 1}));
  auto [vi, ii] = max(fv({-1, 5, 5, 5}, {4}, kInt64), 0);
  EXPECT_EQ(ii.item<int64_t>(), 1);
  EXPECT_EQ(vi.dtype(), kInt64);
  EXPECT_EQ(vi.item<int64_t>(), 5);
}

TEST(MaxTest, ThreeDNonContiguousAndLowPrecision) {
  // x[i][j][k] = 12 i + 4 j + k, but negated along j so the max over j is at j = 0.
  Tensor x = iota({2, 3, 4});
  Tensor y = sub(scalar_tensor(0.0), x);
  auto [v, i] = max(y, 1);
  EXPECT_EQ(v.shape(), (Shape{2, 4}));
  EXPECT_EQ(to_vector(v), (Values{0, -1, -2, -3, -12, -13, -14, -15}));
  EXPECT_EQ(to_vector(i), (Values{0, 0, 0, 0, 0, 0, 0, 0}));
  auto [vk, ik] = max(x, 1, true);
  EXPECT_EQ(vk.shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(to_vector(vk), (Values{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(to_vector(ik), (Values{2, 2, 2, 2, 2, 2, 2, 2}));
  // Transposed input.
  auto [vt, it] = max(transpose(x, 0, 2), 2);  // (4, 3, 2), max over the original dim 0
  EXPECT_EQ(vt.shape(), (Shape{4, 3}));
  EXPECT_EQ(to_vector(vt), (Values{12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23}));
  EXPECT_EQ(to_vector(it), Values(12, 1.0));
  // bf16 keeps its dtype and exact values.
  auto [vb, ib] = max(fv({0.5, -2, 0.75, 0.75}, {2, 2}, kBFloat16), 1);
  EXPECT_EQ(vb.dtype(), kBFloat16);
  EXPECT_EQ(to_vector(vb), (Values{0.5, 0.75}));
  EXPECT_EQ(to_vector(ib), (Values{0, 0}));
}

TEST(MaxTest, NaNWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto [v, i] = max(fv({1, nan, 5, nan}, {4}), 0);
  EXPECT_TRUE(std::isnan(v.item<float>()));
  EXPECT_EQ(i.item<int64_t>(), 1);  // the first NaN
}

TEST(MaxTest, AllElementsAndErrors) {
  Tensor x = fv({3, -1, 8, 2, 8, 0}, {2, 3});
  Tensor m = max(x);
  EXPECT_EQ(m.shape(), Shape{});
  EXPECT_EQ(m.item<float>(), 8.0f);
  EXPECT_EQ(max(transpose(x, 0, 1)).item<float>(), 8.0f);
  EXPECT_EQ(max(scalar_tensor(-4)).item<float>(), -4.0f);
  EXPECT_EQ(max(fv({-5, -2}, {2}, kInt32)).item<int32_t>(), -2);
  auto [sv, si] = max(scalar_tensor(2.5), 0);
  EXPECT_EQ(sv.shape(), Shape{});
  EXPECT_EQ(sv.item<float>(), 2.5f);
  EXPECT_EQ(si.item<int64_t>(), 0);
  EXPECT_EQ(error_of([] {
              max(zeros({2, 0}));
            }),
            "max: cannot reduce a tensor with no elements (shape (2, 0))");
  EXPECT_EQ(error_of([] {
              max(zeros({2, 0}), 1);
            }),
            "max: cannot reduce over dim 1 of size 0 (tensor shape (2, 0))");
  // Reducing a non-empty dim of a tensor with another empty dim is fine.
  EXPECT_EQ(max(zeros({2, 0}), 0).first.shape(), Shape{0});
  EXPECT_EQ(error_of([] { max(zeros({2}), 1); }),
            "max: dim 1 out of range for a tensor of rank 1 (expected -1..0)");
}

TEST(SumToTest, ReducesBroadcastDims) {
  Tensor g = iota({2, 3, 4});
  EXPECT_TRUE(sum_to(g, {2, 3, 4}).is_same(g));
  Tensor a = sum_to(g, {3, 4});
  EXPECT_EQ(a.shape(), (Shape{3, 4}));
  EXPECT_EQ(to_vector(a), to_vector(sum(g, {0})));
  Tensor b = sum_to(g, {3, 1});
  EXPECT_EQ(b.shape(), (Shape{3, 1}));
  EXPECT_EQ(to_vector(b), (Values{60, 92, 124}));
  Tensor c = sum_to(g, {1, 3, 1});
  EXPECT_EQ(c.shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(to_vector(c), (Values{60, 92, 124}));
  Tensor d = sum_to(g, {});
  EXPECT_EQ(d.shape(), Shape{});
  EXPECT_EQ(d.item<double>(), 276);
  Tensor e = sum_to(g, {4});
  EXPECT_EQ(to_vector(e), (Values{60, 66, 72, 78}));
  Tensor f = sum_to(g, {2, 1, 4});
  EXPECT_EQ(to_vector(f), (Values{12, 15, 18, 21, 48, 51, 54, 57}));
  // Size-1 dims that stay size 1 are not summed.
  Tensor h = sum_to(iota({2, 1, 3}), {1, 3});
  EXPECT_EQ(to_vector(h), (Values{3, 5, 7}));
  // It inverts broadcasting: sum_to(expand(x) * 1, x.shape) == x * (broadcast factor).
  Tensor x = fv({1, 2, 3}, {3, 1});
  EXPECT_EQ(to_vector(sum_to(contiguous(expand(x, {2, 3, 5})), {3, 1})), (Values{10, 20, 30}));
  EXPECT_EQ(error_of([&] {
              sum_to(g, {2, 2, 3, 4});
            }),
            "sum_to: cannot reduce shape (2, 3, 4) to the larger shape (2, 2, 3, 4)");
  EXPECT_EQ(error_of([&] {
              sum_to(g, {5, 4});
            }),
            "sum_to: shape (2, 3, 4) is not a broadcast of (5, 4)");
}

}  // namespace
}  // namespace loom::ops
