// Tests of the neural-network kernels (tensor/ops_nn.h): every forward and backward against a
// naive f64 reference written here, backward kernels also against central finite differences of
// the forward, plus non-contiguous and bf16 inputs, the call_op table, the dispatch hook and the
// error messages.
//
// Tolerances (each use repeats the reason briefly):
//   kF32Tol = 1e-5 (abs + rel): f32 kernels vs the f64 reference. The kernels compute in f32 with
//     f64 sums; a few f32 roundings of O(1) values stay well below 1e-5.
//   kBf16Tol = 1e-2 (abs + rel): bf16 inputs are exact in f32, the kernel computes in f32 and
//     rounds the result once to bf16 (relative step 2^-8 = 3.9e-3), so 1e-2 is ~2.5 ulps.
//   Finite differences: central, eps = 1e-3, on f32 forwards with the loss summed in f64;
//     tolerance 2e-3 * (1 + |g|): truncation error is O(eps^2) ~ 1e-6, but f32 rounding noise of
//     the outputs (~1e-7 each, summed over ~30 outputs) divided by 2 eps reaches a few 1e-4
//     (measured: all cases pass at 5e-4), so 2e-3 leaves a 4x margin while still catching any
//     wrong term (those are O(0.1..1); checked by mutating the kernels).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops_nn.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using ::testing::HasSubstr;
using Vec = std::vector<double>;
using testing::error_of;
using testing::expect_bitwise_equal;
using testing::expect_close;
using testing::Tolerance;

constexpr double kF32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;
constexpr double kFdEps = 1e-3;
constexpr double kFdTol = 2e-3;

Tensor randn(const Shape& shape, uint64_t seed, DType dtype = kFloat32) {
  return ops::to(ops::normal(shape, seed), dtype);
}

Vec vals(const Tensor& t) { return ops::to_vector(t); }

// |a - e| <= tol * (1 + |e|) elementwise (tol + tol * |e|); NaN only where NaN is expected.
Tolerance abs_and_rel(double tol) { return {.rtol = tol, .atol = tol, .equal_nan = true}; }

// ---- references (f64, naive loops over row-major values) ----

struct Rows {
  int64_t outer = 1, n = 1, inner = 1;
};
Rows rows_of(const Shape& shape, int64_t dim) {
  Rows r;
  for (int64_t d = 0; d < dim; ++d) r.outer *= shape[d];
  r.n = shape[dim];
  for (size_t d = dim + 1; d < shape.size(); ++d) r.inner *= shape[d];
  return r;
}

Vec ref_softmax(const Vec& x, const Shape& shape, int64_t dim, bool log) {
  const Rows r = rows_of(shape, dim);
  Vec out(x.size());
  for (int64_t o = 0; o < r.outer; ++o) {
    for (int64_t i = 0; i < r.inner; ++i) {
      auto at = [&](int64_t j) { return (o * r.n + j) * r.inner + i; };
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < r.n; ++j) m = std::max(m, x[at(j)]);
      for (int64_t j = 0; j < r.n; ++j) s += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < r.n; ++j) {
        out[at(j)] = log ? x[at(j)] - m - std::log(s) : std::exp(x[at(j)] - m) / s;
      }
    }
  }
  return out;
}

// Jacobian-vector form written from the definition: dx_j = sum_i g_i d y_i / d x_j.
Vec ref_softmax_backward(const Vec& g, const Vec& x, const Shape& shape, int64_t dim, bool log) {
  const Rows r = rows_of(shape, dim);
  const Vec p = ref_softmax(x, shape, dim, false);
  Vec dx(x.size());
  for (int64_t o = 0; o < r.outer; ++o) {
    for (int64_t i = 0; i < r.inner; ++i) {
      auto at = [&](int64_t j) { return (o * r.n + j) * r.inner + i; };
      for (int64_t j = 0; j < r.n; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < r.n; ++k) {
          // softmax: dy_k/dx_j = p_k (delta_kj - p_j); log_softmax: delta_kj - p_j.
          const double delta = k == j ? 1.0 : 0.0;
          acc += g[at(k)] * (log ? delta - p[at(j)] : p[at(k)] * (delta - p[at(j)]));
        }
        dx[at(j)] = acc;
      }
    }
  }
  return dx;
}

struct RefLayerNorm {
  Vec out, mean, rstd, dx, dw, db;
};
RefLayerNorm ref_layer_norm(const Vec& x, int64_t rows, int64_t n, const Vec* w, const Vec* b,
                            double eps, const Vec* g = nullptr) {
  RefLayerNorm r;
  r.out.resize(x.size());
  r.dx.resize(x.size());
  r.dw.assign(n, 0.0);
  r.db.assign(n, 0.0);
  for (int64_t row = 0; row < rows; ++row) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) mu += x[row * n + j];
    mu /= n;
    for (int64_t j = 0; j < n; ++j) var += (x[row * n + j] - mu) * (x[row * n + j] - mu);
    var /= n;
    const double rs = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
    Vec xhat(n), gw(n);
    for (int64_t j = 0; j < n; ++j) {
      xhat[j] = (x[row * n + j] - mu) * rs;
      r.out[row * n + j] = xhat[j] * (w ? (*w)[j] : 1.0) + (b ? (*b)[j] : 0.0);
    }
    if (!g) continue;
    double mean_gw = 0, mean_gwx = 0;
    for (int64_t j = 0; j < n; ++j) {
      gw[j] = (*g)[row * n + j] * (w ? (*w)[j] : 1.0);
      mean_gw += gw[j] / n;
      mean_gwx += gw[j] * xhat[j] / n;
      r.dw[j] += (*g)[row * n + j] * xhat[j];
      r.db[j] += (*g)[row * n + j];
    }
    for (int64_t j = 0; j < n; ++j) r.dx[row * n + j] = rs * (gw[j] - mean_gw - xhat[j] * mean_gwx);
  }
  return r;
}

struct RefCrossEntropy {
  Vec losses;  // per row, 0 where ignored
  double sum = 0;
  int64_t count = 0;
  Vec lse;
};
RefCrossEntropy ref_cross_entropy(const Vec& x, const std::vector<int64_t>& t, int64_t v,
                                  int64_t ignore) {
  RefCrossEntropy r;
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t row = 0; row < n; ++row) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, x[row * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[row * v + j] - m);
    const double lse = m + std::log(s);
    r.lse.push_back(lse);
    const double loss = t[row] == ignore ? 0.0 : lse - x[row * v + t[row]];
    r.losses.push_back(loss);
    if (t[row] != ignore) {
      r.sum += loss;
      ++r.count;
    }
  }
  return r;
}

// d loss / d logits for loss weights `row_scale` (already including the reduction's factor).
Vec ref_cross_entropy_backward(const Vec& x, const std::vector<int64_t>& t, int64_t v,
                               int64_t ignore, const Vec& row_scale) {
  Vec d(x.size(), 0.0);
  const Vec p = ref_softmax(x, {static_cast<int64_t>(t.size()), v}, 1, false);
  for (size_t row = 0; row < t.size(); ++row) {
    if (t[row] == ignore) continue;
    for (int64_t j = 0; j < v; ++j) {
      d[row * v + j] = (p[row * v + j] - (j == t[row] ? 1.0 : 0.0)) * row_scale[row];
    }
  }
  return d;
}

struct RefAttention {
  Vec out, lse, dq, dk, dv;
};
// q (rows, tq, d), k (rows, tk, d), v (rows, tk, dv), row-major; g is d out, optional.
RefAttention ref_attention(const Vec& q, const Vec& k, const Vec& v, int64_t rows, int64_t tq,
                           int64_t tk, int64_t d, int64_t dv, bool causal, double scale,
                           const Vec* g = nullptr) {
  RefAttention r;
  r.out.assign(rows * tq * dv, 0.0);
  r.dq.assign(rows * tq * d, 0.0);
  r.dk.assign(rows * tk * d, 0.0);
  r.dv.assign(rows * tk * dv, 0.0);
  for (int64_t b = 0; b < rows; ++b) {
    const double* Q = q.data() + b * tq * d;
    const double* K = k.data() + b * tk * d;
    const double* V = v.data() + b * tk * dv;
    for (int64_t i = 0; i < tq; ++i) {
      Vec p(tk, 0.0);
      double m = -INFINITY;
      for (int64_t j = 0; j < tk; ++j) {
        if (causal && j > i) continue;
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += Q[i * d + c] * K[j * d + c];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < tk; ++j) {
        p[j] = (causal && j > i) ? 0.0 : std::exp(p[j] - m);
        sum += p[j];
      }
      for (int64_t j = 0; j < tk; ++j) p[j] /= sum;
      r.lse.push_back(m + std::log(sum));
      for (int64_t j = 0; j < tk; ++j) {
        for (int64_t c = 0; c < dv; ++c) r.out[(b * tq + i) * dv + c] += p[j] * V[j * dv + c];
      }
      if (!g) continue;
      const double* G = g->data() + (b * tq + i) * dv;
      Vec dp(tk, 0.0);
      double dot = 0;
      for (int64_t j = 0; j < tk; ++j) {
        for (int64_t c = 0; c < dv; ++c) {
          dp[j] += G[c] * V[j * dv + c];
          r.dv[(b * tk + j) * dv + c] += p[j] * G[c];
        }
        dot += p[j] * dp[j];
      }
      for (int64_t j = 0; j < tk; ++j) {
        const double ds = p[j] * (dp[j] - dot) * scale;
        for (int64_t c = 0; c < d; ++c) {
          r.dq[(b * tq + i) * d + c] += ds * K[j * d + c];
          r.dk[(b * tk + j) * d + c] += ds * Q[i * d + c];
        }
      }
    }
  }
  return r;
}

