#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Element (i, j) of the output: a copy, no conversion (the values keep their dtype). An index
// outside 0..v-1 is recorded and its row written as zeros, never read.
template <typename T>
__global__ void embedding_kernel(T* out, const T* weight, int64_t row_stride, int64_t col_stride,
                                 const int64_t* idx, int64_t count, int64_t c, int64_t v,
                                 int64_t* first_bad) {
  LOOM_GRID_STRIDE(e, count * c) {
    const int64_t i = e / c, j = e % c;
    const int64_t row = idx[i];
    if (row < 0 || row >= v) {
      if (j == 0) record_failure(first_bad, i);
      out[e] = convert<T>(0.0f);
      continue;
    }
    out[e] = weight[row * row_stride + j * col_stride];
  }
}

__global__ void embedding_backward_kernel(float* grad_w, const float* g, const int64_t* idx,
                                          int64_t count, int64_t c, int64_t v, int64_t* first_bad) {
  LOOM_GRID_STRIDE(e, count * c) {
    const int64_t i = e / c, j = e % c;
    const int64_t row = idx[i];
    if (row < 0 || row >= v) {
      if (j == 0) record_failure(first_bad, i);
      continue;
    }
    atomicAdd(grad_w + row * c + j, g[e]);
  }
}

}  // namespace

void embedding_forward(DType dtype, void* out, const void* weight, int64_t row_stride,
                       int64_t col_stride, const int64_t* idx, int64_t count, int64_t c, int64_t v,
                       int64_t* first_bad, int device) {
  if (count * c == 0) return;
  visit_floating(dtype, "embedding", [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<T><<<grid_for(count * c), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), static_cast<const T*>(weight), row_stride, col_stride, idx, count, c,
        v, first_bad);
  });
  check_launch("embedding_kernel", device);
}

void embedding_backward(float* grad_w, const float* grad_out, const int64_t* idx, int64_t count,
                        int64_t c, int64_t v, int64_t* first_bad, int device) {
  if (count * c == 0) return;
  embedding_backward_kernel<<<grid_for(count * c), kThreads, 0, compute_stream(device)>>>(
      grad_w, grad_out, idx, count, c, v, first_bad);
  check_launch("embedding_backward_kernel", device);
}

}  // namespace loom::cuda::kernels
