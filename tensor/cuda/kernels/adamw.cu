#include "tensor/cuda/kernels/adamw.h"
#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/multi_tensor.cuh"

namespace loom::cuda::kernels {
namespace {

using AdamWLaunch = MultiTensorLaunch<AdamWTensor, kAdamWTensorsPerLaunch>;

__global__ void adamw_kernel(const AdamWLaunch launch, const AdamWHyper h) {
  const int64_t block = blockIdx.x;
  const int t = launch.tensor_of(block);
  const AdamWTensor& x = launch.tensors[t];
  const int64_t begin = launch.chunk_begin(t, block);
  const int64_t end = min(begin + kMultiTensorChunk, x.n);
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
  for_each_multi_tensor_launch<kAdamWTensorsPerLaunch>(
      tensors, count, "adamw_multi_tensor", [&](const AdamWLaunch& launch, unsigned blocks) {
        adamw_kernel<<<blocks, kThreads, 0, compute_stream(device)>>>(launch, hyper);
        check_launch("adamw_kernel", device);
      });
}

}  // namespace loom::cuda::kernels
