#include "tensor/cpu/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/parallel.h"

namespace loom::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// y += alpha * x
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline const float* row(const RowMatrices& m, int64_t entry, int64_t r) {
  return m.base + m.offsets[entry] + r * m.row_stride;
}

// Keys 0..visible_keys(i) - 1 are the ones query i sees: all, or (causal) j <= i + offset.
int64_t visible_keys(const AttentionShape& s, int64_t i) {
  return s.causal ? std::clamp<int64_t>(i + 1 + s.causal_offset, 0, s.tk) : s.tk;
}

// Splits the entries over the threads, one entry per call of body(entry, scratch).
template <typename Body>
void for_each_entry(const AttentionShape& s, const Body& body) {
  parallel_for(s.entries, /*grain=*/1, /*align=*/1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(3 * std::max<int64_t>(s.tk, 1)));
    for (int64_t e = begin; e < end; ++e) body(e, scratch.data());
  });
}

}  // namespace

void attention_forward(const AttentionShape& s, const RowMatrices& q, const RowMatrices& k,
                       const RowMatrices& v, float* out, float* lse) {
  for_each_entry(s, [&](int64_t e, float* p) {
    for (int64_t i = 0; i < s.tq; ++i) {
      float* o = out + (e * s.tq + i) * s.dv;
      std::fill(o, o + s.dv, 0.0f);
      const int64_t visible = visible_keys(s, i);
      if (visible == 0) {
        lse[e * s.tq + i] = kNegInf;
        continue;
      }
      const float* qi = row(q, e, i);
      float m = kNegInf;
      for (int64_t j = 0; j < visible; ++j) {
        p[j] = dot(qi, row(k, e, j), s.d) * s.scale;
        m = std::max(m, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      const auto inv = static_cast<float>(1.0 / sum);
      const AttentionDropoutMask& drop = s.dropout;
      for (int64_t j = 0; j < visible; ++j) {
        const float weight = drop.active() ? (p[j] * inv) * drop.factor(e, i, j) : p[j] * inv;
        axpy(weight, row(v, e, j), o, s.dv);
      }
      lse[e * s.tq + i] = m + static_cast<float>(std::log(sum));
    }
  });
}

void attention_backward(const AttentionShape& s, const RowMatrices& q, const RowMatrices& k,
                        const RowMatrices& v, const RowMatrices& grad_out, const float* lse,
                        float* dq, float* dk, float* dv, const float* delta_in) {
  for_each_entry(s, [&](int64_t e, float* scratch) {
    float* p = scratch;
    float* dp = scratch + std::max<int64_t>(s.tk, 1);
    float* factor = dp + std::max<int64_t>(s.tk, 1);
    float* dk_e = dk + e * s.tk * s.d;
    float* dv_e = dv + e * s.tk * s.dv;
    std::fill(dk_e, dk_e + s.tk * s.d, 0.0f);
    std::fill(dv_e, dv_e + s.tk * s.dv, 0.0f);
    for (int64_t i = 0; i < s.tq; ++i) {
      float* dq_i = dq + (e * s.tq + i) * s.d;
      std::fill(dq_i, dq_i + s.d, 0.0f);
      const float l = lse[e * s.tq + i];
      const int64_t visible = visible_keys(s, i);
      if (l == kNegInf || visible == 0) continue;  // a row that saw no key: its gradients are 0
      const float* qi = row(q, e, i);
      const float* gi = row(grad_out, e, i);
      const AttentionDropoutMask& drop = s.dropout;
      double rowsum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        p[j] = std::exp(dot(qi, row(k, e, j), s.d) * s.scale - l);
        dp[j] = dot(gi, row(v, e, j), s.dv);
        if (drop.active()) {  // dP of the dropped probabilities, and P as P V used it
          factor[j] = drop.factor(e, i, j);
          dp[j] *= factor[j];
        }
        rowsum += static_cast<double>(p[j]) * dp[j];
      }
      const float delta = delta_in != nullptr ? delta_in[e * s.tq + i] : static_cast<float>(rowsum);
      for (int64_t j = 0; j < visible; ++j) {
        const float ds = p[j] * (dp[j] - delta) * s.scale;
        axpy(ds, row(k, e, j), dq_i, s.d);
        axpy(ds, qi, dk_e + j * s.d, s.d);
        axpy(drop.active() ? p[j] * factor[j] : p[j], gi, dv_e + j * s.dv, s.dv);
      }
    }
  });
}

}  // namespace loom::cpu
