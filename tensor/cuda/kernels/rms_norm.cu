#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Every kernel reads and writes the tensors' own dtype T and computes in f32 (layer_norm.cu).

// One block per row: the mean square, then the scaled row (the CPU kernel's recipe; it sums in
// f64, this in f32 by a block tree).
template <typename T>
__global__ void rms_norm_kernel(T* out, float* rstd, const T* x, const T* w, int64_t rows,
                                int64_t n, float eps) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    float sq = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = load(xr + j);
      sq += v * v;
    }
    const float s = 1.0f / sqrtf(block_sum(sq) / static_cast<float>(n) + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    T* orow = out + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float y = load(xr + j) * s;
      orow[j] = convert<T>(w != nullptr ? y * load(w + j) : y);
    }
  }
}

// dx = rstd * (g' - xhat * mean(g' * xhat)), g' = g * w; one block per row.
template <typename T>
__global__ void rms_norm_grad_x_kernel(T* grad_x, const T* g, const T* x, const float* rstd,
                                       const T* w, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gr = g + r * n;
    const T* xr = x + r * n;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? load(gr + j) * load(w + j) : load(gr + j);
      dot += gw * load(xr + j) * s;
    }
    const float m = block_sum(dot) / static_cast<float>(n);
    T* dr = grad_x + r * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float gw = w != nullptr ? load(gr + j) * load(w + j) : load(gr + j);
      dr[j] = convert<T>(s * (gw - load(xr + j) * s * m));
    }
  }
}

// grad_w[j] = sum_r g[r, j] * x[r, j] * rstd[r] (f32): one thread per column.
template <typename T>
__global__ void rms_norm_grad_weight_kernel(float* grad_w, const T* g, const T* x,
                                            const float* rstd, int64_t rows, int64_t n) {
  LOOM_GRID_STRIDE(j, n) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r) acc += load(g + r * n + j) * load(x + r * n + j) * rstd[r];
    grad_w[j] = acc;
  }
}

}  // namespace

void rms_norm_forward(DType dtype, void* out, float* rstd, const void* x, const void* w,
                      int64_t rows, int64_t n, float eps, int device) {
  if (rows == 0) return;
  visit_floating(dtype, "rms_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<grid_for_rows(rows), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), rstd, static_cast<const T*>(x), static_cast<const T*>(w), rows, n,
        eps);
  });
  check_launch("rms_norm_kernel", device);
}

void rms_norm_backward(DType dtype, void* grad_x, float* grad_w, const void* grad_out,
                       const void* x, const float* rstd, const void* w, int64_t rows, int64_t n,
                       int device) {
  const cudaStream_t stream = compute_stream(device);
  visit_floating(dtype, "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    if (rows > 0) {
      rms_norm_grad_x_kernel<T><<<grid_for_rows(rows), kThreads, 0, stream>>>(
          static_cast<T*>(grad_x), static_cast<const T*>(grad_out), static_cast<const T*>(x), rstd,
          static_cast<const T*>(w), rows, n);
      check_launch("rms_norm_grad_x_kernel", device);
    }
    if (w != nullptr && n > 0) {
      rms_norm_grad_weight_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(
          grad_w, static_cast<const T*>(grad_out), static_cast<const T*>(x), rstd, rows, n);
      check_launch("rms_norm_grad_weight_kernel", device);
    }
  });
}

}  // namespace loom::cuda::kernels