// ---- finite differences ----

// Central differences of L(x) = sum_i f(x)_i * w_i (in f64) for every element of f32 `x`.
// The step actually taken is measured in f32, so rounding of x +- eps does not bias the quotient.
Vec numeric_grad(const Tensor& x, const std::function<Vec(const Tensor&)>& f, const Vec& w) {
  const Tensor base = ops::clone(x);
  Vec grad(base.numel());
  auto loss = [&](const Tensor& t) {
    const Vec y = f(t);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * w[i];
    return l;
  };
  for (int64_t i = 0; i < base.numel(); ++i) {
    Tensor plus = ops::clone(base), minus = ops::clone(base);
    const float x0 = base.data<float>()[i];
    plus.data<float>()[i] = static_cast<float>(x0 + kFdEps);
    minus.data<float>()[i] = static_cast<float>(x0 - kFdEps);
    const double step = static_cast<double>(plus.data<float>()[i]) - minus.data<float>()[i];
    grad[i] = (loss(plus) - loss(minus)) / step;
  }
  return grad;
}

// ================================ softmax ================================

struct SoftmaxCase {
  Shape shape;
  int64_t dim;
};

TEST(Softmax, ForwardAndBackwardMatchReference) {
  const std::vector<SoftmaxCase> cases = {
      {{3, 5}, 1}, {{3, 5}, 0}, {{2, 3, 7}, -1}, {{2, 3, 7}, 1}, {{7}, 0}};
  uint64_t seed = 1;
  for (const auto& c : cases) {
    for (bool log : {false, true}) {
      const std::string what = fmt::format("{} dim {} log {}", shape_str(c.shape), c.dim, log);
      const Tensor x = ops::mul(randn(c.shape, seed++), 3.0);
      const Tensor g = randn(c.shape, seed++);
      const int64_t dim = c.dim < 0 ? c.dim + static_cast<int64_t>(c.shape.size()) : c.dim;
      const Tensor y = log ? ops::log_softmax(x, c.dim) : ops::softmax(x, c.dim);
      EXPECT_EQ(y.shape(), c.shape);
      expect_close({.actual = y,
                    .expected = ref_softmax(vals(x), c.shape, dim, log),
                    .tol = abs_and_rel(kF32Tol),
                    .what = what});  // f32
      const Tensor dx =
          log ? ops::log_softmax_backward(g, y, c.dim) : ops::softmax_backward(g, y, c.dim);
      expect_close({.actual = dx,
                    .expected = ref_softmax_backward(vals(g), vals(x), c.shape, dim, log),
                    .tol = abs_and_rel(kF32Tol),
                    .what = what + " backward"});  // f32
    }
  }
}

TEST(Softmax, IsStableForLargeLogits) {
  const Tensor x = ops::from_vector({1000.f, 1001.f, 1002.f, -1000.f}, {1, 4});
  const Vec y = vals(ops::softmax(x, 1));
  const Vec ly = vals(ops::log_softmax(x, 1));
  // No inf/NaN: the max is subtracted before exp.
  for (double value : y) EXPECT_TRUE(std::isfinite(value));
  for (double value : ly) EXPECT_TRUE(std::isfinite(value));
  expect_close({.actual = y,
                .expected = ref_softmax(vals(x), {1, 4}, 1, false),
                .tol = abs_and_rel(kF32Tol),
                .what = "softmax"});  // f32
  // log_softmax = x - lse with |x| ~ 1e3: f32's ulp there is 6e-5, so 1e-4 (rel + abs).
  expect_close({.actual = ly,
                .expected = ref_softmax(vals(x), {1, 4}, 1, true),
                .tol = abs_and_rel(1e-4),
                .what = "log_softmax"});
}

TEST(Softmax, NonContiguousInput) {
  const Tensor base = randn({5, 3}, 11);
  const Tensor x = ops::transpose(base, 0, 1);  // (3, 5), strides (1, 3)
  ASSERT_FALSE(x.is_contiguous());
  const Tensor g = ops::transpose(randn({5, 3}, 12), 0, 1);
  for (bool log : {false, true}) {
    const Tensor y = log ? ops::log_softmax(x, 1) : ops::softmax(x, 1);
    expect_close({.actual = y,
                  .expected = ref_softmax(vals(x), {3, 5}, 1, log),
                  .tol = abs_and_rel(kF32Tol),
                  .what = "forward"});  // f32
    const Tensor yt =
        ops::transpose(ops::contiguous(ops::transpose(y, 0, 1)), 0, 1);  // strided out
    const Tensor dx = log ? ops::log_softmax_backward(g, yt, 1) : ops::softmax_backward(g, yt, 1);
    expect_close({.actual = dx,
                  .expected = ref_softmax_backward(vals(g), vals(x), {3, 5}, 1, log),
                  .tol = abs_and_rel(kF32Tol),
                  .what = "backward"});  // f32
  }
}

TEST(Softmax, Bf16) {
  const Tensor x = randn({2, 3, 7}, 21, kBFloat16);
  const Tensor g = randn({2, 3, 7}, 22, kBFloat16);
  for (bool log : {false, true}) {
    const Tensor y = log ? ops::log_softmax(x, 2) : ops::softmax(x, 2);
    EXPECT_EQ(y.dtype(), kBFloat16);
    // bf16: one rounding of the f32 result, tolerance kBf16Tol.
    expect_close({.actual = y,
                  .expected = ref_softmax(vals(x), {2, 3, 7}, 2, log),
                  .tol = abs_and_rel(kBf16Tol),
                  .what = "forward"});
    const Tensor dx = log ? ops::log_softmax_backward(g, y, 2) : ops::softmax_backward(g, y, 2);
    EXPECT_EQ(dx.dtype(), kBFloat16);
    // The backward reads the bf16-rounded y as well, hence a reference on the exact x and kBf16Tol.
    expect_close({.actual = dx,
                  .expected = ref_softmax_backward(vals(g), vals(x), {2, 3, 7}, 2, log),
                  .tol = abs_and_rel(kBf16Tol),
                  .what = "backward"});
  }
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  for (bool log : {false, true}) {
    const Shape shape{2, 3, 5};
    const Tensor x = randn(shape, 31);
    const Tensor g = randn(shape, 32);
    auto f = [&](const Tensor& t) {
      return vals(log ? ops::log_softmax(t, 1) : ops::softmax(t, 1));
    };
    const Tensor y = log ? ops::log_softmax(x, 1) : ops::softmax(x, 1);
    const Tensor dx = log ? ops::log_softmax_backward(g, y, 1) : ops::softmax_backward(g, y, 1);
    expect_close({.actual = dx,
                  .expected = numeric_grad(x, f, vals(g)),
                  .tol = abs_and_rel(kFdTol),
                  .what = "fd"});  // central diff, see top
  }
}

// ================================ layer norm ================================

