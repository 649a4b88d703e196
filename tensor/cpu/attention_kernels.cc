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

// Splits `count` entries over the threads, one entry per call of body(entry, scratch), with
// three rows of tk floats of scratch and `extra` floats after them.
template <typename Body>
void for_each_entry(const AttentionShape& s, int64_t count, const Body& body, int64_t extra = 0) {
  parallel_for(count, /*grain=*/1, /*align=*/1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(3 * std::max<int64_t>(s.tk, 1) + extra));
    for (int64_t e = begin; e < end; ++e) body(e, scratch.data());
  });
}

// The keep factors of keys 0..count-1 of row (e, i) into out: one Philox block each, in a loop
// of independent iterations that the compiler vectorizes (eight or sixteen blocks per step),
// where one call per key inside the row's other work does not.
void row_factors(const AttentionDropoutMask& mask, int64_t e, int64_t i, int64_t count,
                 float* out) {
  const auto first = static_cast<uint64_t>(mask.row_index(e, i));
  const uint64_t seed = mask.seed;  // locals: no load inside the loop for it to guard
  const uint32_t threshold = mask.threshold;
  const float rescale = mask.rescale;
#pragma omp simd
  for (int64_t j = 0; j < count; ++j) {
    out[j] = philox::keep(seed, first + static_cast<uint64_t>(j), threshold) ? rescale : 0.0f;
  }
}

}  // namespace

void attention_forward(const AttentionShape& s, const RowMatrices& q, const RowMatrices& k,
                       const RowMatrices& v, float* out, float* lse) {
  for_each_entry(s, s.entries, [&](int64_t e, float* p) {
    float* factor = p + std::max<int64_t>(s.tk, 1);  // the row's dropout factors
    const int64_t kv = e / s.group;
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
        p[j] = dot(qi, row(k, kv, j), s.d) * s.scale;
        m = std::max(m, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      const auto inv = static_cast<float>(1.0 / sum);
      const AttentionDropoutMask& drop = s.dropout;
      if (drop.active()) row_factors(drop, e, i, visible, factor);
      for (int64_t j = 0; j < visible; ++j) {
        const float weight = drop.active() ? (p[j] * inv) * factor[j] : p[j] * inv;
        axpy(weight, row(v, kv, j), o, s.dv);
      }
      lse[e * s.tq + i] = m + static_cast<float>(std::log(sum));
    }
  });
}

namespace {

// The backward of query entry e, whose keys and values are key/value entry kv: its dq rows
// written, its dk and dv parts added into dk_e and dv_e. `scratch`: three rows of tk floats.
void entry_backward(const AttentionShape& s, const RowMatrices& q, const RowMatrices& k,
                    const RowMatrices& v, const RowMatrices& grad_out, const float* lse,
                    const float* delta_in, int64_t e, int64_t kv, float* dq, float* dk_e,
                    float* dv_e, float* scratch) {
  float* p = scratch;
  float* dp = scratch + std::max<int64_t>(s.tk, 1);
  float* factor = dp + std::max<int64_t>(s.tk, 1);
  const AttentionDropoutMask& drop = s.dropout;
  for (int64_t i = 0; i < s.tq; ++i) {
    float* dq_i = dq + (e * s.tq + i) * s.d;
    std::fill(dq_i, dq_i + s.d, 0.0f);
    const float l = lse[e * s.tq + i];
    const int64_t visible = visible_keys(s, i);
    if (l == kNegInf || visible == 0) continue;  // a row that saw no key: its gradients are 0
    const float* qi = row(q, e, i);
    const float* gi = row(grad_out, e, i);
    // dP of the dropped probabilities, and P as P V used it.
    if (drop.active()) row_factors(drop, e, i, visible, factor);
    double rowsum = 0.0;
    for (int64_t j = 0; j < visible; ++j) {
      p[j] = std::exp(dot(qi, row(k, kv, j), s.d) * s.scale - l);
      dp[j] = dot(gi, row(v, kv, j), s.dv);
      if (drop.active()) dp[j] *= factor[j];
      rowsum += static_cast<double>(p[j]) * dp[j];
    }
    const float delta = delta_in != nullptr ? delta_in[e * s.tq + i] : static_cast<float>(rowsum);
    for (int64_t j = 0; j < visible; ++j) {
      const float ds = p[j] * (dp[j] - delta) * s.scale;
      axpy(ds, row(k, kv, j), dq_i, s.d);
      axpy(ds, qi, dk_e + j * s.d, s.d);
      axpy(drop.active() ? p[j] * factor[j] : p[j], gi, dv_e + j * s.dv, s.dv);
    }
  }
}

}  // namespace

void attention_backward(const AttentionShape& s, const RowMatrices& q, const RowMatrices& k,
                        const RowMatrices& v, const RowMatrices& grad_out, const float* lse,
                        float* dq, float* dk, float* dv, const float* delta_in) {
  // One key/value entry per call, with the query entries of its group in turn. The group's first
  // query entry accumulates straight into dk and dv; each later one into scratch that is then
  // added, so dk and dv are the query heads' sums in head order (what summing the gradients of
  // k and v repeated per query head gives).
  const int64_t kv_size = s.tk * (s.d + s.dv);
  const int64_t rows = 3 * std::max<int64_t>(s.tk, 1);
  for_each_entry(
      s, s.entries / s.group,
      [&](int64_t kv, float* scratch) {
        float* dk_kv = dk + kv * s.tk * s.d;
        float* dv_kv = dv + kv * s.tk * s.dv;
        std::fill(dk_kv, dk_kv + s.tk * s.d, 0.0f);
        std::fill(dv_kv, dv_kv + s.tk * s.dv, 0.0f);
        entry_backward(s, q, k, v, grad_out, lse, delta_in, kv * s.group, kv, dq, dk_kv, dv_kv,
                       scratch);
        float* const part = scratch + rows;  // a later head's dk, then dv
        for (int64_t h = 1; h < s.group; ++h) {
          std::fill(part, part + kv_size, 0.0f);
          entry_backward(s, q, k, v, grad_out, lse, delta_in, kv * s.group + h, kv, dq, part,
                         part + s.tk * s.d, scratch);
          axpy(1.0f, part, dk_kv, s.tk * s.d);
          axpy(1.0f, part + s.tk * s.d, dv_kv, s.tk * s.dv);
        }
      },
      s.group > 1 ? kv_size : 0);
}

}  // namespace loom::cpu
