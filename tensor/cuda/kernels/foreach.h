// CUDA kernels of the multi-tensor ops (tensor/ops_foreach.h, torch's _foreach_ family): many
// tensors per launch (kernels/multi_tensor.cuh), for the per-parameter passes of a step's end
// (gradient clipping's norms and scaling, mixed precision's casts of the weights), which would
// otherwise launch a kernel or two per parameter.
#pragma once

#include <cstdint>

#include "tensor/cuda/kernels/kernel_args.h"

namespace loom::cuda::kernels {

// One tensor: contiguous f32 data of n elements on the launch's device.
struct ForeachTensor {
  float* data = nullptr;
  int64_t n = 0;
};

inline constexpr int kForeachTensorsPerLaunch = 64;
// Elements per chunk (kMultiTensorChunk): foreach_sum_of_squares needs a scratch slot per chunk.
inline constexpr int64_t kForeachChunk = 4096;

// The scratch foreach_sum_of_squares needs: one f32 per chunk of every tensor.
inline int64_t foreach_chunks(const ForeachTensor* tensors, int64_t count) {
  int64_t chunks = 0;
  for (int64_t i = 0; i < count; ++i) chunks += (tensors[i].n + kForeachChunk - 1) / kForeachChunk;
  return chunks;
}

// out[i] = the sum of the squares of tensors[i] (f32). Each chunk sums in f32 (a fixed tree per
// block), then each tensor's chunks add in double in a fixed order: deterministic. out[i] of an
// empty tensor is left as it was (the caller zeroes out). `partials` holds
// foreach_chunks(tensors, count) floats of scratch.
void foreach_sum_of_squares(const ForeachTensor* tensors, int64_t count, float* out,
                            float* partials, int device);

// Every element of every tensor *= scalar, in f32 (the CPU's mul_ by a scalar).
void foreach_mul(const ForeachTensor* tensors, int64_t count, float scalar, int device);

// One cast of n contiguous f32 elements at `in` into `out`, of the call's dtype.
struct ForeachCast {
  const float* in = nullptr;
  void* out = nullptr;
  int64_t n = 0;
};
inline constexpr int kForeachCastsPerLaunch = 64;

// out = in converted to `out_dtype` (bf16 or f16, rounded to nearest even as ops::to's copy
// kernel rounds), for every cast: mixed precision's weights, all in one launch per 64.
void foreach_cast_from_f32(const ForeachCast* casts, int64_t count, DType out_dtype, int device);

}  // namespace loom::cuda::kernels
