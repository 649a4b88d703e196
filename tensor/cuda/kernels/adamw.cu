#include <algorithm>

#include "tensor/cuda/kernels/adamw.h"
#include "tensor/cuda/kernels/device_common.cuh"

namespace loom::cuda::kernels {
namespace {

// Elements per block: each parameter is cut into chunks of this many, and the chunks of every
// tensor in a launch are numbered consecutively (block b works on the tensor whose range of
// chunk numbers holds b), so one launch covers tensors of any sizes without idle blocks.
constexpr int64_t kChunk = static_cast<int64_t>(kThreads) * 16;

// The launch's tensors by value (kernel arguments: 32 tensors take about 1.6 KB of the 4 KB
// allowed), with first_block[t] the number of the first chunk of tensor t and
// first_block[count] the total.
struct AdamWLaunch {
  AdamWTensor tensors[kAdamWTensorsPerLaunch];
  int64_t first_block[kAdamWTensorsPerLaunch + 1];
  int count;
};

__global__ void adamw_kernel(const AdamWLaunch launch, const AdamWHyper h) {
  const int64_t block = blockIdx.x;
  int t = 0;
  while (t + 1 < launch.count && launch.first_block[t + 1] <= block) ++t;
  const AdamWTensor& x = launch.tensors[t];
  const int64_t begin = (block - launch.first_block[t]) * kChunk;
  const int64_t end = min(begin + kChunk, x.n);
  const float one_minus_beta1 = 1.0f - h.beta1, one_minus_beta2 = 1.0f - h.beta2;
  const float decay = 1.0f - h.lr * h.weight_decay;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = x.grad[i];
    const float m = h.beta1 * x.exp_avg[i] + one_minus_beta1 * g;
    const float v = h.beta2 * x.exp_avg_sq[i] + one_minus_beta2 * (g * g);
    x.exp_avg[i] = m;
    x.exp_avg_sq[i] = v;
    const float denom = sqrtf(v / x.bias2) + h.eps;
    x.param[i] = x.param[i] * decay - (m / x.bias1) / denom * h.lr;
  }
}

}  // namespace

void adamw_multi_tensor(const AdamWTensor* tensors, int64_t count, const AdamWHyper& hyper,
                        int device) {
  for (int64_t first = 0; first < count; first += kAdamWTensorsPerLaunch) {
    AdamWLaunch launch{};
    launch.count = 0;
    int64_t blocks = 0;
    for (int64_t i = first; i < std::min(count, first + kAdamWTensorsPerLaunch); ++i) {
      if (tensors[i].n == 0) continue;
      launch.tensors[launch.count] = tensors[i];
      launch.first_block[launch.count] = blocks;
      blocks += (tensors[i].n + kChunk - 1) / kChunk;
      ++launch.count;
    }
    launch.first_block[launch.count] = blocks;
    if (blocks == 0) continue;
    LOOM_CHECK(blocks <= 0x7fffffff, "adamw_multi_tensor: {} blocks exceed a CUDA grid", blocks);
    adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, compute_stream(device)>>>(launch,
                                                                                         hyper);
    check_launch("adamw_kernel", device);
  }
}

}  // namespace loom::cuda::kernels
