// Elementwise ops (tensor/ops_elementwise.h): broadcasting, non-contiguous operands, dtype
// promotion, scalar forms, unary math against std:: in double, where/masked_fill/eq/gt, add_.
//
// Tolerances: binary arithmetic on small integers and dyadic fractions is exact and compared
// exactly. Unary math computes in f32 with the C library's float functions, which are accurate
// to a few ulp; results are compared to the double-precision std:: function with
// |got - want| <= 4 ulp(f32) relative (4 * 2^-23 * |want|). gelu gets 32 ulp relative plus
// 1e-5 absolute: for negative x, 1 + tanh(z) cancels, so tanh's f32 error (~1 ulp of 1) is
// multiplied by |x| / 2 <= 5 in the result. bf16/f16 compare with the reference at the rounded
// input and allow one more rounding of the output (2^-8 / 2^-11 relative: half an ulp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tensor/ops_elementwise.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom::ops {
namespace {

using testing::error_of;
using testing::expect_bitwise_equal;
using testing::expect_close;
using testing::fv;
using testing::iota;
using testing::Values;

constexpr double kF32Ulp = 0x1.0p-23;

// ---- binary ops: values and broadcasting ----

// A batched f32 operand stored transposed, large enough to split over threads, takes the blocked
// kernels (tensor/cpu/transpose.h): every element as the element loop computes it.
TEST(BinaryTest, TransposedF32OperandsOfAnySizeGiveTheElementLoopsValues) {
  const int64_t batch = 3, rows = 130, cols = 301;
  const Tensor a = iota({batch, rows, cols});
  const Tensor b_store = add(iota({batch, cols, rows}), 0.5);  // b(i, r, c) = b_store(i, c, r)
  const Tensor b = transpose(b_store, 1, 2);
  const std::vector<double> av = to_vector(a), bv = to_vector(b_store);
  const auto b_at = [&](int64_t i, int64_t r, int64_t c) { return bv[(i * cols + c) * rows + r]; };
  const std::vector<double> sum = to_vector(add(a, b)), diff = to_vector(sub(b, a)),
                            prod = to_vector(mul(b, b));
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t at = (i * rows + r) * cols + c;
        const float x = static_cast<float>(av[at]), y = static_cast<float>(b_at(i, r, c));
        ASSERT_EQ(sum[at], x + y) << i << "," << r << "," << c;
        ASSERT_EQ(diff[at], y - x) << i << "," << r << "," << c;
        ASSERT_EQ(prod[at], y * y) << i << "," << r << "," << c;
      }
    }
  }
}

TEST(BinaryTest, SameShapeArithmetic) {
  Tensor a = fv({1, 2, 3, 4, -5, 6}, {2, 3});
  Tensor b = fv({0.5, -1, 4, 8, 2, -0.25}, {2, 3});
  EXPECT_EQ(to_vector(add(a, b)), (Values{1.5, 1, 7, 12, -3, 5.75}));
  EXPECT_EQ(to_vector(sub(a, b)), (Values{0.5, 3, -1, -4, -7, 6.25}));
  EXPECT_EQ(to_vector(mul(a, b)), (Values{0.5, -2, 12, 32, -10, -1.5}));
  EXPECT_EQ(to_vector(div(a, b)), (Values{2, -2, 0.75, 0.5, -2.5, -24}));
  EXPECT_EQ(to_vector(maximum(a, b)), (Values{1, 2, 4, 8, 2, 6}));
  EXPECT_EQ(add(a, b).shape(), (Shape{2, 3}));
  EXPECT_EQ(add(a, b).dtype(), kFloat32);
}

