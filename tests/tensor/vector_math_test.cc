// The vectorized CPU kernels (tensor/cpu/vector_math.h) against their definitions in double:
// GELU (tanh approximation) and its derivative over the whole float range that matters, the
// fused AdamW update against torch.optim.AdamW's formula, and bit-identical results whatever
// the thread count (chunks split differently, values must not).
#include "tensor/cpu/vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tensor/cpu/gemm.h"

namespace loom::cpu {
namespace {

// 0.5 (1 + tanh(u)) written as sigmoid(2u), its identity: in double too, 1 + tanh(u) cancels to
// 0 for u < -19, where the true value (and the kernel's) is still ~1e-37.
double gate_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 1.0 / (1.0 + std::exp(-2.0 * u));
}

double gelu_ref(double x) { return x * gate_ref(x); }

double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double s = gate_ref(x);
  return s + 2.0 * x * s * (1.0 - s) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// Values from -12 to 12 densely, the extremes, zero and denormals.
std::vector<float> inputs() {
  std::vector<float> x;
  for (int i = -120000; i <= 120000; ++i) x.push_back(static_cast<float>(i) * 1e-4f);
  for (float v : {-1e4f, -100.0f, -30.0f, 30.0f, 100.0f, 1e4f, 0.0f, -0.0f, 1e-30f, -1e-30f,
                  std::numeric_limits<float>::denorm_min()})
    x.push_back(v);
  return x;
}

// The exponent 2u(x) the gate takes: computing it in f32 rounds it by ~|2u| 2^-24 absolutely,
// which exp turns into that much relative error of the result (the conditioning of e^z is |z|):
// an error of the f32 computation itself, not of the kernel. The bound is 4 ulp plus that.
double exponent(double x) {
  return 2.0 * std::sqrt(2.0 / M_PI) * std::abs(x + 0.044715 * x * x * x);
}

double f32_bound(double want, double x) {
  return std::numeric_limits<float>::epsilon() * std::abs(want) * (4.0 + 2.0 * exponent(x)) +
         1e-37;  // values that underflow to zero
}

void expect_close_f32(float got, double want, float x, const char* what) {
  ASSERT_LE(std::abs(got - want), f32_bound(want, x))
      << what << " at x = " << x << ": " << got << " vs " << want;
}

TEST(VectorMathTest, GeluMatchesTheDefinition) {
  const std::vector<float> x = inputs();
  std::vector<float> y(x.size());
  gelu_f32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) expect_close_f32(y[i], gelu_ref(x[i]), x[i], "gelu");
}

TEST(VectorMathTest, GeluBackwardMatchesTheDerivative) {
  const std::vector<float> x = inputs();
  std::vector<float> g(x.size(), 1.5f), out(x.size());
  gelu_backward_f32(g.data(), x.data(), out.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    // The derivative crosses zero near x = -0.75: there an absolute bound (f32 rounding of its
    // two terms, ~1.5 * 2^-24 each) is the meaningful one.
    const double want = 1.5 * gelu_grad_ref(x[i]);
    const double tol = 2 * f32_bound(std::abs(want) + 0.1, x[i]);
    ASSERT_LE(std::abs(out[i] - want), tol) << "gelu_backward at x = " << x[i];
  }
}

TEST(VectorMathTest, NanPropagates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float y = 0, g = 1, dx = 0;
  gelu_f32(&nan, &y, 1);
  gelu_backward_f32(&g, &nan, &dx, 1);
  EXPECT_TRUE(std::isnan(y));
  EXPECT_TRUE(std::isnan(dx));
}

TEST(VectorMathTest, AdamWMatchesTorchsFormula) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 100003;  // odd: a scalar tail too
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    g[i] = normal(rng) * 1e-2f;
    m[i] = normal(rng) * 1e-3f;
    v[i] = std::abs(normal(rng)) * 1e-5f;
  }
  const AdamWStep s{.lr = 3e-3f,
                    .beta1 = 0.9f,
                    .beta2 = 0.95f,
                    .eps = 1e-8f,
                    .weight_decay = 0.1f,
                    .bias1 = 1 - 0.9f * 0.9f * 0.9f,
                    .bias2 = 1 - 0.95f * 0.95f * 0.95f};
  std::vector<float> p2 = p, m2 = m, v2 = v;
  adamw_f32(p2.data(), g.data(), m2.data(), v2.data(), n, s);
  // The reference in double from the same f32 constants; each result within a few f32
  // roundings of the terms it sums (the moments' two terms can cancel).
  const double eps = std::numeric_limits<float>::epsilon();
  const double b1 = s.beta1, c1 = 1.0f - s.beta1, b2 = s.beta2, c2 = 1.0f - s.beta2;
  const double decay = 1.0f - s.lr * s.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const double mi = b1 * m[i] + c1 * g[i];
    const double vi = b2 * v[i] + c2 * static_cast<double>(g[i]) * g[i];
    const double step = s.lr * (mi / s.bias1) / (std::sqrt(vi / s.bias2) + s.eps);
    const double want = p[i] * decay - step;
    ASSERT_LE(std::abs(m2[i] - mi), 4 * eps * (std::abs(b1 * m[i]) + std::abs(c1 * g[i]))) << i;
    ASSERT_LE(std::abs(v2[i] - vi), 4 * eps * std::abs(vi)) << i;
    // The step carries the moments' relative error (mi / sqrt(vi)) and its own roundings.
    const double step_error =
        std::abs(step) * (8 * eps + 4 * eps * (std::abs(b1 * m[i]) + std::abs(c1 * g[i])) /
                                        std::max(std::abs(mi), 1e-30));
    ASSERT_LE(std::abs(p2[i] - want), 4 * eps * std::abs(p[i]) + step_error) << i;
  }
}

TEST(VectorMathTest, FillWritesEveryElementOnAnyThreadCount) {
  for (int threads : {1, 3}) {
    set_gemm_threads(threads);
    std::vector<float> out(300007, 1.0f);
    fill_f32(out.data(), -2.5f, static_cast<int64_t>(out.size()));
    EXPECT_EQ(out, std::vector<float>(out.size(), -2.5f)) << threads << " threads";
  }
  set_gemm_threads(1);
}

TEST(VectorMathTest, ResultsDoNotDependOnTheThreadCount) {
  const std::vector<float> x = inputs();
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> one(x.size()), two(x.size()), g(x.size(), 0.5f), d1(x.size()), d2(x.size());
  set_gemm_threads(1);
  gelu_f32(x.data(), one.data(), n);
  gelu_backward_f32(g.data(), x.data(), d1.data(), n);
  set_gemm_threads(3);
  gelu_f32(x.data(), two.data(), n);
  gelu_backward_f32(g.data(), x.data(), d2.data(), n);
  set_gemm_threads(1);
  EXPECT_EQ(one, two);
  EXPECT_EQ(d1, d2);
}

}  // namespace
}  // namespace loom::cpu
