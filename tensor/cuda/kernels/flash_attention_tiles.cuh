// Shared by the fused attention kernels (flash_attention.cu, flash_attention_mma.cu; nvcc only):
// the 64-row tiles, the causal mask and the tile ranges it leaves, and the launch with more than
// 48 KiB of dynamic shared memory.
#pragma once

#include <cstdint>

#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels::flash {

inline constexpr int kTile = 64;  // query and key rows per tile

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Key j is visible to query i: in range and, when causal, j <= i + causal_offset (0: top-left
// aligned).
__device__ __forceinline__ bool visible(int64_t i, int64_t j, const FlashAttentionShape& s) {
  return i < s.tq && j < s.tk && (!s.causal || j <= i + s.causal_offset);
}

// End of the keys the query tile starting at q0 may see: all, or (causal) those up to key
// i + causal_offset of its last query i = q0 + kTile - 1 (rows past tq see nothing anyway), in
// [0, tk]; 0 when no query of the tile sees a key.
__device__ __forceinline__ int64_t key_end(const FlashAttentionShape& s, int64_t q0) {
  if (!s.causal) return s.tk;
  const int64_t end = q0 + kTile + s.causal_offset;
  return end < 0 ? 0 : (end < s.tk ? end : s.tk);
}

// First query tile (its first row, a multiple of kTile) holding a query that sees a key of the
// key tile starting at k0: 0, or (causal) the tile of query k0 - causal_offset, the first that
// sees key k0 (a later query sees more keys, none sees fewer).
__device__ __forceinline__ int64_t query_begin(const FlashAttentionShape& s, int64_t k0) {
  if (!s.causal) return 0;
  const int64_t first = k0 - s.causal_offset;
  return first <= 0 ? 0 : first / kTile * kTile;
}

// Launches kernel on `blocks` blocks of `threads` with `bytes` of dynamic shared memory (opted in
// above the default 48 KiB).
template <typename Kernel, typename... Args>
void launch(Kernel kernel, const char* name, int64_t blocks, int threads, size_t bytes, int device,
            Args... args) {
  LOOM_CHECK(blocks <= 0x7fffffff, "{}: {} blocks exceed the grid limit", name, blocks);
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK_ON(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)),
                     device);
  // The emulated device (tools/cuda_emulator/device) compiles .cu files as C++, where a launch is
  // a call. Unformatted: clang-format reads the CUDA launch as shifts under the #ifdef.
  // clang-format off
#ifdef LOOM_CUDA_EMULATED
  ::loom_emu::launch(name, ::loom_emu::as_dim3(static_cast<unsigned>(blocks)),
                     ::loom_emu::as_dim3(threads), bytes, [&] { kernel(args...); });
#else
  kernel<<<static_cast<unsigned>(blocks), threads, bytes, compute_stream(device)>>>(args...);
#endif
  // clang-format on
  check_launch(name, device);
}

}  // namespace loom::cuda::kernels::flash
