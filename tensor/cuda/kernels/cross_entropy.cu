#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// A target the row may have: a class 0..v-1, or ignore_index.
__device__ __forceinline__ bool valid_target(int64_t t, int64_t v, int64_t ignore_index) {
  return t == ignore_index || (t >= 0 && t < v);
}

// One block per row of logits (in their own dtype T, read as f32): max-subtracted logsumexp,
// then the row's loss. A target out of range is recorded in *first_bad and its loss is NaN.
// Logits holding classes [offset, offset + v) of `classes` (classes > 0: loss parallel) write
// this shard's part of the loss instead: -logits[r, t - offset] where the target is here, else 0.
template <typename T>
__global__ void cross_entropy_kernel(float* lse, float* losses, const T* logits,
                                     const int64_t* targets, int64_t n, int64_t v, int64_t offset,
                                     int64_t classes, int64_t ignore_index, int64_t* first_bad) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* xr = logits + r * v;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, load(xr + j));
    m = block_max(m);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(load(xr + j) - m);
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
      // An empty or all -inf row (a masked class shard) is -inf, as on the CPU, not NaN.
      const float l = m == -INFINITY ? m : m + logf(sum);
      lse[r] = l;
      const int64_t t = targets[r];
      if (!valid_target(t, classes > 0 ? classes : v, ignore_index)) {
        record_failure(first_bad, r);
        losses[r] = NAN;
      } else if (t == ignore_index) {
        losses[r] = 0.0f;
      } else if (classes > 0) {
        const int64_t here = t - offset;
        losses[r] = here >= 0 && here < v ? -load(xr + here) : 0.0f;
      } else {
        losses[r] = l - load(xr + t);
      }
    }
  }
}

// The number of targets that are not ignore_index, in one block (the mean's divisor, kept on
// the device so the host never reads the targets).
__global__ void count_targets_kernel(int64_t* count, const int64_t* targets, int64_t n,
                                     int64_t ignore_index) {
  unsigned long long own = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) own += targets[r] != ignore_index;
  own = block_sum(own);
  if (threadIdx.x == 0) *count = static_cast<int64_t>(own);
}

// x[0] /= count, in double as the CPU divides (0 / 0 is NaN there too).
__global__ void divide_by_count_kernel(float* x, const int64_t* count) {
  x[0] = static_cast<float>(static_cast<double>(x[0]) / static_cast<double>(*count));
}

// The gradient in the logits' dtype T, each element computed in f32 and rounded once: the
// classifier's gradient is written once, never as an f32 copy to convert. A target out of range
// is recorded in *first_bad and its row's gradient is NaN.
// Logits holding classes [offset, offset + v) of `classes` (loss parallel) take the one-hot only
// where the target's class is theirs.
template <typename T>
__global__ void cross_entropy_backward_kernel(T* grad, const T* logits, const float* lse,
                                              const int64_t* targets, const float* grad_loss,
                                              int64_t n, int64_t v, int64_t offset, int64_t classes,
                                              int64_t ignore_index, int reduction,
                                              const int64_t* count, int64_t* first_bad) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const int64_t t = targets[r];
    T* dr = grad + r * v;
    if (!valid_target(t, classes > 0 ? classes : v, ignore_index)) {
      if (threadIdx.x == 0) record_failure(first_bad, r);
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) dr[j] = convert<T>(NAN);
      continue;
    }
    float scale = 0.0f;
    if (t != ignore_index) {
      scale =
          reduction == 0 ? grad_loss[r]
          : reduction == 2
              ? grad_loss[0]
              : static_cast<float>(static_cast<double>(grad_loss[0]) / static_cast<double>(*count));
    }
    const T* xr = logits + r * v;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      float d = t == ignore_index ? 0.0f : expf(load(xr + j) - lse[r]) * scale;
      if (j + offset == t) d -= scale;
      dr[j] = convert<T>(d);
    }
  }
}

}  // namespace

void cross_entropy_forward(DType dtype, float* lse, float* losses, const void* logits,
                           const int64_t* targets, int64_t n, int64_t v, int64_t offset,
                           int64_t classes, int64_t ignore_index, int64_t* first_bad, int device) {
  if (n == 0) return;
  visit_floating(dtype, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<grid_for_rows(n), kThreads, 0, compute_stream(device)>>>(
        lse, losses, static_cast<const T*>(logits), targets, n, v, offset, classes, ignore_index,
        first_bad);
  });
  check_launch("cross_entropy_kernel", device);
}

void count_targets(int64_t* count, const int64_t* targets, int64_t n, int64_t ignore_index,
                   int device) {
  count_targets_kernel<<<1, kThreads, 0, compute_stream(device)>>>(count, targets, n, ignore_index);
  check_launch("count_targets_kernel", device);
}

void divide_by_count(float* x, const int64_t* count, int device) {
  divide_by_count_kernel<<<1, 1, 0, compute_stream(device)>>>(x, count);
  check_launch("divide_by_count_kernel", device);
}

void cross_entropy_backward(DType dtype, void* grad, const void* logits, const float* lse,
                            const int64_t* targets, const float* grad_loss, int64_t n, int64_t v,
                            int64_t offset, int64_t classes, int64_t ignore_index, int reduction,
                            const int64_t* count, int64_t* first_bad, int device) {
  if (n == 0) return;
  visit_floating(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<grid_for_rows(n), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(grad), static_cast<const T*>(logits), lse, targets, grad_loss, n, v, offset,
        classes, ignore_index, reduction, count, first_bad);
  });
  check_launch("cross_entropy_backward_kernel", device);
}

}  // namespace loom::cuda::kernels
