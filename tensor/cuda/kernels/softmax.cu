#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// One block per row; row r = (o, i) starts at o * n * inner + i and steps by inner.
__device__ __forceinline__ int64_t row_start(RowShape s, int64_t r) {
  return (r / s.inner) * s.n * s.inner + r % s.inner;
}

__global__ void softmax_kernel(float* out, const float* x, RowShape s, bool log) {
  for (int64_t r = blockIdx.x; r < s.outer * s.inner; r += gridDim.x) {
    const float* xr = x + row_start(s, r);
    float* orow = out + row_start(s, r);
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) m = fmaxf(m, xr[j * s.inner]);
    m = block_max(m);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) sum += expf(xr[j * s.inner] - m);
    sum = block_sum(sum);
    if (log) {
      const float lse = m + logf(sum);
      for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x)
        orow[j * s.inner] = xr[j * s.inner] - lse;
    } else {
      const float inv = 1.0f / sum;
      for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) {
        orow[j * s.inner] = expf(xr[j * s.inner] - m) * inv;
      }
    }
  }
}

__global__ void softmax_backward_kernel(float* grad_x, const float* g, const float* y, RowShape s,
                                        bool log) {
  for (int64_t r = blockIdx.x; r < s.outer * s.inner; r += gridDim.x) {
    const int64_t start = row_start(s, r);
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) {
      const int64_t at = start + j * s.inner;
      acc += log ? g[at] : g[at] * y[at];
    }
    acc = block_sum(acc);
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) {
      const int64_t at = start + j * s.inner;
      grad_x[at] = log ? g[at] - expf(y[at]) * acc : y[at] * (g[at] - acc);
    }
  }
}

}  // namespace

void softmax_forward(float* out, const float* x, RowShape s, bool log, int device) {
  if (s.outer * s.inner == 0 || s.n == 0) return;
  softmax_kernel<<<grid_for_rows(s.outer * s.inner), kThreads, 0, compute_stream(device)>>>(out, x,
                                                                                            s, log);
  check_launch("softmax_kernel", device);
}

void softmax_backward(float* grad_x, const float* grad_out, const float* out, RowShape s, bool log,
                      int device) {
  if (s.outer * s.inner == 0 || s.n == 0) return;
  softmax_backward_kernel<<<grid_for_rows(s.outer * s.inner), kThreads, 0,
                            compute_stream(device)>>>(grad_x, grad_out, out, s, log);
  check_launch("softmax_backward_kernel", device);
}

}  // namespace loom::cuda::kernels
