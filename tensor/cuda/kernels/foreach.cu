#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/foreach.h"
#include "tensor/cuda/kernels/multi_tensor.cuh"

namespace loom::cuda::kernels {
namespace {

static_assert(kForeachChunk == kMultiTensorChunk, "foreach.h's chunk is multi_tensor.cuh's");

using ForeachLaunch = MultiTensorLaunch<ForeachTensor, kForeachTensorsPerLaunch>;

// partials[chunk] = the chunk's sum of squares (each thread's elements in f32, then the block's
// fixed tree).
__global__ void square_sum_chunks_kernel(const ForeachLaunch launch, float* partials) {
  const int64_t block = blockIdx.x;
  const int t = launch.tensor_of(block);
  const ForeachTensor& x = launch.tensors[t];
  const int64_t begin = launch.chunk_begin(t, block);
  const int64_t end = min(begin + kMultiTensorChunk, x.n);
  float own = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x.data[i];
    own += v * v;
  }
  own = block_sum(own);
  if (threadIdx.x == 0) partials[launch.block_base + block] = own;
}

// One block per tensor: its chunks' partial sums added in double, in a fixed order.
__global__ void square_sum_totals_kernel(const ForeachLaunch launch, const float* partials,
                                         float* out) {
  const int t = blockIdx.x;
  const int64_t first = launch.block_base + launch.first_block[t];
  const int64_t last = launch.block_base + launch.first_block[t + 1];
  double own = 0.0;
  for (int64_t p = first + threadIdx.x; p < last; p += blockDim.x) own += partials[p];
  own = block_sum(own);
  if (threadIdx.x == 0) out[launch.index[t]] = static_cast<float>(own);
}

__global__ void mul_kernel(const ForeachLaunch launch, float scalar) {
  const int64_t block = blockIdx.x;
  const int t = launch.tensor_of(block);
  const ForeachTensor& x = launch.tensors[t];
  const int64_t begin = launch.chunk_begin(t, block);
  const int64_t end = min(begin + kMultiTensorChunk, x.n);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x.data[i] *= scalar;
}

using CastLaunch = MultiTensorLaunch<ForeachCast, kForeachCastsPerLaunch>;

template <typename T>
__global__ void cast_from_f32_kernel(const CastLaunch launch) {
  const int64_t block = blockIdx.x;
  const int t = launch.tensor_of(block);
  const ForeachCast& x = launch.tensors[t];
  const int64_t begin = launch.chunk_begin(t, block);
  const int64_t end = min(begin + kMultiTensorChunk, x.n);
  T* out = static_cast<T*>(x.out);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) out[i] = convert<T>(x.in[i]);
}

}  // namespace

void foreach_sum_of_squares(const ForeachTensor* tensors, int64_t count, float* out,
                            float* partials, int device) {
  for_each_multi_tensor_launch<kForeachTensorsPerLaunch>(
      tensors, count, "foreach_sum_of_squares", [&](const ForeachLaunch& launch, unsigned blocks) {
        const cudaStream_t stream = compute_stream(device);
        square_sum_chunks_kernel<<<blocks, kThreads, 0, stream>>>(launch, partials);
        check_launch("square_sum_chunks_kernel", device);
        square_sum_totals_kernel<<<static_cast<unsigned>(launch.count), kThreads, 0, stream>>>(
            launch, partials, out);
        check_launch("square_sum_totals_kernel", device);
      });
}

void foreach_mul(const ForeachTensor* tensors, int64_t count, float scalar, int device) {
  for_each_multi_tensor_launch<kForeachTensorsPerLaunch>(
      tensors, count, "foreach_mul", [&](const ForeachLaunch& launch, unsigned blocks) {
        mul_kernel<<<blocks, kThreads, 0, compute_stream(device)>>>(launch, scalar);
        check_launch("mul_kernel", device);
      });
}

void foreach_cast_from_f32(const ForeachCast* casts, int64_t count, DType out_dtype, int device) {
  for_each_multi_tensor_launch<kForeachCastsPerLaunch>(
      casts, count, "foreach_cast_from_f32", [&](const CastLaunch& launch, unsigned blocks) {
        const cudaStream_t stream = compute_stream(device);
        if (out_dtype == DType::kBFloat16) {
          cast_from_f32_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(launch);
        } else {
          LOOM_CHECK(out_dtype == DType::kFloat16,
                     "foreach_cast_from_f32: casts to bf16 or f16, got {}", dtype_name(out_dtype));
          cast_from_f32_kernel<__half><<<blocks, kThreads, 0, stream>>>(launch);
        }
        check_launch("cast_from_f32_kernel", device);
      });
}

}  // namespace loom::cuda::kernels