// RMSNorm against its definition in double: out = x / sqrt(mean(x^2) + eps) * w; gradients
// against the composed formula, and the no-weight form.
TEST(RMSNorm, ForwardAndBackwardMatchReference) {
  const Tensor x = ops::uniform({3, 5}, 61, -2.0, 2.0), w = ops::uniform({5}, 62, 0.5, 1.5);
  const Tensor g = ops::uniform({3, 5}, 63, -1.0, 1.0);
  const auto xv = ops::to_vector(x), wv = ops::to_vector(w), gv = ops::to_vector(g);
  const double eps = 1e-5;
  std::vector<double> out(15), dx(15), dw(5, 0.0);
  for (int r = 0; r < 3; ++r) {
    double ms = 0;
    for (int j = 0; j < 5; ++j) ms += xv[r * 5 + j] * xv[r * 5 + j] / 5;
    const double s = 1 / std::sqrt(ms + eps);
    double dot = 0;
    for (int j = 0; j < 5; ++j) dot += gv[r * 5 + j] * wv[j] * xv[r * 5 + j] * s / 5;
    for (int j = 0; j < 5; ++j) {
      const double xhat = xv[r * 5 + j] * s;
      out[r * 5 + j] = xhat * wv[j];
      dx[r * 5 + j] = s * (gv[r * 5 + j] * wv[j] - xhat * dot);
      dw[j] += gv[r * 5 + j] * xhat;
    }
  }
  const ops::RMSNormResult r = ops::rms_norm(x, w, eps);
  EXPECT_EQ(r.rstd.shape(), (Shape{3}));
  const auto got = ops::to_vector(r.out);
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(got[i], out[i], 1e-6) << i;
  const ops::RMSNormGrads grads = ops::rms_norm_backward(g, x, r.rstd, w);
  const auto gx = ops::to_vector(grads.grad_x), gw = ops::to_vector(grads.grad_weight);
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(gx[i], dx[i], 1e-6) << i;
  for (int j = 0; j < 5; ++j) EXPECT_NEAR(gw[j], dw[j], 1e-6) << j;
  // Without a weight: the normalized rows, and no weight gradient.
  const ops::RMSNormResult plain = ops::rms_norm(x, Tensor(), eps);
  const auto pv = ops::to_vector(plain.out);
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(pv[i], out[i] / wv[i % 5], 1e-6) << i;
  EXPECT_FALSE(ops::rms_norm_backward(g, x, plain.rstd, Tensor()).grad_weight.defined());
}

// ================================ rope ================================

// RoPE against its definition in double: pair (2i, 2i+1) of head h at position t rotates by
// angle[t][i]; the inverse rotation undoes it (and is the backward: a rotation's transpose);
// bf16 x computes in f32 and rounds once.
TEST(Rope, RotatesPairsByPositionAndInverseUndoesIt) {
  const int64_t batch = 2, time = 3, heads = 2, half = 3;
  const Tensor x = ops::uniform({batch, time, heads, 2 * half}, 71, -2.0, 2.0);
  std::vector<float> cos(time * half), sin(time * half);
  std::vector<double> angle(time * half);
  for (int64_t t = 0; t < time; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      angle[t * half + i] = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / (2 * half));
      cos[t * half + i] = static_cast<float>(std::cos(angle[t * half + i]));
      sin[t * half + i] = static_cast<float>(std::sin(angle[t * half + i]));
    }
  }
  const Tensor c = ops::from_vector(cos, {time, half}), sn = ops::from_vector(sin, {time, half});
  const auto xv = ops::to_vector(x);
  const auto got = ops::to_vector(ops::rope(x, c, sn));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < time; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          const int64_t at = ((b * time + t) * heads + h) * 2 * half + 2 * i;
          const double a = angle[t * half + i], x0 = xv[at], x1 = xv[at + 1];
          EXPECT_NEAR(got[at], x0 * std::cos(a) - x1 * std::sin(a), 1e-6) << at;
          EXPECT_NEAR(got[at + 1], x0 * std::sin(a) + x1 * std::cos(a), 1e-6) << at;
        }
      }
    }
  }
  expect_close({.actual = ops::rope(ops::rope(x, c, sn), c, sn, /*inverse=*/true),
                .expected = x,
                .tol = {.rtol = 1e-6, .atol = 1e-6},
                .what = "rope then its inverse"});
  // Position 0 does not rotate.
  expect_close({.actual = ops::narrow(ops::rope(x, c, sn), 1, 0, 1),
                .expected = ops::narrow(x, 1, 0, 1),
                .tol = {.rtol = 0, .atol = 0},
                .what = "rope at position 0"});
  const Tensor xb = ops::to(x, kBFloat16);
  const Tensor yb = ops::rope(xb, c, sn);
  EXPECT_EQ(yb.dtype(), kBFloat16);
  expect_close({.actual = yb,
                .expected = ops::to(ops::rope(ops::to(xb, kFloat32), c, sn), kBFloat16),
                .tol = {.rtol = 0, .atol = 0},
                .what = "rope of bf16 (f32 math, one rounding)"});
}

TEST(Rope, BadShapesNameWhatWasGivenAndExpected) {
  const Tensor tables = ops::zeros({3, 2});
  EXPECT_THAT(error_of([&] {
                ops::rope(ops::zeros({3, 2, 5}), ops::zeros({3, 2}), tables);
              }),
              HasSubstr("even head_dim"));
  EXPECT_THAT(error_of([&] {
                ops::rope(ops::zeros({1, 4, 2, 4}), tables, tables);
              }),
              HasSubstr("cos and sin must be (T, head_dim / 2) = (4, 2) for x of shape (1, 4, 2, "
                        "4), got (3, 2) and (3, 2)"));
}

TEST(LayerNorm, ForwardAndBackwardMatchReference) {
  struct Case {
    Shape x;
    Shape normalized;
    bool affine;
  };
  const std::vector<Case> cases = {{{3, 5}, {5}, true},
                                   {{2, 3, 7}, {7}, true},
                                   {{2, 3, 7}, {3, 7}, true},
                                   {{2, 3, 7}, {7}, false},
                                   {{4}, {4}, true}};
  uint64_t seed = 100;
  for (const auto& c : cases) {
    const std::string what =
        fmt::format("x {} normalized {}", shape_str(c.x), shape_str(c.normalized));
    const Tensor x = ops::add(ops::mul(randn(c.x, seed++), 2.0), 0.5);
    const Tensor g = randn(c.x, seed++);
    const Tensor w = c.affine ? randn(c.normalized, seed++) : Tensor();
    const Tensor b = c.affine ? randn(c.normalized, seed++) : Tensor();
    const double eps = 1e-5;
    auto r = ops::layer_norm(x, c.normalized, w, b, eps);
    const int64_t n = shape_numel(c.normalized);
    const int64_t rows = x.numel() / n;
    const Vec wv = c.affine ? vals(w) : Vec(), bv = c.affine ? vals(b) : Vec();
    const Vec gv = vals(g);
    const auto ref = ref_layer_norm(vals(x), rows, n, c.affine ? &wv : nullptr,
                                    c.affine ? &bv : nullptr, eps, &gv);
    Shape stats(c.x.begin(), c.x.end() - c.normalized.size());
    EXPECT_EQ(r.mean.shape(), stats) << what;
    EXPECT_EQ(r.rstd.dtype(), kFloat32) << what;
    expect_close({.actual = r.out,
                  .expected = ref.out,
                  .tol = abs_and_rel(kF32Tol),
                  .what = what + " out"});  // f32
    expect_close({.actual = r.mean,
                  .expected = ref.mean,
                  .tol = abs_and_rel(kF32Tol),
                  .what = what + " mean"});
    expect_close({.actual = r.rstd,
                  .expected = ref.rstd,
                  .tol = abs_and_rel(kF32Tol),
                  .what = what + " rstd"});
    auto grads = ops::layer_norm_backward(g, x, r.mean, r.rstd, w, c.normalized);
    expect_close({.actual = grads.grad_x,
                  .expected = ref.dx,
                  .tol = abs_and_rel(kF32Tol),
                  .what = what + " dx"});  // f32
    if (c.affine) {
      EXPECT_EQ(grads.grad_weight.shape(), c.normalized);
      expect_close({.actual = grads.grad_weight,
                    .expected = ref.dw,
                    .tol = abs_and_rel(kF32Tol),
                    .what = what + " dw"});
      expect_close({.actual = grads.grad_bias,
                    .expected = ref.db,
                    .tol = abs_and_rel(kF32Tol),
                    .what = what + " db"});
    } else {
      EXPECT_FALSE(grads.grad_weight.defined()) << what;
      EXPECT_FALSE(grads.grad_bias.defined()) << what;
    }
  }
}

