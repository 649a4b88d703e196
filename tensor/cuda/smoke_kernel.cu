#include <algorithm>
#include <cstdint>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/smoke_kernel.h"

namespace loom::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill an H100/H200 several times over; larger n is covered by the grid stride.
constexpr std::int64_t kMaxBlocks = 4096;

__global__ void axpy_kernel(float a, const float* __restrict__ x, float* __restrict__ y,
                            std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = fmaf(a, x[i], y[i]);
  }
}

}  // namespace

void axpy_on_device(float a, const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  LOOM_CHECK(n >= 0, "axpy_on_device: n must be >= 0, got {}", n);
  if (n == 0) return;
  const std::int64_t blocks =
      std::min<std::int64_t>((n + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks);
  axpy_kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(a, x, y, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::cuda
