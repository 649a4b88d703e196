#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// One block per row: the mean square, then the scaled row (the CPU kernel's recipe; it sums in
// f64, this in f32 by a block tree).
__global__ void rms_norm_kernel(float* out, float* rstd, const float* x, const float* w,
                                int64_t rows, int64_t n, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * n;
    float sq = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sq += xr[j] * xr[j];
    const float s = 1.0f / sqrtf(block_sum(sq) / static_cast<float>(n) + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    float* orow = out + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      orow[j] = w != nullptr ? xr[j] * s * w[j] : xr[j] * s;
    }
  }
}

// dx = rstd * (g' - xhat * mean(g' * xhat)), g' = g * w; one block per row.
__global__ void rms_norm_grad_x_kernel(float* grad_x, const float* g, const float* x,
                                       const float* rstd, const float* w, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* gr = g + r * n;
    const float* xr = x + r * n;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      dot += gw * xr[j] * s;
    }
    const float m = block_sum(dot) / static_cast<float>(n);
    float* dr = grad_x + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? gr[j] * w[j] : gr[j];
      dr[j] = s * (gw - xr[j] * s * m);
    }
  }
}

// grad_w[j] = sum_r g[r, j] * x[r, j] * rstd[r]: one thread per column.
__global__ void rms_norm_grad_weight_kernel(float* grad_w, const float* g, const float* x,
                                            const float* rstd, int64_t rows, int64_t n) {
  LOOM_GRID_STRIDE(j, n) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r) acc += g[r * n + j] * x[r * n + j] * rstd[r];
    grad_w[j] = acc;
  }
}

}  // namespace

void rms_norm_forward(float* out, float* rstd, const float* x, const float* w, int64_t rows,
                      int64_t n, float eps, int device) {
  if (rows == 0) return;
  rms_norm_kernel<<<grid_for_rows(rows), kThreads, 0, compute_stream(device)>>>(out, rstd, x, w,
                                                                                rows, n, eps);
  check_launch("rms_norm_kernel", device);
}

void rms_norm_backward(float* grad_x, float* grad_w, const float* grad_out, const float* x,
                       const float* rstd, const float* w, int64_t rows, int64_t n, int device) {
  const cudaStream_t stream = compute_stream(device);
  if (rows > 0) {
    rms_norm_grad_x_kernel<<<grid_for_rows(rows), kThreads, 0, stream>>>(grad_x, grad_out, x, rstd,
                                                                         w, rows, n);
    check_launch("rms_norm_grad_x_kernel", device);
  }
  if (w != nullptr && n > 0) {
    rms_norm_grad_weight_kernel<<<grid_for(n), kThreads, 0, stream>>>(grad_w, grad_out, x, rstd,
                                                                      rows, n);
    check_launch("rms_norm_grad_weight_kernel", device);
  }
}

}  // namespace loom::cuda::kernels
