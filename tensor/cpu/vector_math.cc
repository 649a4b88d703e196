#include "tensor/cpu/vector_math.h"

#include <algorithm>
#include <cstring>

#include "tensor/cpu/parallel.h"

namespace loom::cpu {

namespace {

// Chunk boundaries fall on multiples of this many elements (wider than any vector), so only the
// array's last few elements ever take a loop's scalar tail: every other element is computed by
// the vector body whatever the thread count.
constexpr int64_t kChunkAlign = 64;

// Runs body(begin, end) over [0, n) in contiguous chunks, on the GEMM's thread count.
template <typename Body>
void parallel_chunks(int64_t n, const Body& body) {
  parallel_for(n, kParallelGrain, kChunkAlign, body);
}

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// e^x for x in [-87, 88.7] (inf above, as expf; below, e^-87, which no caller tells from 0):
// Cephes' expf. n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts for exactness), e^r by a
// degree-5 polynomial on [-ln2/2, ln2/2], times 2^n built in the exponent bits (rint: one
// vroundps).
inline float fast_exp(float x) {
  const float above = x > 88.72f ? __builtin_inff() : 0.0f;  // e^x overflows: inf, as expf
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = __builtin_rintf(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  return std::max(er * bits_to_float((static_cast<int32_t>(n) + 127) << 23), above);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// sigmoid(2u) of GELU's inner value u(x).
inline float gelu_gate(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 1.0f / (1.0f + fast_exp(-2.0f * u));
}

__attribute__((target_clones("avx512f", "default"))) void gelu_range(const float* x, float* y,
                                                                     int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) y[i] = x[i] * gelu_gate(x[i]);
}

__attribute__((target_clones("avx512f", "default"))) void gelu_backward_range(
    const float* g, const float* x, float* out, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float v = x[i];
    const float s = gelu_gate(v);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    // d/dx [x s(2u)] = s + x * 2 s (1 - s) u'
    out[i] = g[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}

__attribute__((target_clones("avx512f", "default"))) void adamw_range(float* p, const float* g,
                                                                      float* m, float* v,
                                                                      int64_t begin, int64_t end,
                                                                      const AdamWStep& s) {
  // Locals, not reads through `s` (which the stores below could alias, as far as the compiler
  // knows), so the loop vectorizes.
  const float beta1 = s.beta1, beta2 = s.beta2, lr = s.lr, eps = s.eps;
  const float bias1 = s.bias1, bias2 = s.bias2;
  const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
  const float decay = 1.0f - lr * s.weight_decay;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + one_minus_beta1 * gi;
    const float vi = beta2 * v[i] + one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float denom = __builtin_sqrtf(vi / bias2) + eps;
    p[i] = p[i] * decay - (mi / bias1) / denom * lr;
  }
}

#define LOOM_ARITH_LOOP(expr) \
  _Pragma("omp simd") for (int64_t i = begin; i < end; ++i) out[i] = (expr)

__attribute__((target_clones("avx512f", "default"))) void arith_range(Arith op, const float* a,
                                                                      const float* b, float* out,
                                                                      int64_t begin, int64_t end) {
  switch (op) {
    case Arith::kAdd:
      LOOM_ARITH_LOOP(a[i] + b[i]);
      break;
    case Arith::kSub:
      LOOM_ARITH_LOOP(a[i] - b[i]);
      break;
    case Arith::kMul:
      LOOM_ARITH_LOOP(a[i] * b[i]);
      break;
    case Arith::kDiv:
      LOOM_ARITH_LOOP(a[i] / b[i]);
      break;
    case Arith::kRsub:
      LOOM_ARITH_LOOP(b[i] - a[i]);
      break;
  }
}

__attribute__((target_clones("avx512f", "default"))) void arith_scalar_range(
    Arith op, const float* a, float s, float* out, int64_t begin, int64_t end) {
  switch (op) {
    case Arith::kAdd:
      LOOM_ARITH_LOOP(a[i] + s);
      break;
    case Arith::kSub:
      LOOM_ARITH_LOOP(a[i] - s);
      break;
    case Arith::kMul:
      LOOM_ARITH_LOOP(a[i] * s);
      break;
    case Arith::kDiv:
      LOOM_ARITH_LOOP(a[i] / s);
      break;
    case Arith::kRsub:
      LOOM_ARITH_LOOP(s - a[i]);
      break;
  }
}

#undef LOOM_ARITH_LOOP

}  // namespace

void gelu_f32(const float* x, float* y, int64_t n) {
  parallel_chunks(n, [&](int64_t begin, int64_t end) { gelu_range(x, y, begin, end); });
}

void gelu_backward_f32(const float* grad, const float* x, float* out, int64_t n) {
  parallel_chunks(
      n, [&](int64_t begin, int64_t end) { gelu_backward_range(grad, x, out, begin, end); });
}

void arith_f32(Arith op, const float* a, const float* b, float* out, int64_t n) {
  parallel_chunks(n, [&](int64_t begin, int64_t end) { arith_range(op, a, b, out, begin, end); });
}

void arith_f32_block(Arith op, const float* a, int64_t lda, const float* b, int64_t ldb, float* out,
                     int64_t ldo, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    arith_range(op, a + r * lda, b + r * ldb, out + r * ldo, 0, cols);
}

void arith_scalar_f32(Arith op, const float* a, float s, float* out, int64_t n) {
  parallel_chunks(
      n, [&](int64_t begin, int64_t end) { arith_scalar_range(op, a, s, out, begin, end); });
}

void fill_f32(float* out, float value, int64_t n) {
  parallel_chunks(n, [&](int64_t begin, int64_t end) { std::fill(out + begin, out + end, value); });
}

void adamw_f32(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamWStep& step) {
  parallel_chunks(n, [&](int64_t begin, int64_t end) {
    adamw_range(param, grad, exp_avg, exp_avg_sq, begin, end, step);
  });
}

}  // namespace loom::cpu
