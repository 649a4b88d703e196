#include "tensor/cpu/norm_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/parallel.h"

namespace loom::cpu {

namespace {

// Rows per thread chunk: enough work per chunk that a parallel region pays.
int64_t row_grain(int64_t n) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1));
}

// Rows per block of the weight-gradient sums: at most 256 blocks, at least 16 rows each.
int64_t rows_per_block(int64_t rows) { return std::max<int64_t>(16, (rows + 255) / 256); }

#define LOOM_CLONES __attribute__((target_clones("avx512f", "default")))

LOOM_CLONES void layer_norm_rows(const float* x, const float* w, const float* b, float* y,
                                 float* mean, float* rstd, int64_t begin, int64_t end, int64_t n,
                                 double eps) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    // Two passes in f64: the mean, then the biased variance around it (no cancellation).
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(xr[j]);
    const double mu = n > 0 ? sum / static_cast<double>(n) : 0.0;
    double sq = 0.0;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < n; ++j) {
      const double d = static_cast<double>(xr[j]) - mu;
      sq += d * d;
    }
    const double var = n > 0 ? sq / static_cast<double>(n) : 0.0;
    const float m = static_cast<float>(mu);
    const float s = static_cast<float>(1.0 / std::sqrt(var + eps));
    mean[r] = m;
    rstd[r] = s;
    if (w != nullptr && b != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
    } else if (w != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) * s * w[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) * s;
    }
  }
}

// Rows [begin, end): dx, and (with w) this block's sums of g * xhat and g into dw_acc / db_acc.
LOOM_CLONES void layer_norm_backward_rows(const float* g, const float* x, const float* mean,
                                          const float* rstd, const float* w, float* dx,
                                          double* dw_acc, double* db_acc, int64_t begin,
                                          int64_t end, int64_t n) {
  for (int64_t r = begin; r < end; ++r) {
    const float* gr = g + r * n;
    const float* xr = x + r * n;
    float* dr = dx + r * n;
    const float m = mean[r], s = rstd[r];
    double sum_gw = 0.0, sum_gw_xhat = 0.0;
#pragma omp simd reduction(+ : sum_gw, sum_gw_xhat)
    for (int64_t j = 0; j < n; ++j) {
      const float xhat = (xr[j] - m) * s;
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      sum_gw += static_cast<double>(gw);
      sum_gw_xhat += static_cast<double>(gw) * static_cast<double>(xhat);
    }
    const float a = static_cast<float>(sum_gw / static_cast<double>(n));
    const float bb = static_cast<float>(sum_gw_xhat / static_cast<double>(n));
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float xhat = (xr[j] - m) * s;
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      dr[j] = s * (gw - a - xhat * bb);
    }
    if (w != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const float xhat = (xr[j] - m) * s;
        dw_acc[j] += static_cast<double>(gr[j]) * static_cast<double>(xhat);
        db_acc[j] += static_cast<double>(gr[j]);
      }
    }
  }
}

LOOM_CLONES void rms_norm_rows(const float* x, const float* w, float* y, float* rstd, int64_t begin,
                               int64_t end, int64_t n, double eps) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sq = 0.0;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < n; ++j) sq += static_cast<double>(xr[j]) * static_cast<double>(xr[j]);
    const float s = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
    rstd[r] = s;
    if (w != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * s * w[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * s;
    }
  }
}

LOOM_CLONES void rms_norm_backward_rows(const float* g, const float* x, const float* rstd,
                                        const float* w, float* dx, double* dw_acc, int64_t begin,
                                        int64_t end, int64_t n) {
  for (int64_t r = begin; r < end; ++r) {
    const float* gr = g + r * n;
    const float* xr = x + r * n;
    float* dr = dx + r * n;
    const float s = rstd[r];
    double dot = 0.0;  // sum of g' * xhat
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) {
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      dot += static_cast<double>(gw) * static_cast<double>(xr[j] * s);
    }
    const float m = static_cast<float>(dot / static_cast<double>(n));
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      dr[j] = s * (gw - xr[j] * s * m);
    }
    if (w != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        dw_acc[j] += static_cast<double>(gr[j]) * static_cast<double>(xr[j] * s);
      }
    }
  }
}

#undef LOOM_CLONES

// Runs rows(block_begin, block_end, acc_w, acc_b) over fixed blocks of rows, threaded, each
// block into its own f64 accumulators; then adds the blocks in order into dw / db (f32).
template <typename Rows>
void blocked_rows(int64_t rows, int64_t n, float* dw, float* db, const Rows& body) {
  const int64_t per_block = rows_per_block(rows);
  const int64_t blocks = (rows + per_block - 1) / per_block;
  const bool with_acc = dw != nullptr;
  std::vector<double> acc(with_acc ? static_cast<size_t>(blocks * n * 2) : 0, 0.0);
  parallel_for(blocks, std::max<int64_t>(1, row_grain(n) / per_block), 1,
               [&](int64_t begin, int64_t end) {
                 for (int64_t blk = begin; blk < end; ++blk) {
                   double* aw = with_acc ? acc.data() + blk * n * 2 : nullptr;
                   body(blk * per_block, std::min(rows, (blk + 1) * per_block), aw,
                        aw != nullptr ? aw + n : nullptr);
                 }
               });
  if (!with_acc) return;
  for (int64_t j = 0; j < n; ++j) {
    double sw = 0.0, sb = 0.0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += acc[blk * n * 2 + j];
      sb += acc[blk * n * 2 + n + j];
    }
    dw[j] = static_cast<float>(sw);
    if (db != nullptr) db[j] = static_cast<float>(sb);
  }
}

}  // namespace

void layer_norm_forward_f32(const float* x, const float* w, const float* b, float* y, float* mean,
                            float* rstd, int64_t rows, int64_t n, double eps) {
  parallel_for(rows, row_grain(n), 1, [&](int64_t begin, int64_t end) {
    layer_norm_rows(x, w, b, y, mean, rstd, begin, end, n, eps);
  });
}

void layer_norm_backward_f32(const float* g, const float* x, const float* mean, const float* rstd,
                             const float* w, float* dx, float* dw, float* db, int64_t rows,
                             int64_t n) {
  blocked_rows(rows, n, w != nullptr ? dw : nullptr, db,
               [&](int64_t begin, int64_t end, double* aw, double* ab) {
                 layer_norm_backward_rows(g, x, mean, rstd, w, dx, aw, ab, begin, end, n);
               });
}

void rms_norm_forward_f32(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                          int64_t n, double eps) {
  parallel_for(rows, row_grain(n), 1, [&](int64_t begin, int64_t end) {
    rms_norm_rows(x, w, y, rstd, begin, end, n, eps);
  });
}

void rms_norm_backward_f32(const float* g, const float* x, const float* rstd, const float* w,
                           float* dx, float* dw, int64_t rows, int64_t n) {
  blocked_rows(rows, n, w != nullptr ? dw : nullptr, nullptr,
               [&](int64_t begin, int64_t end, double* aw, double*) {
                 rms_norm_backward_rows(g, x, rstd, w, dx, aw, begin, end, n);
               });
}

}  // namespace loom::cpu