TEST(BinaryTest, BroadcastsLikeNumPy) {
  // (3, 1, 4) with (2, 4) -> (3, 2, 4): out[i][j][k] = a[i][0][k] + b[j][k].
  Tensor a = iota({3, 1, 4});
  Tensor b = mul(iota({2, 4}), 100.0);
  Tensor out = add(a, b);
  ASSERT_EQ(out.shape(), (Shape{3, 2, 4}));
  const Values v = to_vector(out);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(v[(i * 2 + j) * 4 + k], (i * 4 + k) + 100.0 * (j * 4 + k));
  // Commuted operands give the same shape and values (mul is commutative).
  EXPECT_EQ(to_vector(mul(b, a)), to_vector(mul(a, b)));
  // (3, 1) with (1, 4) -> (3, 4).
  EXPECT_EQ(to_vector(sub(iota({3, 1}), iota({1, 4}))),
            (Values{0, -1, -2, -3, 1, 0, -1, -2, 2, 1, 0, -1}));
  // Scalar-shaped () operand.
  Tensor s = scalar_tensor(10.0);
  EXPECT_EQ(to_vector(add(iota({2, 2}), s)), (Values{10, 11, 12, 13}));
  EXPECT_EQ(to_vector(sub(s, iota({3}))), (Values{10, 9, 8}));
  EXPECT_EQ(add(s, s).shape(), Shape{});
  EXPECT_EQ(add(s, s).item<float>(), 20.0f);
  // Size-0 broadcast.
  EXPECT_EQ(add(zeros({0, 3}), zeros({3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(add(zeros({2, 1}), zeros({0})).shape(), (Shape{2, 0}));
}

TEST(BinaryTest, BroadcastErrorMessage) {
  // Checked against tensor/shape.cc's broadcast_shapes: dims are counted in the broadcast
  // (right-aligned) shape.
  EXPECT_EQ(error_of([] {
              add(zeros({2, 3}), zeros({4}));
            }),
            "add: shapes (2, 3) and (4,) cannot be broadcast (3 != 4 at dim 1)");
  EXPECT_EQ(error_of([] {
              mul(zeros({5, 2, 3}), zeros({4, 3}));
            }),
            "mul: shapes (5, 2, 3) and (4, 3) cannot be broadcast (2 != 4 at dim 1)");
  EXPECT_EQ(error_of([] {
              sub(zeros({2}), zeros({3, 3}));
            }),
            "sub: shapes (2,) and (3, 3) cannot be broadcast (2 != 3 at dim 1)");
  EXPECT_EQ(error_of([] { maximum(zeros({0}), zeros({2})); }),
            "maximum: shapes (0,) and (2,) cannot be broadcast (0 != 2 at dim 0)");
}

TEST(BinaryTest, NonContiguousOperands) {
  Tensor base = iota({4, 6});
  Tensor t = transpose(narrow(base, 1, 0, 4), 0, 1);  // (4, 4), strides (1, 6)
  Tensor s = slice(iota({4, 8}), 1, 0, 8, 2);         // (4, 4), strides (8, 2)
  const Tensor tc = contiguous(t), sc = contiguous(s);
  EXPECT_EQ(to_vector(add(t, s)), to_vector(add(tc, sc)));
  EXPECT_EQ(to_vector(mul(t, s)), to_vector(mul(tc, sc)));
  EXPECT_EQ(to_vector(sub(s, t)), to_vector(sub(sc, tc)));
  // Spot values: t[1][2] = base[2][1] = 13, s[1][2] = 8 + 4 = 12.
  EXPECT_EQ(to_vector(add(t, s))[1 * 4 + 2], 25.0);
  // Expanded (stride-0) operand with a transposed one.
  Tensor e = expand(fv({1, 2, 3, 4}, {1, 4}), {4, 4});
  EXPECT_EQ(to_vector(mul(t, e)), to_vector(mul(tc, contiguous(e))));
  // Output is always a fresh contiguous tensor.
  Tensor out = add(t, s);
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_NE(out.storage(), base.storage());
}

TEST(BinaryTest, DTypePromotion) {
  Tensor i32 = fv({1, 2, 3}, {3}, kInt32);
  Tensor i64 = from_vector_i64(std::vector<int64_t>{10, 20, (int64_t{1} << 40)}, {3});
  Tensor f32 = fv({0.5, 0.25, 0.125}, {3});
  Tensor bf = fv({1, 2, 4}, {3}, kBFloat16);
  Tensor f16 = fv({8, 16, 32}, {3}, kFloat16);

  Tensor a = add(i32, i64);
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_EQ(a.data<int64_t>()[2], (int64_t{1} << 40) + 3);  // exact in i64
  EXPECT_EQ(add(i32, i32).dtype(), kInt32);
  EXPECT_EQ(to_vector(mul(i32, i32)), (Values{1, 4, 9}));

  Tensor b = add(f32, bf);
  EXPECT_EQ(b.dtype(), kFloat32);
  EXPECT_EQ(to_vector(b), (Values{1.5, 2.25, 4.125}));
  EXPECT_EQ(add(bf, f32).dtype(), kFloat32);
  EXPECT_EQ(add(bf, f16).dtype(), kFloat32);
  EXPECT_EQ(add(bf, bf).dtype(), kBFloat16);
  EXPECT_EQ(add(f16, f16).dtype(), kFloat16);

  Tensor c = mul(i64, f32);
  EXPECT_EQ(c.dtype(), kFloat32);
  EXPECT_EQ(to_vector(narrow(c, 0, 0, 2)), (Values{5, 5}));
  EXPECT_EQ(to_vector(c)[2], std::ldexp(1.0, 37));
  EXPECT_EQ(mul(i32, bf).dtype(), kBFloat16);
  EXPECT_EQ(to_vector(mul(i32, bf)), (Values{1, 4, 12}));
  EXPECT_EQ(add(i64, f16).dtype(), kFloat16);

  // div needs a floating result dtype.
  EXPECT_EQ(div(i32, f32).dtype(), kFloat32);
  EXPECT_EQ(to_vector(div(i32, f32)), (Values{2, 8, 24}));
  EXPECT_EQ(error_of([&] { div(i32, i64); }), "div: expected floating tensors, got i32 and i64");
}

TEST(BinaryTest, LowPrecisionResultsRoundOnce) {
  // bf16 + bf16 computes in f32 and rounds the sum: 1 + 2^-8 is a bf16 tie -> 1 (even);
  // 1 + 3 * 2^-8 -> 1 + 2^-6 ... check against float_to_bf16 of the exact f32 sum.
  Tensor a = fv({1, 1, 256}, {3}, kBFloat16);
  Tensor b = fv({0.00390625f, 0.01171875f, 1}, {3}, kBFloat16);  // 2^-8, 3*2^-8, 1
  EXPECT_EQ(to_vector(add(a, b)), (Values{1, 1.015625, 256}));
  // f16: 2048 + 1 is a tie -> 2048; 2048 + 3 -> 2052.
  Tensor h = add(fv({2048, 2048}, {2}, kFloat16), fv({1, 3}, {2}, kFloat16));
  EXPECT_EQ(to_vector(h), (Values{2048, 2052}));
}

TEST(ScalarTest, ScalarForms) {
  Tensor x = fv({1, -2, 4}, {3});
  EXPECT_EQ(to_vector(add(x, 0.5)), (Values{1.5, -1.5, 4.5}));
  EXPECT_EQ(to_vector(sub(x, 0.5)), (Values{0.5, -2.5, 3.5}));
  EXPECT_EQ(to_vector(rsub(x, 0.5)), (Values{-0.5, 2.5, -3.5}));
  EXPECT_EQ(to_vector(mul(x, -2.0)), (Values{-2, 4, -8}));
  EXPECT_EQ(to_vector(div(x, 4.0)), (Values{0.25, -0.5, 1}));
  // The result keeps a floating dtype; integer tensors become f32.
  EXPECT_EQ(add(fv({1}, {1}, kBFloat16), 1.0).dtype(), kBFloat16);
  EXPECT_EQ(add(fv({1}, {1}, kFloat16), 1.0).dtype(), kFloat16);
  Tensor i = add(fv({1, 2}, {2}, kInt64), 0.5);
  EXPECT_EQ(i.dtype(), kFloat32);
  EXPECT_EQ(to_vector(i), (Values{1.5, 2.5}));
  EXPECT_EQ(to_vector(div(fv({3}, {1}, kInt32), 2.0)), Values{1.5});
  // Non-contiguous input.
  EXPECT_EQ(to_vector(mul(transpose(iota({2, 2}), 0, 1), 3.0)), (Values{0, 6, 3, 9}));
}

// ---- unary math ----

struct UnaryCase {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*reference)(double);
  std::vector<float> inputs;
};

double gelu_ref(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

TEST(UnaryTest, MatchesStdMathInDouble) {
  const std::vector<float> general = {-3.5f, -1.0f, -0.25f, 0.0f, 0.125f, 0.7f, 1.0f, 2.5f, 10.0f};
  const std::vector<float> positive = {1e-6f, 0.01f, 0.5f, 1.0f, 2.0f, 3.14159f, 100.0f, 1e6f};
  const std::vector<UnaryCase> cases = {
      {"neg", &neg, [](double x) { return -x; }, general},
      {"abs", &abs, [](double x) { return std::abs(x); }, general},
      {"exp", &exp, [](double x) { return std::exp(x); }, general},
      {"log", &log, [](double x) { return std::log(x); }, positive},
      {"tanh", &tanh, [](double x) { return std::tanh(x); }, general},
      {"sigmoid", &sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, general},
      {"silu", &silu, [](double x) { return x / (1.0 + std::exp(-x)); }, general},
      {"sqrt", &sqrt, [](double x) { return std::sqrt(x); }, positive},
      {"rsqrt", &rsqrt, [](double x) { return 1.0 / std::sqrt(x); }, positive},
      {"relu", &relu, [](double x) { return x > 0 ? x : 0.0; }, general},
      {"gelu", &gelu, &gelu_ref, general},
  };
  for (const UnaryCase& c : cases) {
    Values want;
    for (float x : c.inputs) want.push_back(c.reference(x));
    const Shape shape{static_cast<int64_t>(c.inputs.size())};
    // f32: the C library's float functions are within a few ulp of the double result; gelu
    // composes ~6 roundings and cancels in 1 + tanh (see the top of the file).
    const bool is_gelu = std::string(c.name) == "gelu";
    const double rel = is_gelu ? 32 * kF32Ulp : 4 * kF32Ulp;
    const double abs_tol = is_gelu ? 1e-5 : 0.0;
    expect_close({.actual = c.op(fv(c.inputs, shape)),
                  .expected = want,
                  .tol = {.rtol = rel, .atol = abs_tol, .equal_nan = true},
                  .what = c.name});
    // bf16 / f16: the input is rounded first, so compare with the reference at the rounded
    // input, allowing one output rounding (2^-8, 2^-11 relative) on top.
    for (DType dtype : {kBFloat16, kFloat16}) {
      const Tensor x = fv(c.inputs, shape, dtype);
      Values want_rounded;
      for (double xr : to_vector(x)) want_rounded.push_back(c.reference(xr));
      const double out_ulp = dtype == kBFloat16 ? 0x1.0p-8 : 0x1.0p-11;
      const Tensor got = c.op(x);
      EXPECT_EQ(got.dtype(), dtype);
      expect_close({.actual = got,
                    .expected = want_rounded,
                    .tol = {.rtol = out_ulp + rel, .atol = abs_tol, .equal_nan = true},
                    .what = c.name});
    }
  }
}

TEST(UnaryTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = fv({0.0f, -0.0f, inf, -inf, nan}, {5});
  expect_close({.actual = exp(x),
                .expected = {1, 1, INFINITY, 0, NAN},
                .tol = {.equal_nan = true},
                .what = "exp"});
  expect_close({.actual = log(fv({0.0f, -1.0f, inf}, {3})),
                .expected = {-INFINITY, NAN, INFINITY},
                .tol = {.equal_nan = true},
                .what = "log"});
  expect_close({.actual = sqrt(fv({0.0f, -1.0f, inf}, {3})),
                .expected = {0, NAN, INFINITY},
                .tol = {.equal_nan = true},
                .what = "sqrt"});
  expect_close({.actual = rsqrt(fv({0.0f, inf}, {2})),
                .expected = {INFINITY, 0},
                .tol = {.equal_nan = true},
                .what = "rsqrt"});
  expect_close({.actual = tanh(fv({inf, -inf, 30.0f}, {3})),
                .expected = {1, -1, 1},
                .tol = {.equal_nan = true},
                .what = "tanh"});
  // relu propagates NaN like torch.relu (and like maximum / max in this layer): a NaN
  // activation must not be silently turned into 0.
  expect_close({.actual = relu(fv({-inf, inf, nan, -0.0f}, {4})),
                .expected = {0, INFINITY, NAN, 0},
                .tol = {.equal_nan = true},
                .what = "relu"});
  expect_close({.actual = abs(fv({-inf, -0.0f, nan}, {3})),
                .expected = {INFINITY, 0, NAN},
                .tol = {.equal_nan = true},
                .what = "abs"});
  expect_close({.actual = neg(fv({inf, nan}, {2})),
                .expected = {-INFINITY, NAN},
                .tol = {.equal_nan = true},
                .what = "neg"});
  expect_close({.actual = gelu(fv({inf, nan}, {2})),
                .expected = {INFINITY, NAN},
                .tol = {.equal_nan = true},
                .what = "gelu"});
}

TEST(UnaryTest, IntegerSupport) {
  // neg/abs work on integer dtypes and keep them; the transcendental ops reject them.
  Tensor i = from_vector_i64(std::vector<int64_t>{-3, 0, (int64_t{1} << 60)}, {3});
  Tensor n = neg(i);
  EXPECT_EQ(n.dtype(), kInt64);
  EXPECT_EQ(n.data<int64_t>()[2], -(int64_t{1} << 60));
  EXPECT_EQ(abs(i).data<int64_t>()[0], 3);
  EXPECT_EQ(to_vector(abs(fv({-7, 7}, {2}, kInt32))), (Values{7, 7}));
  EXPECT_EQ(error_of([&] { exp(i); }), "exp: expected a floating dtype (f32, bf16, f16), got i64");
  EXPECT_EQ(error_of([] { relu(zeros({2}, kInt32)); }),
            "relu: expected a floating dtype (f32, bf16, f16), got i32");
}

TEST(UnaryTest, Pow) {
  Tensor x = fv({0.5f, 1.0f, 2.0f, 3.0f, -2.0f}, {5});
  EXPECT_EQ(to_vector(pow(x, 2.0)), (Values{0.25, 1, 4, 9, 4}));
  EXPECT_EQ(to_vector(pow(x, 1.0)), to_vector(x));
  EXPECT_EQ(to_vector(pow(x, 0.0)), (Values{1, 1, 1, 1, 1}));
  const Tensor p = pow(narrow(x, 0, 0, 4), 0.5);
  expect_close({.actual = p,
                .expected = {std::sqrt(0.5), 1, std::sqrt(2.0), std::sqrt(3.0)},
                .tol = {.rtol = 4 * kF32Ulp},
                .what = "pow 0.5"});
  expect_close({.actual = pow(narrow(x, 0, 0, 4), -1.5),
                .expected = {std::pow(0.5, -1.5), 1, std::pow(2.0, -1.5), std::pow(3.0, -1.5)},
                .tol = {.rtol = 4 * kF32Ulp},
                .what = "pow -1.5"});
  expect_close({.actual = pow(x, 3.0),
                .expected = {0.125, 1, 8, 27, -8},
                .tol = {.rtol = 4 * kF32Ulp},
                .what = "pow 3"});
  EXPECT_TRUE(std::isnan(to_vector(pow(fv({-2.0f}, {1}), 0.5))[0]));
}

TEST(UnaryTest, NonContiguousInput) {
  Tensor t = transpose(fv({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1);  // 1 4 / 2 5 / 3 6
  expect_close({.actual = exp(t),
                .expected = {std::exp(1.0), std::exp(4.0), std::exp(2.0), std::exp(5.0),
                             std::exp(3.0), std::exp(6.0)},
                .tol = {.rtol = 4 * kF32Ulp},
                .what = "exp transposed"});
  EXPECT_EQ(to_vector(neg(t)), (Values{-1, -4, -2, -5, -3, -6}));
  EXPECT_EQ(to_vector(relu(sub(t, 3.0))), (Values{0, 1, 0, 2, 0, 3}));
  EXPECT_EQ(exp(t).shape(), (Shape{3, 2}));
  EXPECT_TRUE(exp(t).is_contiguous());
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  // Central differences of the double-precision gelu with h = 1e-4 have truncation error
  // ~h^2 * |gelu'''| / 6 < 1e-8; the f32 kernel's own error is a few ulp of values <= ~1.1.
  // So |kernel - fd| <= 1e-5 absolute is a safe bound (observed ~1e-7).
  std::vector<float> xs;
  for (float x = -5.0f; x <= 5.0f; x += 0.37f) xs.push_back(x);
  xs.push_back(0.0f);
  const Shape shape{static_cast<int64_t>(xs.size())};
  std::vector<float> grads(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) grads[i] = 0.5f + 0.25f * static_cast<float>(i % 5);
  const double h = 1e-4;
  Values want;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double fd = (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h);
    want.push_back(grads[i] * fd);
  }
  expect_close({.actual = gelu_backward(fv(grads, shape), fv(xs, shape)),
                .expected = want,
                .tol = {.atol = 1e-5},
                .what = "gelu_backward against central differences"});
  // Broadcasting grad, and the classic values: gelu'(0) = 0.5.
  Tensor g = gelu_backward(scalar_tensor(2.0), fv({0.0f}, {1}));
  EXPECT_EQ(g.shape(), Shape{1});
  EXPECT_NEAR(g.item<float>(), 1.0, 1e-7);
  EXPECT_EQ(error_of([] { gelu_backward(zeros({2}, kInt32), zeros({2}, kInt32)); }),
            "gelu_backward: expected floating tensors, got i32 and i32");
}

TEST(GeluTest, KnownValues) {
  // gelu(1) with the tanh approximation = 0.841191990..., gelu(-1) = -0.158808009...
  expect_close({.actual = gelu(fv({1.0f, -1.0f, 0.0f}, {3})),
                .expected = {gelu_ref(1.0), gelu_ref(-1.0), 0},
                .tol = {.rtol = 32 * kF32Ulp, .atol = 1e-6},
                .what = "gelu"});
  EXPECT_NEAR(gelu_ref(1.0), 0.8411919906, 1e-9);
}

// silu's derivative is exact in closed form: s (1 + x (1 - s)). The f32 kernel's error is a few
// ulp of values below ~1.1 in magnitude (times the gradient), so 1e-6 absolute holds with room;
// far out it saturates without overflow (x = +-100: exp never overflows in the sigmoid's form).
TEST(SiluTest, BackwardIsTheExactDerivative) {
  std::vector<float> xs;
  for (float x = -8.0f; x <= 8.0f; x += 0.41f) xs.push_back(x);
  for (const float x : {0.0f, 100.0f, -100.0f}) xs.push_back(x);
  const Shape shape{static_cast<int64_t>(xs.size())};
  std::vector<float> grads(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) grads[i] = 0.5f - 0.25f * static_cast<float>(i % 5);
  Values want;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i], s = 1.0 / (1.0 + std::exp(-x));
    want.push_back(grads[i] * s * (1.0 + x * (1.0 - s)));
  }
  expect_close({.actual = silu_backward(fv(grads, shape), fv(xs, shape)),
                .expected = want,
                .tol = {.atol = 1e-6},
                .what = "silu_backward against the closed form"});
  // bf16 computes in f32 and rounds once: within bf16's half ulp of the f32 result.
  const Tensor g16 = to(fv(grads, shape), kBFloat16), x16 = to(fv(xs, shape), kBFloat16);
  const Tensor f32_of_bf16 = silu_backward(to(g16, kFloat32), to(x16, kFloat32));
  const Tensor got = silu_backward(g16, x16);
  EXPECT_EQ(got.dtype(), kBFloat16);
  expect_close({.actual = to(got, kFloat32),
                .expected = to_vector(to(to(f32_of_bf16, kBFloat16), kFloat32)),
                .tol = {.atol = 0},
                .what = "bf16 silu_backward: the f32 result rounded once"});
  // Broadcasting grad: silu'(0) = 0.5.
  EXPECT_NEAR(silu_backward(scalar_tensor(2.0), fv({0.0f}, {1})).item<float>(), 1.0, 1e-7);
  EXPECT_EQ(error_of([] { silu_backward(zeros({2}, kInt32), zeros({2}, kInt32)); }),
            "silu_backward: expected floating tensors, got i32 and i32");
}

// silu_mul against the double-precision product and its closed-form gradients, broadcasting `up`
// over the rows; in f32 the composed ops' values bit for bit; bf16 rounds once (the f32 result
// rounded).
TEST(SiluMulTest, ForwardAndBackwardAgainstTheClosedForm) {
  const Tensor gate = ops::mul(iota({4, 5}), 0.37);
  const Tensor gate_c = ops::sub(gate, 3.5);
  const Tensor up = fv({0.5f, -1.25f, 2.0f, 0.0f, -3.0f}, {5});
  const Tensor grad = ops::sub(ops::mul(iota({4, 5}), 0.11), 1.0);
  const auto xs = to_vector(gate_c), us = to_vector(up), gs = to_vector(grad);
  Values want, want_gate, want_up(5, 0.0);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i], u = us[i % 5], g = gs[i], s = 1.0 / (1.0 + std::exp(-x));
    want.push_back(x * s * u);
    want_gate.push_back(g * u * s * (1.0 + x * (1.0 - s)));
    want_up[i % 5] += g * x * s;
  }
  expect_close({.actual = silu_mul(gate_c, up),
                .expected = want,
                .tol = {.atol = 1e-6},
                .what = "silu_mul"});
  const ops::SiluMulGrads d = silu_mul_backward(grad, gate_c, up);
  EXPECT_EQ(d.grad_up.shape(), (Shape{4, 5}));  // the broadcast shape: the formula sums it
  expect_close({.actual = d.grad_gate,
                .expected = want_gate,
                .tol = {.atol = 1e-6},
                .what = "silu_mul_backward's gate gradient"});
  expect_close({.actual = sum_to(d.grad_up, {5}),
                .expected = want_up,
                .tol = {.atol = 1e-5},
                .what = "silu_mul_backward's up gradient, summed over the rows"});
  // The composed ops' values bit for bit in f32 (each operation rounded as they round it), so a
  // model moving to the fused ops trains exactly as before on the CPU.
  const Tensor s = sigmoid(gate_c);
  const Tensor upx = expand(up, {4, 5});
  expect_bitwise_equal({.actual = silu_mul(gate_c, up), .expected = mul(silu(gate_c), up)});
  expect_bitwise_equal(
      {.actual = d.grad_gate,
       .expected = mul(mul(grad, upx), mul(s, add(mul(gate_c, rsub(s, 1.0)), 1.0)))});
  expect_bitwise_equal({.actual = d.grad_up, .expected = mul(grad, silu(gate_c))});
  expect_bitwise_equal({.actual = silu_backward(grad, gate_c),
                        .expected = mul(grad, mul(s, add(mul(gate_c, rsub(s, 1.0)), 1.0)))});
  // bf16: the f32 computation of the bf16 inputs, rounded once.
  const Tensor g16 = to(gate_c, kBFloat16), u16 = to(up, kBFloat16);
  const Tensor got = silu_mul(g16, u16);
  EXPECT_EQ(got.dtype(), kBFloat16);
  expect_close({.actual = to(got, kFloat32),
                .expected = to_vector(
                    to(to(silu_mul(to(g16, kFloat32), to(u16, kFloat32)), kBFloat16), kFloat32)),
                .tol = {.atol = 0},
                .what = "bf16 silu_mul: the f32 result rounded once"});
  EXPECT_EQ(error_of([] { silu_mul(zeros({2}, kInt32), zeros({2}, kInt32)); }),
            "silu_mul: expected floating tensors, got i32 and i32");
  EXPECT_EQ(error_of([] {
              silu_mul_backward(zeros({2}, kInt32), zeros({2}, kInt32), zeros({2}, kInt32));
            }),
            "silu_mul_backward: expected floating tensors, got i32, i32 and i32");
  EXPECT_NE(error_of([] {
              silu_mul(zeros({2, 3}), zeros({2}));
            }).find("silu_mul"),
            std::string::npos);
}

// ---- selection and comparison ----

TEST(WhereTest, SelectsAndBroadcasts) {
  Tensor cond = fv({1, 0, 2, 0}, {4}, kInt64);
  Tensor a = fv({1, 2, 3, 4}, {4});
  Tensor b = fv({-1, -2, -3, -4}, {4});
  EXPECT_EQ(to_vector(where(cond, a, b)), (Values{1, -2, 3, -4}));
  // cond (2, 1), a (), b (1, 3) -> (2, 3).
  Tensor w = where(fv({0, 1}, {2, 1}), scalar_tensor(7), fv({1, 2, 3}, {1, 3}));
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  EXPECT_EQ(to_vector(w), (Values{1, 2, 3, 7, 7, 7}));
  // NaN and inf pass through untouched (selection, not arithmetic).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Values nv = to_vector(where(fv({1, 0}, {2}), fv({nan, nan}, {2}), fv({inf, inf}, {2})));
  EXPECT_TRUE(std::isnan(nv[0]));
  EXPECT_EQ(nv[1], INFINITY);
  // Promotion between a and b; non-contiguous cond.
  Tensor p = where(transpose(fv({1, 0, 0, 1}, {2, 2}), 0, 1), fv({1, 1, 1, 1}, {2, 2}, kInt32),
                   fv({0.5, 0.5, 0.5, 0.5}, {2, 2}, kBFloat16));
  EXPECT_EQ(p.dtype(), kBFloat16);
  EXPECT_EQ(to_vector(p), (Values{1, 0.5, 0.5, 1}));
  EXPECT_EQ(error_of([] { where(zeros({3}), zeros({2}), zeros({2})); }),
            "where: shapes (3,) and (2,) cannot be broadcast (3 != 2 at dim 0)");
}

TEST(MaskedFillTest, FillsWhereMaskIsSet) {
  Tensor x = iota({2, 3});
  Tensor mask = fv({1, 0, 1}, {3}, kInt64);
  Tensor y = masked_fill(x, mask, -1e9);
  EXPECT_EQ(y.dtype(), kFloat32);
  EXPECT_EQ(to_vector(y), (Values{-1e9f, 1, -1e9f, -1e9f, 4, -1e9f}));
  EXPECT_EQ(to_vector(x), (Values{0, 1, 2, 3, 4, 5}));  // not in place
  // Causal mask on a bf16 tensor, with -inf.
  Tensor scores = zeros({2, 2}, kBFloat16);
  Tensor causal = fv({0, 1, 0, 0}, {2, 2});
  Tensor m = masked_fill(scores, causal, -INFINITY);
  EXPECT_EQ(m.dtype(), kBFloat16);
  EXPECT_EQ(to_vector(m), (Values{0, -INFINITY, 0, 0}));
  EXPECT_EQ(error_of([&] {
              masked_fill(zeros({3}), zeros({2, 3}), 0);
            }),
            "masked_fill: mask of shape (2, 3) does not broadcast to self's shape (3,)");
}

TEST(CompareTest, EqAndGt) {
  Tensor a = fv({1, 2, 3, 4}, {4});
  Tensor b = fv({1, 3, 3, 0}, {4});
  EXPECT_EQ(to_vector(eq(a, b)), (Values{1, 0, 1, 0}));
  EXPECT_EQ(to_vector(gt(a, b)), (Values{0, 0, 0, 1}));
  EXPECT_EQ(eq(a, b).dtype(), kFloat32);
  // Broadcasting and promotion: i64 (2, 1) against f32 (3,).
  Tensor c = gt(fv({1, 5}, {2, 1}, kInt64), fv({0, 1, 6}, {3}));
  EXPECT_EQ(c.dtype(), kFloat32);
  EXPECT_EQ(to_vector(c), (Values{1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(eq(fv({1}, {1}, kInt32), fv({1}, {1}, kInt32)).dtype(), kInt32);
  // NaN compares unequal and not greater.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(to_vector(eq(fv({nan}, {1}), fv({nan}, {1}))), Values{0});
  EXPECT_EQ(to_vector(gt(fv({nan}, {1}), fv({0}, {1}))), Values{0});
}

TEST(MaximumTest, BroadcastAndNaN) {
  EXPECT_EQ(to_vector(maximum(fv({1, 5, -3}, {3}), scalar_tensor(2))), (Values{2, 5, 2}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // NaN propagates from either side (torch.maximum).
  const Values v = to_vector(maximum(fv({nan, 1}, {2}), fv({1, nan}, {2})));
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_TRUE(std::isnan(v[1]));
  Tensor i = maximum(fv({1, 9}, {2}, kInt32), fv({4, 4}, {2}, kInt64));
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(to_vector(i), (Values{4, 9}));
}

TEST(AddInPlaceTest, AccumulatesWithBroadcasting) {
  Tensor acc = zeros({2, 3});
  const auto* storage = acc.storage().get();
  add_(acc, iota({2, 3}));
  add_(acc, fv({10, 20, 30}, {3}));
  add_(acc, scalar_tensor(0.5));
  EXPECT_EQ(acc.storage().get(), storage);  // in place
  EXPECT_EQ(to_vector(acc), (Values{10.5, 21.5, 32.5, 13.5, 24.5, 35.5}));
  // Into a non-contiguous view: only the viewed elements change.
  Tensor base = zeros({2, 4});
  add_(slice(base, 1, 1, 4, 2), ones({2, 2}));
  EXPECT_EQ(to_vector(base), (Values{0, 1, 0, 1, 0, 1, 0, 1}));
  // bf16 accumulator keeps its dtype.
  Tensor b = zeros({2}, kBFloat16);
  add_(b, fv({1, 2}, {2}));
  EXPECT_EQ(b.dtype(), kBFloat16);
  EXPECT_EQ(to_vector(b), (Values{1, 2}));
  // Large same-shape f32 operands take the vectorized kernel: add's values, into self's storage.
  const Tensor x = uniform({3, 70001}, 7, -1.0, 1.0), y = uniform({3, 70001}, 8, -1.0, 1.0);
  Tensor big = clone(x);
  const auto* big_storage = big.storage().get();
  add_(big, y);
  EXPECT_EQ(big.storage().get(), big_storage);
  EXPECT_EQ(to_vector(big), to_vector(add(x, y)));
}

TEST(MulInPlaceTest, ScalesEveryLayoutAsMulDoes) {
  const Tensor x = uniform({3, 70001}, 9, -1.0, 1.0);
  Tensor a = clone(x);
  const auto* storage = a.storage().get();
  mul_(a, 0.3);
  EXPECT_EQ(a.storage().get(), storage);
  EXPECT_EQ(to_vector(a), to_vector(mul(x, 0.3)));
  // A strided view: only its elements change.
  Tensor base = ones({2, 4});
  mul_(slice(base, 1, 1, 4, 2), 3.0);
  EXPECT_EQ(to_vector(base), (Values{1, 3, 1, 3, 1, 3, 1, 3}));
  // bf16 keeps its dtype.
  Tensor b = fv({1, 2}, {2});
  b = to(b, kBFloat16);
  mul_(b, 2.0);
  EXPECT_EQ(b.dtype(), kBFloat16);
  EXPECT_EQ(to_vector(b), (Values{2, 4}));
}

}  // namespace
}  // namespace loom::ops
