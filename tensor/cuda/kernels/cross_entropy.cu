#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// One block per row of logits (in their own dtype T, read as f32): max-subtracted logsumexp,
// then the row's loss.
template <typename T>
__global__ void cross_entropy_kernel(float* lse, float* losses, const T* logits,
                                     const int64_t* targets, int64_t n, int64_t v,
                                     int64_t ignore_index) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = logits + r * v;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, load(xr + j));
    m = block_max(m);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(load(xr + j) - m);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
      const float l = v == 0 ? m : m + logf(sum);
      lse[r] = l;
      const int64_t t = targets[r];
      losses[r] = t == ignore_index ? 0.0f : l - load(xr + t);
    }
  }
}

// The gradient in the logits' dtype T, each element computed in f32 and rounded once: the
// classifier's gradient is written once, never as an f32 copy to convert.
template <typename T>
__global__ void cross_entropy_backward_kernel(T* grad, const T* logits, const float* lse,
                                              const int64_t* targets, const float* grad_loss,
                                              int64_t n, int64_t v, int64_t ignore_index,
                                              int reduction, int64_t count) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t t = targets[r];
    float scale = 0.0f;
    if (t != ignore_index) {
      scale = reduction == 0   ? grad_loss[r]
              : reduction == 2 ? grad_loss[0]
                               : static_cast<float>(static_cast<double>(grad_loss[0]) / count);
    }
    const T* xr = logits + r * v;
    T* dr = grad + r * v;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      float d = t == ignore_index ? 0.0f : expf(load(xr + j) - lse[r]) * scale;
      if (j == t) d -= scale;
      dr[j] = convert<T>(d);
    }
  }
}

}  // namespace

void cross_entropy_forward(DType dtype, float* lse, float* losses, const void* logits,
                           const int64_t* targets, int64_t n, int64_t v, int64_t ignore_index,
                           int device) {
  if (n == 0) return;
  visit_floating(dtype, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<grid_for_rows(n), kThreads, 0, compute_stream(device)>>>(
        lse, losses, static_cast<const T*>(logits), targets, n, v, ignore_index);
  });
  check_launch("cross_entropy_kernel", device);
}

void cross_entropy_backward(DType dtype, void* grad, const void* logits, const float* lse,
                            const int64_t* targets, const float* grad_loss, int64_t n, int64_t v,
                            int64_t ignore_index, int reduction, int64_t count, int device) {
  if (n == 0) return;
  visit_floating(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<grid_for_rows(n), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(grad), static_cast<const T*>(logits), lse, targets, grad_loss, n, v,
        ignore_index, reduction, count);
  });
  check_launch("cross_entropy_backward_kernel", device);
}

}  // namespace loom::cuda::kernels