TEST(LayerNorm, NonContiguousAndBf16) {
  // x (3, 7) as a transposed view of (7, 3); weight a strided slice.
  const Tensor x = ops::transpose(randn({7, 3}, 201), 0, 1);
  const Tensor w = ops::slice(randn({14}, 202), 0, 0, 14, 2);
  const Tensor b = randn({7}, 203);
  const Tensor g = ops::transpose(randn({7, 3}, 204), 0, 1);
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_FALSE(w.is_contiguous());
  const Vec wv = vals(w), bv = vals(b), gv = vals(g);
  {
    auto r = ops::layer_norm(x, {7}, w, b, 1e-5);
    const auto ref = ref_layer_norm(vals(x), 3, 7, &wv, &bv, 1e-5, &gv);
    expect_close(
        {.actual = r.out, .expected = ref.out, .tol = abs_and_rel(kF32Tol), .what = "out"});  // f32
    auto grads = ops::layer_norm_backward(g, x, r.mean, r.rstd, w, {7});
    expect_close(
        {.actual = grads.grad_x, .expected = ref.dx, .tol = abs_and_rel(kF32Tol), .what = "dx"});
    expect_close({.actual = grads.grad_weight,
                  .expected = ref.dw,
                  .tol = abs_and_rel(kF32Tol),
                  .what = "dw"});
    expect_close(
        {.actual = grads.grad_bias, .expected = ref.db, .tol = abs_and_rel(kF32Tol), .what = "db"});
  }
  {
    const Tensor xb = ops::to(x, kBFloat16), wb = ops::to(w, kBFloat16), bb = ops::to(b, kBFloat16);
    const Tensor gb = ops::to(g, kBFloat16);
    const Vec wbv = vals(wb), bbv = vals(bb), gbv = vals(gb);
    auto r = ops::layer_norm(xb, {7}, wb, bb, 1e-5);
    EXPECT_EQ(r.out.dtype(), kBFloat16);
    EXPECT_EQ(r.mean.dtype(), kFloat32);
    const auto ref = ref_layer_norm(vals(xb), 3, 7, &wbv, &bbv, 1e-5, &gbv);
    // bf16: inputs exact, one rounding of each result: kBf16Tol.
    expect_close(
        {.actual = r.out, .expected = ref.out, .tol = abs_and_rel(kBf16Tol), .what = "bf16 out"});
    auto grads = ops::layer_norm_backward(gb, xb, r.mean, r.rstd, wb, {7});
    EXPECT_EQ(grads.grad_weight.dtype(), kBFloat16);
    expect_close({.actual = grads.grad_x,
                  .expected = ref.dx,
                  .tol = abs_and_rel(kBf16Tol),
                  .what = "bf16 dx"});
    expect_close({.actual = grads.grad_weight,
                  .expected = ref.dw,
                  .tol = abs_and_rel(kBf16Tol),
                  .what = "bf16 dw"});
    expect_close({.actual = grads.grad_bias,
                  .expected = ref.db,
                  .tol = abs_and_rel(kBf16Tol),
                  .what = "bf16 db"});
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const Shape shape{2, 3, 5};
  const Tensor x = randn(shape, 301);
  const Tensor w = randn({5}, 302);
  const Tensor b = randn({5}, 303);
  const Tensor g = randn(shape, 304);
  auto r = ops::layer_norm(x, {5}, w, b, 1e-5);
  auto grads = ops::layer_norm_backward(g, x, r.mean, r.rstd, w, {5});
  // Central differences, kFdTol (see top), with respect to x, weight and bias.
  expect_close(
      {.actual = grads.grad_x,
       .expected = numeric_grad(
           x, [&](const Tensor& t) { return vals(ops::layer_norm(t, {5}, w, b, 1e-5).out); },
           vals(g)),
       .tol = abs_and_rel(kFdTol),
       .what = "dx"});
  expect_close(
      {.actual = grads.grad_weight,
       .expected = numeric_grad(
           w, [&](const Tensor& t) { return vals(ops::layer_norm(x, {5}, t, b, 1e-5).out); },
           vals(g)),
       .tol = abs_and_rel(kFdTol),
       .what = "dw"});
  expect_close(
      {.actual = grads.grad_bias,
       .expected = numeric_grad(
           b, [&](const Tensor& t) { return vals(ops::layer_norm(x, {5}, w, t, 1e-5).out); },
           vals(g)),
       .tol = abs_and_rel(kFdTol),
       .what = "db"});
}

// ================================ embedding ================================

TEST(Embedding, ForwardAndBackwardMatchReference) {
  const int64_t v = 5, c = 3;
  const Tensor w = randn({v, c}, 401);
  const std::vector<int64_t> idx = {4, 0, 2, 2, 1, 4};
  for (DType index_dtype : {kInt64, kInt32}) {
    const Tensor indices = ops::to(ops::from_vector_i64(idx, {2, 3}), index_dtype);
    const Tensor out = ops::embedding(w, indices);
    EXPECT_EQ(out.shape(), (Shape{2, 3, c}));
    const Vec wv = vals(w);
    Vec expected;
    for (int64_t i : idx) {
      for (int64_t j = 0; j < c; ++j) expected.push_back(wv[i * c + j]);
    }
    EXPECT_EQ(vals(out), expected);  // a gather copies bits: exact
    const Tensor g = randn({2, 3, c}, 402);
    const Vec gv = vals(g);
    Vec dw(v * c, 0.0);
    for (size_t i = 0; i < idx.size(); ++i) {
      for (int64_t j = 0; j < c; ++j) dw[idx[i] * c + j] += gv[i * c + j];
    }
    const Tensor grad_w = ops::embedding_backward(g, indices, v);
    EXPECT_EQ(grad_w.shape(), (Shape{v, c}));
    // f32 sums of at most two terms: kF32Tol.
    expect_close(
        {.actual = grad_w, .expected = dw, .tol = abs_and_rel(kF32Tol), .what = "scatter-add"});
  }
}

TEST(Embedding, NonContiguousWeightAndBf16) {
  const Tensor w = ops::transpose(randn({3, 5}, 411), 0, 1);  // (5, 3), strides (1, 5)
  ASSERT_FALSE(w.is_contiguous());
  const Tensor indices = ops::from_vector_i64(std::vector<int64_t>{3, 1, 3}, {3});
  const Vec wv = vals(w);
  Vec expected;
  for (int64_t i : {3, 1, 3}) {
    for (int64_t j = 0; j < 3; ++j) expected.push_back(wv[i * 3 + j]);
  }
  EXPECT_EQ(vals(ops::embedding(w, indices)), expected);  // exact copy
  const Tensor wb = ops::to(w, kBFloat16);
  const Tensor ob = ops::embedding(wb, indices);
  EXPECT_EQ(ob.dtype(), kBFloat16);
  EXPECT_EQ(vals(ob), vals(ops::embedding(ops::contiguous(wb), indices)));  // exact copy
  // bf16 grad: f32 accumulation then one rounding: kBf16Tol.
  const Tensor g = ops::transpose(randn({3, 3}, 412, kBFloat16), 0, 1);
  const Vec gv = vals(g);
  Vec dw(15, 0.0);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) dw[std::vector<int64_t>{3, 1, 3}[i] * 3 + j] += gv[i * 3 + j];
  }
  const Tensor gw = ops::embedding_backward(g, indices, 5);
  EXPECT_EQ(gw.dtype(), kBFloat16);
  expect_close(
      {.actual = gw, .expected = dw, .tol = abs_and_rel(kBf16Tol), .what = "bf16 scatter-add"});
}

// ================================ cross entropy ================================

TEST(CrossEntropy, ForwardAndBackwardMatchReference) {
  const int64_t n = 5, v = 7;
  const Tensor logits = ops::mul(randn({n, v}, 501), 2.0);
  const Vec x = vals(logits);
  for (int64_t ignore : {int64_t{-100}, int64_t{2}}) {
    // One row with target == ignore_index (two when ignore_index is the class 2).
    const std::vector<int64_t> t = {3, ignore, 0, 6, 2};
    const Tensor targets = ops::from_vector_i64(t, {n});
    const auto ref = ref_cross_entropy(x, t, v, ignore);
    for (auto red : {ops::Reduction::kNone, ops::Reduction::kMean, ops::Reduction::kSum}) {
      const std::string what = fmt::format("ignore {} reduction {}", ignore, static_cast<int>(red));
      auto r = ops::cross_entropy(logits, targets, ignore, red);
      expect_close({.actual = r.logsumexp,
                    .expected = ref.lse,
                    .tol = abs_and_rel(kF32Tol),
                    .what = what + " lse"});  // f32
      Vec row_scale(n, 0.0);
      Tensor grad_loss;
      if (red == ops::Reduction::kNone) {
        EXPECT_EQ(r.loss.shape(), Shape{n});
        expect_close(
            {.actual = r.loss, .expected = ref.losses, .tol = abs_and_rel(kF32Tol), .what = what});
        grad_loss = randn({n}, 502);
        row_scale = vals(grad_loss);
      } else {
        EXPECT_EQ(r.loss.shape(), Shape{});
        const double expected =
            red == ops::Reduction::kSum ? ref.sum : ref.sum / static_cast<double>(ref.count);
        expect_close(
            {.actual = r.loss, .expected = {expected}, .tol = abs_and_rel(kF32Tol), .what = what});
        grad_loss = ops::scalar_tensor(0.7);
        const double s = red == ops::Reduction::kSum ? 0.7 : 0.7 / static_cast<double>(ref.count);
        row_scale.assign(n, s);
      }
      const Vec expected_grad = ref_cross_entropy_backward(x, t, v, ignore, row_scale);
      // f32 softmax minus one-hot, times the scale: kF32Tol; with and without the saved lse.
      expect_close({.actual = ops::cross_entropy_backward(grad_loss, logits, targets, ignore, red,
                                                          r.logsumexp),
                    .expected = expected_grad,
                    .tol = abs_and_rel(kF32Tol),
                    .what = what + " backward"});
      expect_close({.actual = ops::cross_entropy_backward(grad_loss, logits, targets, ignore, red),
                    .expected = expected_grad,
                    .tol = abs_and_rel(kF32Tol),
                    .what = what + " backward (lse recomputed)"});
    }
  }
}

