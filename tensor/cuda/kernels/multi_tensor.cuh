// Many tensors per kernel launch (apex's multi_tensor_apply, torch's _foreach_ kernels): each
// tensor is cut into chunks of kMultiTensorChunk elements and the chunks of every tensor in a
// launch are numbered consecutively, so block b works on the tensor whose range of chunk numbers
// holds b. One launch covers tensors of any sizes without idle blocks, where one launch per
// tensor would spend more time launching than working on a model's many small parameters.
//
// Entry is the kernel's per-tensor description (pointers, sizes); it must have `int64_t n`, the
// tensor's element count. The tensors go by value in the kernel's arguments (4 KB allowed), so
// a launch takes at most N of them.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "tensor/cuda/kernels/device_common.cuh"

namespace loom::cuda::kernels {

inline constexpr int64_t kMultiTensorChunk = static_cast<int64_t>(kThreads) * 16;

template <typename Entry, int N>
struct MultiTensorLaunch {
  Entry tensors[N];
  // first_block[t]: the number of tensor t's first chunk; first_block[count]: the launch's total.
  int64_t first_block[N + 1];
  // The number of this launch's first chunk among every launch of the call (to index buffers
  // with a slot per chunk of the whole call).
  int64_t block_base;
  // index[t]: tensor t's position in the caller's list (empty tensors are left out of launches).
  int index[N];
  int count;

  // The tensor this block works on, and the chunk's first element.
  __device__ int tensor_of(int64_t block) const {
    int t = 0;
    while (t + 1 < count && first_block[t + 1] <= block) ++t;
    return t;
  }
  __device__ int64_t chunk_begin(int t, int64_t block) const {
    return (block - first_block[t]) * kMultiTensorChunk;
  }
};

// Groups `entries[0..count)` into launches of at most N non-empty tensors and calls
// launch(const MultiTensorLaunch<Entry, N>&, unsigned blocks) for each, in order.
template <int N, typename Entry, typename Launch>
void for_each_multi_tensor_launch(const Entry* entries, int64_t count, const char* what,
                                  Launch&& launch) {
  int64_t block_base = 0;
  int64_t next = 0;
  while (next < count) {
    MultiTensorLaunch<Entry, N> group{};
    group.count = 0;
    group.block_base = block_base;
    int64_t blocks = 0;
    for (; next < count && group.count < N; ++next) {
      if (entries[next].n == 0) continue;
      group.tensors[group.count] = entries[next];
      group.index[group.count] = static_cast<int>(next);
      group.first_block[group.count] = blocks;
      blocks += (entries[next].n + kMultiTensorChunk - 1) / kMultiTensorChunk;
      ++group.count;
    }
    group.first_block[group.count] = blocks;
    if (blocks == 0) continue;
    LOOM_CHECK(blocks <= 0x7fffffff, "{}: {} blocks exceed a CUDA grid", what, blocks);
    launch(group, static_cast<unsigned>(blocks));
    block_base += blocks;
  }
}

}  // namespace loom::cuda::kernels
