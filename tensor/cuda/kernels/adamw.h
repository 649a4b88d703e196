// The CUDA kernel of the fused AdamW update (ops::adamw_update_fused_): many parameters per
// launch (as torch's `fused=True` AdamW and apex's multi_tensor_apply), each element read and
// written once, instead of about ten elementwise kernels per parameter.
#pragma once

#include <cstdint>

namespace loom::cuda::kernels {

// One parameter's update: contiguous f32 param, grad and moments of n elements on one device, and
// its own bias corrections (1 - beta^step: steps are counted per parameter, as torch does).
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t n = 0;
  float bias1 = 1.0f, bias2 = 1.0f;
};

struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
};

// In place on every tensor, in f32 with the CPU kernel's order of operations
// (tensor/cpu/vector_math.h's adamw_f32):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p = p (1 - lr wd) - lr * (m / bias1) / (sqrt(v / bias2) + eps)
// Queued on `device`'s compute stream; kAdamWTensorsPerLaunch tensors per launch.
inline constexpr int kAdamWTensorsPerLaunch = 32;
void adamw_multi_tensor(const AdamWTensor* tensors, int64_t count, const AdamWHyper& hyper,
                        int device);

}  // namespace loom::cuda::kernels