TEST(CrossEntropy, AllIgnoredMeanIsNaNLikePyTorch) {
  const Tensor logits = randn({3, 4}, 511);
  const Tensor targets = ops::from_vector_i64(std::vector<int64_t>{-100, -100, -100}, {3});
  auto mean = ops::cross_entropy(logits, targets, -100, ops::Reduction::kMean);
  EXPECT_TRUE(std::isnan(mean.loss.item<float>()));  // 0 / 0, as torch.nn.functional.cross_entropy
  auto sum = ops::cross_entropy(logits, targets, -100, ops::Reduction::kSum);
  EXPECT_EQ(sum.loss.item<float>(), 0.0f);
  // The gradient of an all-ignored batch is zeros (PyTorch's too), not NaN.
  const Tensor grad = ops::cross_entropy_backward(ops::scalar_tensor(1.0), logits, targets, -100,
                                                  ops::Reduction::kMean, mean.logsumexp);
  EXPECT_EQ(vals(grad), Vec(12, 0.0));
}

TEST(CrossEntropy, NonContiguousBf16AndInt32Targets) {
  const Tensor logits = ops::transpose(randn({7, 5}, 521), 0, 1);  // (5, 7) strided
  ASSERT_FALSE(logits.is_contiguous());
  const std::vector<int64_t> t = {1, 6, 0, -100, 3};
  const Tensor targets = ops::to(ops::from_vector_i64(t, {5}), kInt32);
  auto r = ops::cross_entropy(logits, targets);
  const auto ref = ref_cross_entropy(vals(logits), t, 7, -100);
  expect_close({.actual = r.loss,
                .expected = {ref.sum / ref.count},
                .tol = abs_and_rel(kF32Tol),
                .what = "f32 strided"});  // f32
  const Vec dref = ref_cross_entropy_backward(vals(logits), t, 7, -100, Vec(5, 1.0 / ref.count));
  expect_close({.actual = ops::cross_entropy_backward(ops::scalar_tensor(1.0), logits, targets),
                .expected = dref,
                .tol = abs_and_rel(kF32Tol),
                .what = "f32 strided backward"});

  const Tensor lb = ops::to(logits, kBFloat16);
  auto rb = ops::cross_entropy(lb, targets);
  EXPECT_EQ(rb.loss.dtype(), kFloat32);  // computed in f32 and kept so (torch rounds to bf16)
  const auto refb = ref_cross_entropy(vals(lb), t, 7, -100);
  // bf16 logits are exact in f32, and the loss is not rounded to bf16: f32's tolerance. The
  // gradient is rounded once to the logits' dtype: kBf16Tol.
  expect_close({.actual = rb.loss,
                .expected = {refb.sum / refb.count},
                .tol = abs_and_rel(kF32Tol),
                .what = "bf16"});
  const Vec drefb = ref_cross_entropy_backward(vals(lb), t, 7, -100, Vec(5, 1.0 / refb.count));
  const Tensor db = ops::cross_entropy_backward(ops::scalar_tensor(1.0), lb, targets, -100,
                                                ops::Reduction::kMean, rb.logsumexp);
  EXPECT_EQ(db.dtype(), kBFloat16);
  expect_close(
      {.actual = db, .expected = drefb, .tol = abs_and_rel(kBf16Tol), .what = "bf16 backward"});
}

