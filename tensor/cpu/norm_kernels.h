// Layer norm and RMS norm over the last dim of contiguous f32 rows, forward and backward:
// vectorized (AVX-512 and AVX2 clones, as vector_math.h) and threaded over rows (parallel.h).
// Statistics and dot products accumulate in f64 vector lanes. The weight and bias gradients sum
// over rows in fixed blocks of rows (a count that depends only on `rows`), then the blocks in
// order, so every value is the same on any thread count.
//
// Pointers: w and b may be null (no affine); then dw / db are not written.
#pragma once

#include <cstdint>

namespace loom::cpu {

// y = (x - mean) * rstd * w + b per row; mean and rstd (1 / sqrt(biased var + eps)) per row.
void layer_norm_forward_f32(const float* x, const float* w, const float* b, float* y, float* mean,
                            float* rstd, int64_t rows, int64_t n, double eps);
// dx = rstd * (g' - mean(g') - xhat * mean(g' * xhat)), g' = g * w; dw = sum g * xhat; db = sum g.
void layer_norm_backward_f32(const float* g, const float* x, const float* mean, const float* rstd,
                             const float* w, float* dx, float* dw, float* db, int64_t rows,
                             int64_t n);

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) per row.
void rms_norm_forward_f32(const float* x, const float* w, float* y, float* rstd, int64_t rows,
                          int64_t n, double eps);
// dx = rstd * (g' - xhat * mean(g' * xhat)), g' = g * w; dw = sum g * xhat.
void rms_norm_backward_f32(const float* g, const float* x, const float* rstd, const float* w,
                           float* dx, float* dw, int64_t rows, int64_t n);

}  // namespace loom::cpu
