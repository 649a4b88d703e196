// Shared by the .cu files of tensor/cuda/kernels (nvcc only): storage types per dtype, loads and
// stores through the compute type, strided index math, launch shapes and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/kernels/kernel_args.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda::kernels {

// ---- element types ----------------------------------------------------------------------------

// Floating values compute in f32, integers in i64.
template <typename T>
using Compute = std::conditional_t<std::is_integral_v<T>, int64_t, float>;

template <typename T>
__device__ __forceinline__ Compute<T> load(const T* p) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(*p);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(*p);
  } else {
    return static_cast<Compute<T>>(*p);
  }
}

template <typename T, typename V>
__device__ __forceinline__ T convert(V v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Calls f(T{}) with T the device storage type of `dtype`.
template <typename F>
void visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kBFloat16:
      f(__nv_bfloat16{});
      return;
    case DType::kFloat16:
      f(__half{});
      return;
    case DType::kInt32:
      f(int32_t{});
      return;
    case DType::kInt64:
      f(int64_t{});
      return;
  }
  LOOM_FAIL("cuda kernels: unknown dtype {}", static_cast<int>(dtype));
}

// Same, floating dtypes only; `op` names the caller in the error.
template <typename F>
void visit_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      return;
    case DType::kBFloat16:
      f(__nv_bfloat16{});
      return;
    case DType::kFloat16:
      f(__half{});
      return;
    default:
      break;
  }
  LOOM_FAIL("{}: expected a floating dtype (f32, bf16, f16), got {}", op, dtype_name(dtype));
}

// ---- strided index math -----------------------------------------------------------------------

// Sizes and per-operand strides after dropping size-1 dims and merging dims contiguous in every
// operand (the CPU's for_each_run rule), so the common cases index with one division or none.
template <int N>
struct Collapsed {
  int ndim = 0;
  int64_t numel = 1;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
};

template <int N>
Collapsed<N> collapse(const StridedArg* const (&args)[N]) {
  Collapsed<N> c;
  const StridedArg& shape = *args[0];
  for (int d = 0; d < shape.ndim; ++d) {
    const int64_t size = shape.sizes[d];
    c.numel *= size;
    if (size == 1) continue;
    bool merge = c.ndim > 0;
    for (int k = 0; k < N && merge; ++k) {
      merge = c.strides[k][c.ndim - 1] == args[k]->strides[d] * size;
    }
    if (merge) {
      c.sizes[c.ndim - 1] *= size;
      for (int k = 0; k < N; ++k) c.strides[k][c.ndim - 1] = args[k]->strides[d];
    } else {
      c.sizes[c.ndim] = size;
      for (int k = 0; k < N; ++k) c.strides[k][c.ndim] = args[k]->strides[d];
      ++c.ndim;
    }
  }
  return c;
}

// Element offsets of row-major element `index` in each operand.
template <int N>
__device__ __forceinline__ void offsets_of(const Collapsed<N>& c, int64_t index,
                                           int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = c.ndim - 1; d >= 0; --d) {
    const int64_t size = c.sizes[d];
    const int64_t coord = index % size;
    index /= size;
    for (int k = 0; k < N; ++k) off[k] += coord * c.strides[k][d];
  }
}

// ---- launching --------------------------------------------------------------------------------

inline constexpr int kThreads = 256;

// Grid for a grid-stride loop over n elements: enough blocks to fill an H200 several times.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 4 ? 65535 * 4 : blocks));
}

// Grid for one block per row (kernels loop when rows exceed it).
inline unsigned grid_for_rows(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 * 8 ? 65535 * 8 : rows));
}

// Throws loom::Error if the last launch failed (bad configuration); asynchronous faults surface
// at the next synchronizing call.
inline void check_launch(const char* kernel, int device) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    ::loom::cuda::detail::throw_cuda_error(status, kernel, device, __FILE__, __LINE__);
  }
}

#define LOOM_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// A failed device-side check (tensor/cuda/device_checks.h): lowers *first_bad to `position`, so
// the host reports the first failing position whatever order the threads ran in.
__device__ __forceinline__ void record_failure(int64_t* first_bad, int64_t position) {
  atomicMin(reinterpret_cast<long long*>(first_bad), static_cast<long long>(position));
}

// ---- block reductions (blockDim.x a multiple of 32, at most 1024) ------------------------------

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

template <typename V>
__device__ __forceinline__ V warp_max(V v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmax(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

// Sum of v over the block, returned to every thread. Uses 32 elements of shared memory.
template <typename V>
__device__ V block_sum(V v) {
  __shared__ V partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  V total = lane < warps ? partial[lane] : V(0);
  total = warp_sum(total);
  total = __shfl_sync(0xffffffffu, total, 0);
  return total;
}

// Max of v over the block (NaN-ignoring, like fmaxf), returned to every thread.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  float m = lane < warps ? partial[lane] : -INFINITY;
  m = warp_max(m);
  return __shfl_sync(0xffffffffu, m, 0);
}

}  // namespace loom::cuda::kernels