// The forward of a slice of the classes: its logsumexp is the slice's own rows', and its loss the
// target's negative logit where the slice holds the target's class (0 elsewhere and on ignored
// rows); combined over the slices they give the whole rows' logsumexp and loss.
TEST(CrossEntropy, AClassShardsForwardIsItsPartOfTheLoss) {
  const Tensor logits = randn({6, 11}, 543);
  const std::vector<int64_t> t = {0, 10, -100, 5, 6, 3};
  const Tensor targets = ops::from_vector_i64(t, {6});
  const auto whole = ops::cross_entropy(logits, targets, -100, ops::Reduction::kNone);
  const auto x = vals(logits);
  Vec sum_exp(6, 0.0), target_term(6, 0.0);
  for (const auto& [offset, width] : {std::pair<int64_t, int64_t>{0, 6}, {6, 5}}) {
    const Tensor slice = ops::contiguous(ops::narrow(logits, 1, offset, width));
    const auto part = ops::cross_entropy(slice, targets, -100, ops::Reduction::kNone,
                                         {.offset = offset, .classes = 11});
    expect_close({.actual = part.logsumexp,
                  .expected = ops::cross_entropy(slice, ops::full({6}, -100.0, kInt64), -100,
                                                 ops::Reduction::kNone)
                                  .logsumexp,
                  .tol = {},
                  .what = "a slice's own logsumexp"});
    Vec want;
    for (int64_t row = 0; row < 6; ++row) {
      const int64_t here = t[row] - offset;
      want.push_back(t[row] != -100 && here >= 0 && here < width ? -x[row * 11 + t[row]] : 0.0);
    }
    expect_close({.actual = part.loss, .expected = want, .tol = {}, .what = "a slice's part"});
    const auto lse = vals(part.logsumexp), loss = vals(part.loss);
    for (int64_t row = 0; row < 6; ++row) {
      sum_exp[row] += std::exp(lse[row]);
      target_term[row] += loss[row];
    }
  }
  Vec combined;
  for (int64_t row = 0; row < 6; ++row)
    combined.push_back(t[row] == -100 ? 0.0 : std::log(sum_exp[row]) + target_term[row]);
  expect_close({.actual = whole.loss,
                .expected = combined,
                .tol = abs_and_rel(kF32Tol),
                .what = "the slices' parts combined"});
  Vec combined_lse;
  for (int64_t row = 0; row < 6; ++row) combined_lse.push_back(std::log(sum_exp[row]));
  expect_close({.actual = whole.logsumexp,
                .expected = combined_lse,
                .tol = abs_and_rel(kF32Tol),
                .what = "the slices' logsumexps combined"});
  // A slice of no classes (more shards than classes), and one whose classes are all masked to
  // -inf: logsumexp -inf, not NaN (so the max and the sum over shards ignore it), no target here.
  const auto empty = ops::cross_entropy(ops::narrow(logits, 1, 11, 0), targets, -100,
                                        ops::Reduction::kNone, {.offset = 11, .classes = 11});
  EXPECT_EQ(vals(empty.loss), Vec(6, 0.0));
  for (double l : vals(empty.logsumexp)) EXPECT_EQ(l, -std::numeric_limits<double>::infinity());
  const Tensor masked = ops::full({6, 2}, -std::numeric_limits<double>::infinity());
  const auto all_masked = ops::cross_entropy(masked, targets, -100, ops::Reduction::kNone,
                                             {.offset = 9, .classes = 11});
  for (double l : vals(all_masked.logsumexp))
    EXPECT_EQ(l, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(ops::cross_entropy_backward(ops::scalar_tensor(1.0), ops::narrow(logits, 1, 11, 0),
                                        targets, -100, ops::Reduction::kMean, whole.logsumexp,
                                        {.offset = 11, .classes = 11})
                .shape(),
            (Shape{6, 0}));
  EXPECT_EQ(error_of([&] {
              ops::cross_entropy(ops::narrow(logits, 1, 6, 5), targets, -100, ops::Reduction::kMean,
                                 {.offset = 6, .classes = 11});
            }),
            "cross_entropy: a class shard's loss is per row (reduction none), got reduction 1");
  const Tensor bad = ops::from_vector_i64(std::vector<int64_t>{0, 1, 2, 3, 11, 4}, {6});
  EXPECT_EQ(error_of([&] {
              ops::cross_entropy(ops::narrow(logits, 1, 0, 6), bad, -100, ops::Reduction::kNone,
                                 {.offset = 0, .classes = 11});
            }),
            "cross_entropy: target 11 at position 4 is out of range for 11 classes (logits shape "
            "(6, 6)); expected 0..10 or ignore_index -100");
}

// Logits holding a slice of the classes (loss parallel): given the whole rows' logsumexp, each
// slice's gradient is exactly those columns of the whole gradient (the same f32 expression per
// element), every reduction, ignored rows and targets on every slice included; targets are
// checked against all the classes, and a slice outside them is refused.
TEST(CrossEntropy, BackwardOfAClassShardIsItsColumnsOfTheWholeGradient) {
  const Tensor logits = randn({6, 11}, 541);
  const Tensor targets = ops::from_vector_i64(std::vector<int64_t>{0, 10, -100, 5, 6, 3}, {6});
  for (auto red : {ops::Reduction::kNone, ops::Reduction::kMean, ops::Reduction::kSum}) {
    for (const DType dtype : {kFloat32, kBFloat16}) {
      SCOPED_TRACE(fmt::format("reduction {}, {}", static_cast<int>(red), dtype_name(dtype)));
      const Tensor x = ops::to(logits, dtype);
      const Tensor grad_loss =
          red == ops::Reduction::kNone ? randn({6}, 542) : ops::scalar_tensor(0.7);
      const Tensor lse = ops::cross_entropy(x, targets, -100, red).logsumexp;
      const Tensor whole = ops::cross_entropy_backward(grad_loss, x, targets, -100, red, lse);
      for (const auto& [offset, width] : {std::pair<int64_t, int64_t>{0, 6}, {6, 5}, {4, 3}}) {
        const Tensor shard = ops::cross_entropy_backward(
            grad_loss, ops::contiguous(ops::narrow(x, 1, offset, width)), targets, -100, red, lse,
            {.offset = offset, .classes = 11});
        EXPECT_EQ(shard.dtype(), dtype);
        expect_bitwise_equal(
            {.actual = shard, .expected = ops::contiguous(ops::narrow(whole, 1, offset, width))});
      }
    }
  }
  const Tensor bad = ops::from_vector_i64(std::vector<int64_t>{0, 11, 1, 2, 3, 4}, {6});
  const Tensor lse = ops::cross_entropy(logits, targets).logsumexp;
  EXPECT_EQ(error_of([&] {
              ops::cross_entropy_backward(ops::scalar_tensor(1.0), ops::narrow(logits, 1, 6, 5),
                                          bad, -100, ops::Reduction::kMean, lse,
                                          {.offset = 6, .classes = 11});
            }),
            "cross_entropy_backward: target 11 at position 1 is out of range for 11 classes "
            "(logits shape (6, 5)); expected 0..10 or ignore_index -100");
  EXPECT_EQ(error_of([&] {
              ops::cross_entropy_backward(ops::scalar_tensor(1.0), ops::narrow(logits, 1, 6, 5),
                                          targets, -100, ops::Reduction::kMean, lse,
                                          {.offset = 7, .classes = 11});
            }),
            "cross_entropy_backward: a class shard [7, 7 + 5) must lie within its 11 classes "
            "(logits shape (6, 5))");
  EXPECT_EQ(error_of([&] {
              ops::cross_entropy_backward(ops::scalar_tensor(1.0), ops::narrow(logits, 1, 6, 5),
                                          targets, -100, ops::Reduction::kMean, {},
                                          {.offset = 6, .classes = 11});
            }),
            "cross_entropy_backward: a class shard needs the whole rows' logsumexp");
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const Tensor logits = randn({4, 6}, 531);
  const Tensor targets = ops::from_vector_i64(std::vector<int64_t>{5, -100, 0, 3}, {4});
  for (auto red : {ops::Reduction::kNone, ops::Reduction::kMean, ops::Reduction::kSum}) {
    const Tensor grad_loss =
        red == ops::Reduction::kNone ? randn({4}, 532) : ops::scalar_tensor(0.7);
    auto f = [&](const Tensor& t) { return vals(ops::cross_entropy(t, targets, -100, red).loss); };
    const Tensor d = ops::cross_entropy_backward(grad_loss, logits, targets, -100, red);
    // Central differences, kFdTol (see top).
    expect_close({.actual = d,
                  .expected = numeric_grad(logits, f, vals(grad_loss)),
                  .tol = abs_and_rel(kFdTol),
                  .what = fmt::format("reduction {}", static_cast<int>(red))});
  }
}

// ================================ attention ================================

struct AttnCase {
  Shape q, k, v;
  bool causal;
  double scale;  // <= 0: default 1/sqrt(D)
};

void check_attention_case(const AttnCase& c, uint64_t seed, DType dtype, double tol) {
  const std::string what =
      fmt::format("q {} k {} v {} causal {} scale {} dtype {}", shape_str(c.q), shape_str(c.k),
                  shape_str(c.v), c.causal, c.scale, dtype_name(dtype));
  const Tensor q = randn(c.q, seed, dtype), k = randn(c.k, seed + 1, dtype),
               v = randn(c.v, seed + 2, dtype);
  const int64_t tq = c.q[c.q.size() - 2], d = c.q.back(), tk = c.k[c.k.size() - 2], dv = c.v.back();
  const int64_t rows = q.numel() / (tq * d);
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(d));
  Shape out_shape(c.q.begin(), c.q.end() - 1);
  out_shape.push_back(dv);
  const Tensor g = randn(out_shape, seed + 3, dtype);
  const Vec gv = vals(g);
  const auto ref =
      ref_attention(vals(q), vals(k), vals(v), rows, tq, tk, d, dv, c.causal, scale, &gv);
  auto r = ops::scaled_dot_product_attention(q, k, v, c.causal, c.scale);
  EXPECT_EQ(r.out.shape(), out_shape) << what;
  EXPECT_EQ(r.out.dtype(), dtype) << what;
  expect_close(
      {.actual = r.out, .expected = ref.out, .tol = abs_and_rel(tol), .what = what + " out"});
  expect_close(
      {.actual = r.logsumexp, .expected = ref.lse, .tol = abs_and_rel(tol), .what = what + " lse"});
  auto grads =
      ops::scaled_dot_product_attention_backward(g, q, k, v, r.out, r.logsumexp, c.causal, c.scale);
  EXPECT_EQ(grads.dk.shape(), c.k) << what;
  expect_close(
      {.actual = grads.dq, .expected = ref.dq, .tol = abs_and_rel(tol), .what = what + " dq"});
  expect_close(
      {.actual = grads.dk, .expected = ref.dk, .tol = abs_and_rel(tol), .what = what + " dk"});
  expect_close(
      {.actual = grads.dv, .expected = ref.dv, .tol = abs_and_rel(tol), .what = what + " dv"});
}

