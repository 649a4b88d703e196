#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// One thread per rotated pair (2i, 2i+1) of x (outer, time, heads, 2 * half) contiguous, in x's
// own dtype T (computed in f32, each output rounded once); the tables are f32.
template <typename T>
__global__ void rope_kernel(T* out, const T* x, const float* cos, const float* sin, int64_t pairs,
                            int64_t time, int64_t heads, int64_t half, float sin_sign) {
  LOOM_GRID_STRIDE(p, pairs) {
    const int64_t i = p % half;
    const int64_t t = (p / (half * heads)) % time;
    const float c = cos[t * half + i], s = sin_sign * sin[t * half + i];
    const float x0 = load(x + 2 * p), x1 = load(x + 2 * p + 1);
    out[2 * p] = convert<T>(x0 * c - x1 * s);
    out[2 * p + 1] = convert<T>(x0 * s + x1 * c);
  }
}

}  // namespace

void rope_forward(DType dtype, void* out, const void* x, const float* cos, const float* sin,
                  int64_t outer, int64_t time, int64_t heads, int64_t half, bool inverse,
                  int device) {
  const int64_t pairs = outer * time * heads * half;
  if (pairs == 0) return;
  visit_floating(dtype, "rope_forward", [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid_for(pairs), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), static_cast<const T*>(x), cos, sin, pairs, time, heads, half,
        inverse ? -1.0f : 1.0f);
  });
  check_launch("rope_kernel", device);
}

}  // namespace loom::cuda::kernels
