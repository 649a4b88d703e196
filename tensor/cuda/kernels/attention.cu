#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Keys query i may see, 0..visible_keys - 1: all, or j <= i + offset when causal (as the CPU
// kernel), clamped to [0, tk].
__device__ __forceinline__ int64_t visible_keys(int64_t i, int64_t tk, bool causal,
                                                int64_t offset) {
  if (!causal) return tk;
  const int64_t n = i + 1 + offset;
  return n < 0 ? 0 : (n < tk ? n : tk);
}

// One block per score row: probabilities in place and the row's logsumexp, or (from_lse) the
// probabilities recomputed from a saved logsumexp. Masked keys get 0.
__global__ void attention_probs_kernel(float* p, float* lse, int64_t total_rows, int64_t tq,
                                       int64_t tk, float scale, bool causal, int64_t offset,
                                       bool from_lse) {
  for (int64_t r = blockIdx.x; r < total_rows; r += gridDim.x) {
    float* pr = p + r * tk;
    int64_t visible = visible_keys(r % tq, tk, causal, offset);
    if (from_lse) {
      const float l = lse[r];
      if (l == -INFINITY) visible = 0;
      for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) {
        pr[j] = j < visible ? expf(pr[j] * scale - l) : 0.0f;
      }
      continue;
    }
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, pr[j] * scale);
    m = block_max(m);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      const float e = expf(pr[j] * scale - m);
      pr[j] = e;
      sum += e;
    }
    sum = block_sum(sum);
    const float inv = visible > 0 ? 1.0f / sum : 0.0f;
    for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) pr[j] = j < visible ? pr[j] * inv : 0.0f;
    if (threadIdx.x == 0) lse[r] = visible > 0 ? m + logf(sum) : -INFINITY;
  }
}

// delta, when not null, gives each row's sum instead of rowsum(P * dP) over these keys.
__global__ void attention_grad_scores_kernel(float* dp, const float* p, int64_t total_rows,
                                             int64_t tk, float scale, const float* delta) {
  for (int64_t r = blockIdx.x; r < total_rows; r += gridDim.x) {
    const float* pr = p + r * tk;
    float* dr = dp + r * tk;
    float dot = 0.0f;
    if (delta != nullptr) {
      dot = delta[r];  // uniform over the block: every thread skips block_sum together
    } else {
      for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) dot += pr[j] * dr[j];
      dot = block_sum(dot);
    }
    for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) dr[j] = pr[j] * (dr[j] - dot) * scale;
  }
}

__global__ void attention_dropout_scale_kernel(float* values, int64_t total, int64_t tq, int64_t tk,
                                               AttentionDropoutMask mask) {
  LOOM_GRID_STRIDE(x, total) {
    const int64_t row = x / tk, j = x % tk;
    values[x] *= mask.factor(row / tq, row % tq, j);
  }
}

}  // namespace

void attention_dropout_scale(float* values, int64_t rows, int64_t tq, int64_t tk,
                             const AttentionDropoutMask& mask, int device) {
  const int64_t total = rows * tq * tk;
  if (total == 0 || !mask.active()) return;
  attention_dropout_scale_kernel<<<grid_for(total), kThreads, 0, compute_stream(device)>>>(
      values, total, tq, tk, mask);
  check_launch("attention_dropout_scale_kernel", device);
}

void attention_probs(float* scores, float* lse, int64_t rows, int64_t tq, int64_t tk, float scale,
                     bool causal, int64_t causal_offset, bool from_lse, int device) {
  const int64_t total = rows * tq;
  if (total == 0) return;
  attention_probs_kernel<<<grid_for_rows(total), kThreads, 0, compute_stream(device)>>>(
      scores, lse, total, tq, tk, scale, causal, causal_offset, from_lse);
  check_launch("attention_probs_kernel", device);
}

void attention_grad_scores(float* dp, const float* probs, int64_t rows, int64_t tk, float scale,
                           int device, const float* delta) {
  if (rows == 0 || tk == 0) return;
  attention_grad_scores_kernel<<<grid_for_rows(rows), kThreads, 0, compute_stream(device)>>>(
      dp, probs, rows, tk, scale, delta);
  check_launch("attention_grad_scores_kernel", device);
}

}  // namespace loom::cuda::kernels