const std::vector<AttnCase>& attention_cases() {
  static const std::vector<AttnCase> cases = {
      {{2, 2, 5, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, false, 0.0},
      {{2, 2, 5, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, true, 0.0},
      {{2, 3, 4}, {2, 6, 4}, {2, 6, 3}, false, 0.0},          // Tq < Tk, Dv != D, one batch dim
      {{2, 3, 4}, {2, 6, 4}, {2, 6, 3}, true, 0.3},           // top-left causal, explicit scale
      {{1, 2, 7, 4}, {1, 2, 3, 4}, {1, 2, 3, 5}, true, 0.0},  // Tq > Tk causal
      {{5, 3}, {4, 3}, {4, 2}, true, 0.0},                    // no batch dims
  };
  return cases;
}

TEST(Attention, ForwardAndBackwardMatchReference) {
  uint64_t seed = 600;
  for (const auto& c : attention_cases()) {
    // f32 through the GEMM: sums of <= 7 products, kF32Tol plus GEMM reassociation.
    check_attention_case(c, seed, kFloat32, 2e-5);
    seed += 10;
  }
}

TEST(Attention, Bf16) {
  uint64_t seed = 700;
  for (const auto& c : attention_cases()) {
    // bf16 inputs are exact in f32; each result is rounded once to bf16: kBf16Tol. The backward
    // reads bf16 out/grad_out (exact) and rounds dq/dk/dv once.
    check_attention_case(c, seed, kBFloat16, kBf16Tol);
    seed += 10;
  }
}

TEST(Attention, NonContiguousInputs) {
  // GPT layout: (B, T, H, D) transposed to (B, H, T, D).
  const Tensor q = ops::transpose(randn({2, 5, 2, 4}, 801), 1, 2);
  const Tensor k = ops::transpose(randn({2, 5, 2, 4}, 802), 1, 2);
  const Tensor v = ops::transpose(randn({2, 5, 2, 4}, 803), 1, 2);
  const Tensor g = ops::transpose(randn({2, 5, 2, 4}, 804), 1, 2);
  ASSERT_FALSE(q.is_contiguous());
  const Vec gv = vals(g);
  for (bool causal : {false, true}) {
    const auto ref = ref_attention(vals(q), vals(k), vals(v), 4, 5, 5, 4, 4, causal, 0.5, &gv);
    auto r = ops::scaled_dot_product_attention(q, k, v, causal);
    expect_close({.actual = r.out,
                  .expected = ref.out,
                  .tol = abs_and_rel(2e-5),
                  .what = "out"});  // f32, as above
    auto grads = ops::scaled_dot_product_attention_backward(g, q, k, v, r.out, r.logsumexp, causal);
    expect_close({.actual = grads.dq, .expected = ref.dq, .tol = abs_and_rel(2e-5), .what = "dq"});
    expect_close({.actual = grads.dk, .expected = ref.dk, .tol = abs_and_rel(2e-5), .what = "dk"});
    expect_close({.actual = grads.dv, .expected = ref.dv, .tol = abs_and_rel(2e-5), .what = "dv"});
  }
}

TEST(Attention, CausalFirstQueryCopiesFirstValue) {
  // Query 0 sees only key 0 under the causal mask, whatever the scores: out[0] == v[0].
  const Tensor q = randn({1, 4, 3}, 811), k = randn({1, 6, 3}, 812), v = randn({1, 6, 2}, 813);
  const Vec out = vals(ops::scaled_dot_product_attention(q, k, v, true).out);
  const Vec vv = vals(v);
  EXPECT_NEAR(out[0], vv[0], 1e-6);  // softmax of one element is exactly 1 (f32 rounding only)
  EXPECT_NEAR(out[1], vv[1], 1e-6);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (bool causal : {false, true}) {
    const Tensor q = randn({1, 2, 4, 3}, 901), k = randn({1, 2, 5, 3}, 902),
                 v = randn({1, 2, 5, 2}, 903);
    const Tensor g = randn({1, 2, 4, 2}, 904);
    auto r = ops::scaled_dot_product_attention(q, k, v, causal);
    auto grads = ops::scaled_dot_product_attention_backward(g, q, k, v, r.out, r.logsumexp, causal);
    const Vec w = vals(g);
    auto sdpa = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return vals(ops::scaled_dot_product_attention(a, b, c, causal).out);
    };
    // Central differences, kFdTol (see top).
    expect_close({.actual = grads.dq,
                  .expected = numeric_grad(
                      q, [&](const Tensor& t) { return sdpa(t, k, v); }, w),
                  .tol = abs_and_rel(kFdTol),
                  .what = "dq"});
    expect_close({.actual = grads.dk,
                  .expected = numeric_grad(
                      k, [&](const Tensor& t) { return sdpa(q, t, v); }, w),
                  .tol = abs_and_rel(kFdTol),
                  .what = "dk"});
    expect_close({.actual = grads.dv,
                  .expected = numeric_grad(
                      v, [&](const Tensor& t) { return sdpa(q, k, t); }, w),
                  .tol = abs_and_rel(kFdTol),
                  .what = "dv"});
  }
}

// ================================ dropout ================================

// over_logits: the gradient is written over contiguous logits (f32 in place; bf16 rounded into
// them), equal to the gradient in a new tensor; non-contiguous logits get a new one.
TEST(CrossEntropy, BackwardOverTheLogitsIsTheSameGradient) {
  const Tensor targets = ops::from_vector_i64({3, -100, 0, 6}, {4});
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (ops::Reduction r : {ops::Reduction::kMean, ops::Reduction::kSum, ops::Reduction::kNone}) {
      const Tensor logits = ops::to(randn({4, 7}, 1301), dtype);
      const Tensor grad_loss =
          r == ops::Reduction::kNone ? randn({4}, 1302) : ops::scalar_tensor(0.5);
      const Tensor lse = ops::cross_entropy(logits, targets, -100, r).logsumexp;
      const Tensor expected = ops::cross_entropy_backward(grad_loss, logits, targets, -100, r, lse);
      const Tensor spent = ops::clone(logits);
      const Tensor over = ops::cross_entropy_backward(grad_loss, spent, targets, -100, r, lse, {},
                                                      /*over_logits=*/true);
      EXPECT_EQ(over.raw_data(), spent.raw_data()) << dtype_name(dtype);
      EXPECT_EQ(vals(over), vals(expected)) << dtype_name(dtype);
      const Tensor strided = ops::transpose(ops::contiguous(ops::transpose(logits, 0, 1)), 0, 1);
      const Tensor fresh = ops::cross_entropy_backward(grad_loss, strided, targets, -100, r, lse,
                                                       {}, /*over_logits=*/true);
      EXPECT_NE(fresh.raw_data(), strided.raw_data());
      EXPECT_EQ(vals(fresh), vals(expected)) << dtype_name(dtype) << " strided";
    }
  }
}

TEST(Dropout, MasksAndScalesDeterministically) {
  const Tensor x = randn({40, 50}, 1001);
  const double p = 0.3;
  auto r = ops::dropout(x, p, /*seed=*/42);
  ASSERT_TRUE(r.mask.defined());
  EXPECT_EQ(vals(r.mask), vals(ops::bernoulli_keep_mask({40, 50}, 42, p)));
  const Vec xv = vals(x), mv = vals(r.mask), ov = vals(r.out);
  double kept = 0;
  Vec expected(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_TRUE(mv[i] == 0.0 || mv[i] == 1.0);
    kept += mv[i];
    expected[i] = xv[i] * mv[i] / (1.0 - p);
  }
  // One f32 multiply: kF32Tol.
  expect_close({.actual = ov, .expected = expected, .tol = abs_and_rel(kF32Tol), .what = "out"});
  // 2000 Bernoulli(0.7) draws: std of the mean is 0.01, so +-0.05 is a 5-sigma bound.
  EXPECT_NEAR(kept / xv.size(), 1.0 - p, 0.05);
  // Same seed, same mask; another seed, another mask.
  EXPECT_EQ(vals(ops::dropout(x, p, 42).mask), mv);
  EXPECT_NE(vals(ops::dropout(x, p, 43).mask), mv);
  // Backward: grad * mask / (1 - p).
  const Tensor g = randn({40, 50}, 1002);
  const Vec gv = vals(g);
  Vec dg(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) dg[i] = gv[i] * mv[i] / (1.0 - p);
  expect_close({.actual = ops::dropout_backward(g, r.mask, p),
                .expected = dg,
                .tol = abs_and_rel(kF32Tol),
                .what = "backward"});
}

TEST(Dropout, IdentityAndZeroCasesAndBf16) {
  const Tensor x = ops::transpose(randn({5, 3}, 1101), 0, 1);
  auto eval = ops::dropout(x, 0.5, 1, /*training=*/false);
  EXPECT_TRUE(eval.out.is_same(x));
  EXPECT_FALSE(eval.mask.defined());
  auto p0 = ops::dropout(x, 0.0, 1);
  EXPECT_TRUE(p0.out.is_same(x));
  EXPECT_TRUE(ops::dropout_backward(x, Tensor(), 0.0).is_same(x));
  auto p1 = ops::dropout(x, 1.0, 1);
  EXPECT_EQ(vals(p1.out), Vec(15, 0.0));  // zeros, not NaN from 0 * inf
  EXPECT_EQ(vals(ops::dropout_backward(x, p1.mask, 1.0)), Vec(15, 0.0));
  // Non-contiguous bf16 input: mask indexes the logical (row-major) elements.
  const Tensor xb = ops::to(x, kBFloat16);
  auto rb = ops::dropout(xb, 0.25, 7);
  EXPECT_EQ(rb.out.dtype(), kBFloat16);
  const Vec xv = vals(xb), mv = vals(rb.mask);
  Vec expected(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) expected[i] = xv[i] * mv[i] / 0.75;
  expect_close({.actual = rb.out,
                .expected = expected,
                .tol = abs_and_rel(kBf16Tol),
                .what = "bf16"});  // one bf16 rounding: kBf16Tol
}

// A region (where x sits in a larger tensor's mask, as a data-parallel rank's rows or a
// context-parallel rank's chunks) travels with the call in its attrs, which the op table (what
// autograd and DTensor's strategies call again) reads back.
TEST(Dropout, ARegionTravelsInTheCallsAttrs) {
  const Tensor x = randn({3, 4, 5}, 1103);
  const RngRegion rows{{9, 4, 5}, {3, 0, 0}};
  const RngRegion chunks{{3, 16, 5}, {0, 0, 0}, /*runs_dim=*/1, {0, 2, 2, 2, 12, 2}};
  for (const RngRegion& region : {rows, chunks}) {
    const Tensor expected_mask = ops::bernoulli_keep_mask({3, 4, 5}, 21, 0.5, region);
    EXPECT_EQ(vals(ops::dropout(x, 0.5, 21, /*training=*/true, region).mask), vals(expected_mask));
    std::vector<OpAttr> attrs{0.5, int64_t{21}, true, region.global_shape, region.global_offset};
    if (!region.runs.empty()) {
      std::vector<int64_t> runs{region.runs_dim};
      runs.insert(runs.end(), region.runs.begin(), region.runs.end());
      attrs.emplace_back(runs);
    }
    EXPECT_EQ(vals(call_op(OpCall(OpId::dropout, {x}, attrs))[1]), vals(expected_mask));
  }
}

// ================================ table and dispatch ================================

