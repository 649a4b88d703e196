#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Every kernel reads and writes the tensors' own dtype T (f32, bf16, f16: activations, weights
// and gradients alike) and computes in f32: one rounding per output, as the CPU kernels' f32
// staging gives, with no f32 copy of a bf16 tensor in between.

// One block per row: the mean, then the biased variance around it (two passes, no cancellation).
template <typename T>
__global__ void layer_norm_kernel(T* out, float* mean, float* rstd, const T* x, const T* w,
                                  const T* b, int64_t rows, int64_t n, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += load(xr + j);
    const float mu = block_sum(sum) / static_cast<float>(n);
    float sq = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float d = load(xr + j) - mu;
      sq += d * d;
    }
    const float var = block_sum(sq) / static_cast<float>(n);
    const float s = 1.0f / sqrtf(var + eps);
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = s;
    }
    T* orow = out + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      float y = (load(xr + j) - mu) * s;
      if (w != nullptr) y *= load(w + j);
      if (b != nullptr) y += load(b + j);
      orow[j] = convert<T>(y);
    }
  }
}

// dx = rstd * (g' - mean(g') - xhat * mean(g' * xhat)), g' = g * w; one block per row.
template <typename T>
__global__ void layer_norm_grad_x_kernel(T* grad_x, const T* g, const T* x, const float* mean,
                                         const float* rstd, const T* w, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const float m = mean[r], s = rstd[r];
    float sum_gw = 0.0f, sum_gw_xhat = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? load(gr + j) * load(w + j) : load(gr + j);
      sum_gw += gw;
      sum_gw_xhat += gw * (load(xr + j) - m) * s;
    }
    const float a = block_sum(sum_gw) / static_cast<float>(n);
    const float c = block_sum(sum_gw_xhat) / static_cast<float>(n);
    T* dr = grad_x + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? load(gr + j) * load(w + j) : load(gr + j);
      dr[j] = convert<T>(s * (gw - a - (load(xr + j) - m) * s * c));
    }
  }
}

// grad_w[j] = sum_r g[r, j] * xhat[r, j], grad_b[j] = sum_r g[r, j] (f32): one thread per column.
template <typename T>
__global__ void layer_norm_grad_affine_kernel(float* grad_w, float* grad_b, const T* g, const T* x,
                                              const float* mean, const float* rstd, int64_t rows,
                                              int64_t n) {
  LOOM_GRID_STRIDE(j, n) {
    float acc_w = 0.0f, acc_b = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float gv = load(g + r * n + j);
      acc_w += gv * (load(x + r * n + j) - mean[r]) * rstd[r];
      acc_b += gv;
    }
    grad_w[j] = acc_w;
    grad_b[j] = acc_b;
  }
}

}  // namespace

void layer_norm_forward(DType dtype, void* out, float* mean, float* rstd, const void* x,
                        const void* w, const void* b, int64_t rows, int64_t n, float eps,
                        int device) {
  if (rows == 0) return;
  visit_floating(dtype, "layer_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    layer_norm_kernel<T><<<grid_for_rows(rows), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), mean, rstd, static_cast<const T*>(x), static_cast<const T*>(w),
        static_cast<const T*>(b), rows, n, eps);
  });
  check_launch("layer_norm_kernel", device);
}

void layer_norm_backward(DType dtype, void* grad_x, float* grad_w, float* grad_b,
                         const void* grad_out, const void* x, const float* mean, const float* rstd,
                         const void* w, int64_t rows, int64_t n, int device) {
  const cudaStream_t stream = compute_stream(device);
  visit_floating(dtype, "layer_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0) {
      layer_norm_grad_x_kernel<T><<<grid_for_rows(rows), kThreads, 0, stream>>>(
          static_cast<T*>(grad_x), static_cast<const T*>(grad_out), static_cast<const T*>(x), mean,
          rstd, static_cast<const T*>(w), rows, n);
      check_launch("layer_norm_grad_x_kernel", device);
    }
    if (w != nullptr && n > 0) {
      layer_norm_grad_affine_kernel<T>
          <<<grid_for(n), kThreads, 0, stream>>>(grad_w, grad_b, static_cast<const T*>(grad_out),
                                                 static_cast<const T*>(x), mean, rstd, rows, n);
      check_launch("layer_norm_grad_affine_kernel", device);
    }
  });
}

}  // namespace loom::cuda::kernels
