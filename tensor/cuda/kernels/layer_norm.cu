#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// One block per row: the mean, then the biased variance around it (two passes, no cancellation).
__global__ void layer_norm_kernel(float* out, float* mean, float* rstd, const float* x,
                                  const float* w, const float* b, int64_t rows, int64_t n,
                                  float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += xr[j];
    const float mu = block_sum(sum) / static_cast<float>(n);
    float sq = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float d = xr[j] - mu;
      sq += d * d;
    }
    const float var = block_sum(sq) / static_cast<float>(n);
    const float s = 1.0f / sqrtf(var + eps);
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = s;
    }
    float* orow = out + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float y = (xr[j] - mu) * s;
      if (w != nullptr) y *= w[j];
      if (b != nullptr) y += b[j];
      orow[j] = y;
    }
  }
}

// dx = rstd * (g' - mean(g') - xhat * mean(g' * xhat)), g' = g * w; one block per row.
__global__ void layer_norm_grad_x_kernel(float* grad_x, const float* g, const float* x,
                                         const float* mean, const float* rstd, const float* w,
                                         int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* gr = g + r * n;
    const float* xr = x + r * n;
    const float m = mean[r], s = rstd[r];
    float sum_gw = 0.0f, sum_gw_xhat = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      sum_gw += gw;
      sum_gw_xhat += gw * (xr[j] - m) * s;
    }
    const float a = block_sum(sum_gw) / static_cast<float>(n);
    const float c = block_sum(sum_gw_xhat) / static_cast<float>(n);
    float* dr = grad_x + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      dr[j] = s * (gw - a - (xr[j] - m) * s * c);
    }
  }
}

// grad_w[j] = sum_r g[r, j] * xhat[r, j], grad_b[j] = sum_r g[r, j]: one thread per column.
__global__ void layer_norm_grad_affine_kernel(float* grad_w, float* grad_b, const float* g,
                                              const float* x, const float* mean, const float* rstd,
                                              int64_t rows, int64_t n) {
  LOOM_GRID_STRIDE(j, n) {
    float acc_w = 0.0f, acc_b = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float gv = g[r * n + j];
      acc_w += gv * (x[r * n + j] - mean[r]) * rstd[r];
      acc_b += gv;
    }
    grad_w[j] = acc_w;
    grad_b[j] = acc_b;
  }
}

}  // namespace

void layer_norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, int64_t rows, int64_t n, float eps, int device) {
  if (rows == 0) return;
  layer_norm_kernel<<<grid_for_rows(rows), kThreads, 0, compute_stream(device)>>>(
      out, mean, rstd, x, w, b, rows, n, eps);
  check_launch("layer_norm_kernel", device);
}

void layer_norm_backward(float* grad_x, float* grad_w, float* grad_b, const float* grad_out,
                         const float* x, const float* mean, const float* rstd, const float* w,
                         int64_t rows, int64_t n, int device) {
  const cudaStream_t stream = compute_stream(device);
  if (rows > 0) {
    layer_norm_grad_x_kernel<<<grid_for_rows(rows), kThreads, 0, stream>>>(grad_x, grad_out, x,
                                                                           mean, rstd, w, rows, n);
    check_launch("layer_norm_grad_x_kernel", device);
  }
  if (w != nullptr && n > 0) {
    layer_norm_grad_affine_kernel<<<grid_for(n), kThreads, 0, stream>>>(grad_w, grad_b, grad_out, x,
                                                                        mean, rstd, rows, n);
    check_launch("layer_norm_grad_affine_kernel", device);
  }
}

}  // namespace loom::cuda::kernels