TEST(NnOpTable, CallOpMatchesDirectCalls) {
  const Tensor x = randn({3, 5}, 1201);
  EXPECT_EQ(vals(call_op(OpCall(OpId::softmax, {x}, {int64_t{1}}))[0]), vals(ops::softmax(x, 1)));
  const Tensor w = randn({5}, 1202);
  auto ln = call_op(OpCall(OpId::layer_norm, {x, w, Tensor()}, {std::vector<int64_t>{5}, 1e-5}));
  ASSERT_EQ(ln.size(), 3u);
  EXPECT_EQ(vals(ln[0]), vals(ops::layer_norm(x, {5}, w, Tensor(), 1e-5).out));
  const Tensor t = ops::from_vector_i64(std::vector<int64_t>{0, 4, -100}, {3});
  auto ce = call_op(OpCall(OpId::cross_entropy, {x, t}, {int64_t{-100}, int64_t{2}}));
  ASSERT_EQ(ce.size(), 2u);
  EXPECT_EQ(vals(ce[0]), vals(ops::cross_entropy(x, t, -100, ops::Reduction::kSum).loss));
  const Tensor q = randn({1, 3, 2}, 1203);
  auto at = call_op(OpCall(OpId::scaled_dot_product_attention, {q, q, q}, {true, 0.0}));
  ASSERT_EQ(at.size(), 2u);
  EXPECT_EQ(vals(at[0]), vals(ops::scaled_dot_product_attention(q, q, q, true).out));
  auto dr = call_op(OpCall(OpId::dropout, {x}, {0.5, int64_t{9}, true}));
  EXPECT_EQ(vals(dr[1]), vals(ops::dropout(x, 0.5, 9).mask));
}

class FakeExtension : public TensorExtension {
 public:
  int kind() const override { return 4242; }
};

TEST(NnOpTable, DispatchHookSeesNameInputsAndAttrs) {
  std::vector<std::string> seen;
  std::vector<size_t> input_counts, attr_counts;
  register_dispatch_handler(4242, [&](const OpCall& call) {
    seen.emplace_back(call.op);
    input_counts.push_back(call.inputs.size());
    attr_counts.push_back(call.attrs.size());
    // Strip the extension and run the plain op: what a DTensor handler does on local shards.
    OpCall local(call.id, {}, call.attrs);
    for (const Tensor& t : call.inputs) local.inputs.push_back(t.defined() ? ops::alias(t) : t);
    return call_op(local);
  });
  Tensor x = ops::clone(randn({3, 5}, 1301));
  x.impl()->extension = std::make_shared<FakeExtension>();
  auto ln = ops::layer_norm(x, {5}, Tensor(), Tensor(), 1e-5);
  auto ce = ops::cross_entropy(x, ops::from_vector_i64(std::vector<int64_t>{1, 2, 3}, {3}));
  auto dr = ops::dropout(x, 0.5, 3);
  register_dispatch_handler(4242, nullptr);
  EXPECT_EQ(seen, (std::vector<std::string>{"layer_norm", "cross_entropy", "dropout"}));
  EXPECT_EQ(input_counts, (std::vector<size_t>{3, 2, 1}));
  // cross_entropy: ignore_index, reduction, and the class shard's offset and classes.
  EXPECT_EQ(attr_counts, (std::vector<size_t>{2, 4, 3}));
  const Tensor plain = ops::alias(x);
  EXPECT_EQ(vals(ln.out), vals(ops::layer_norm(plain, {5}, Tensor(), Tensor(), 1e-5).out));
  EXPECT_EQ(vals(ln.rstd), vals(ops::layer_norm(plain, {5}, Tensor(), Tensor(), 1e-5).rstd));
  EXPECT_EQ(vals(ce.logsumexp),
            vals(ops::cross_entropy(plain, ops::from_vector_i64(std::vector<int64_t>{1, 2, 3}, {3}))
                     .logsumexp));
  EXPECT_EQ(vals(dr.mask), vals(ops::dropout(plain, 0.5, 3).mask));
}

// ================================ errors ================================

TEST(NnErrors, MessagesNameOpAndShapes) {
  const Tensor x24 = randn({2, 4}, 1401);
  EXPECT_THAT(error_of([&] { ops::layer_norm(x24, {5}, Tensor(), Tensor()); }),
              HasSubstr("layer_norm: normalized shape (5,) does not match the last dims of input "
                        "shape (2, 4)"));
  EXPECT_THAT(error_of([&] { ops::layer_norm(x24, {4}, randn({3}, 1), Tensor()); }),
              HasSubstr("layer_norm: weight shape (3,) does not match normalized shape (4,)"));
  EXPECT_THAT(error_of([&] { ops::softmax(x24, 2); }),
              HasSubstr("softmax: dim 2 out of range for a tensor of rank 2"));
  EXPECT_THAT(error_of([&] {
                ops::softmax(ops::from_vector_i64(std::vector<int64_t>{1, 2}, {2}), 0);
              }),
              HasSubstr("softmax: expected x to have a floating dtype (f32, bf16, f16), got i64 of "
                        "shape (2,)"));
  EXPECT_THAT(error_of([&] {
                ops::softmax_backward(randn({2, 3}, 1), x24, 1);
              }),
              HasSubstr("softmax_backward: grad_out shape (2, 3) does not match out shape (2, 4)"));

  const Tensor w = randn({5, 3}, 1402);
  EXPECT_THAT(error_of([&] {
                ops::embedding(w, ops::from_vector_i64(std::vector<int64_t>{0, 1, 2, 7}, {2, 2}));
              }),
              HasSubstr("embedding: index 7 at position (1, 1) of indices shape (2, 2) is out of "
                        "range for 5 embeddings"));
  EXPECT_THAT(
      error_of([&] { ops::embedding(w, ops::from_vector_i64(std::vector<int64_t>{-1}, {1})); }),
      HasSubstr("index -1 at position (0,)"));
  EXPECT_THAT(
      error_of([&] { ops::embedding(w, randn({2}, 1)); }),
      HasSubstr("embedding: expected indices to have dtype i64 or i32, got f32 of shape (2,)"));
  EXPECT_THAT(error_of([&] {
                ops::embedding(randn({5}, 1), ops::from_vector_i64(std::vector<int64_t>{0}, {1}));
              }),
              HasSubstr("embedding: expected weight of shape (V, C), got shape (5,)"));
  EXPECT_THAT(error_of([&] {
                ops::embedding_backward(randn({2, 3}, 1),
                                        ops::from_vector_i64(std::vector<int64_t>{0, 9}, {2}), 5);
              }),
              HasSubstr("embedding_backward: index 9 at position (1,)"));

  const Tensor logits = randn({3, 4}, 1403);
  EXPECT_THAT(
      error_of([&] {
        ops::cross_entropy(logits, ops::from_vector_i64(std::vector<int64_t>{0, 1, 9}, {3}));
      }),
      HasSubstr("cross_entropy: target 9 at position 2 is out of range for 4 classes "
                "(logits shape (3, 4))"));
  EXPECT_THAT(error_of([&] {
                ops::cross_entropy(randn({2, 3, 4}, 1),
                                   ops::from_vector_i64(std::vector<int64_t>{0, 1}, {2}));
              }),
              HasSubstr("cross_entropy: expected logits of shape (N, V), got shape (2, 3, 4)"));
  EXPECT_THAT(error_of([&] {
                ops::cross_entropy(logits, ops::from_vector_i64(std::vector<int64_t>{0, 1}, {2}));
              }),
              HasSubstr("cross_entropy: targets shape (2,) does not match logits shape (3, 4)"));
  EXPECT_THAT(error_of([&] {
                ops::cross_entropy_backward(
                    randn({3}, 1), logits,
                    ops::from_vector_i64(std::vector<int64_t>{0, 1, 2}, {3}));
              }),
              HasSubstr("cross_entropy_backward: with reduction mean/sum grad_loss must have one "
                        "element, got shape (3,)"));

  const Tensor q = randn({1, 2, 5, 4}, 1404);
  EXPECT_THAT(
      error_of([&] {
        ops::scaled_dot_product_attention(q, randn({1, 2, 5, 3}, 1), q);
      }),
      HasSubstr("scaled_dot_product_attention: q and k must have the same last dim (D), got "
                "shapes q (1, 2, 5, 4), k (1, 2, 5, 3), v (1, 2, 5, 4)"));
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention(q, q, randn({1, 2, 6, 4}, 1));
              }),
              HasSubstr("k and v must have the same sequence length"));
  EXPECT_THAT(error_of([&] {
                ops::scaled_dot_product_attention(q, randn({1, 3, 5, 4}, 1), q);
              }),
              HasSubstr("same leading (batch) dims"));
  EXPECT_THAT(error_of([&] { ops::scaled_dot_product_attention(q, ops::to(q, kBFloat16), q); }),
              HasSubstr("q, k and v must have one dtype, got f32, bf16 and f32"));

  EXPECT_THAT(error_of([&] { ops::dropout(x24, 1.5, 0); }),
              HasSubstr("dropout: p must be in [0, 1], got 1.5 (input shape (2, 4))"));
  EXPECT_THAT(error_of([&] {
                ops::dropout_backward(x24, randn({4, 2}, 1), 0.5);
              }),
              HasSubstr("dropout_backward: mask shape (4, 2) does not match grad shape (2, 4)"));
}

}  // namespace
}  // namespace loom
