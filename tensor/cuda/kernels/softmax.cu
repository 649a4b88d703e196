#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Softmax and log-softmax along any dim, in the tensors' own dtype (nn.h).

// One block per row; row r = (o, i) starts at o * n * inner + i and steps by inner.
__device__ __forceinline__ int64_t row_start(RowShape s, int64_t r) {
  return (r / s.inner) * s.n * s.inner + r % s.inner;
}

// x and out of one dtype T (f32, bf16, f16), computed in f32 and each output rounded once.
template <typename T>
__global__ void softmax_kernel(T* out, const T* x, RowShape s, bool log) {
  for (int64_t r = blockIdx.x; r < s.outer * s.inner; r += gridDim.x) {
    const T* xr = x + row_start(s, r);
    T* orow = out + row_start(s, r);
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) m = fmaxf(m, load(xr + j * s.inner));
    m = block_max(m);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) sum += expf(load(xr + j * s.inner) - m);
    sum = block_sum(sum);
    if (log) {
      const float lse = m + logf(sum);
      for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x)
        orow[j * s.inner] = convert<T>(load(xr + j * s.inner) - lse);
    } else {
      const float inv = 1.0f / sum;
      for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) {
        orow[j * s.inner] = convert<T>(expf(load(xr + j * s.inner) - m) * inv);
      }
    }
  }
}

template <typename T>
__global__ void softmax_backward_kernel(T* grad_x, const T* g, const T* y, RowShape s, bool log) {
  for (int64_t r = blockIdx.x; r < s.outer * s.inner; r += gridDim.x) {
    const int64_t start = row_start(s, r);
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) {
      const int64_t at = start + j * s.inner;
      acc += log ? load(g + at) : load(g + at) * load(y + at);
    }
    acc = block_sum(acc);
    for (int64_t j = threadIdx.x; j < s.n; j += blockDim.x) {
      const int64_t at = start + j * s.inner;
      const float gj = load(g + at), yj = load(y + at);
      grad_x[at] = convert<T>(log ? gj - expf(yj) * acc : yj * (gj - acc));
    }
  }
}

}  // namespace

void softmax_forward(DType dtype, void* out, const void* x, RowShape s, bool log, int device) {
  if (s.outer * s.inner == 0 || s.n == 0) return;
  visit_floating(dtype, "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T><<<grid_for_rows(s.outer * s.inner), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), static_cast<const T*>(x), s, log);
  });
  check_launch("softmax_kernel", device);
}

void softmax_backward(DType dtype, void* grad_x, const void* grad_out, const void* out, RowShape s,
                      bool log, int device) {
  if (s.outer * s.inner == 0 || s.n == 0) return;
  visit_floating(dtype, "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<T>
        <<<grid_for_rows(s.outer * s.inner), kThreads, 0, compute_stream(device)>>>(
            static_cast<T*>(grad_x), static_cast<const T*>(grad_out), static_cast<const T*>(out), s,
            log);
  });
  check_launch("softmax_backward_kernel", device);
}

}  // namespace loom::cuda::kernels
