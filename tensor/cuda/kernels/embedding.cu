#include <cstdint>

#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

// Element (i, j) of the output: a copy, no conversion (the values keep their dtype). An index
// outside 0..v-1 is recorded and its row written as zeros, never read.
template <typename T>
__global__ void embedding_kernel(T* out, const T* weight, int64_t row_stride, int64_t col_stride,
                                 const int64_t* idx, int64_t count, int64_t c, int64_t v,
                                 int64_t* first_bad) {
  LOOM_GRID_STRIDE(e, count * c) {
    const int64_t i = e / c, j = e % c;
    const int64_t row = idx[i];
    if (row < 0 || row >= v) {
      if (j == 0) record_failure(first_bad, i);
      out[e] = convert<T>(0.0f);
      continue;
    }
    out[e] = weight[row * row_stride + j * col_stride];
  }
}

// The sort keys of the backward: (row << 32) | position for a valid index, kNoRow for an invalid
// one (recorded) and for the padding up to a power of two, so they sort after every row.
constexpr int64_t kNoRow = INT64_MAX;

__global__ void embedding_sort_keys_kernel(int64_t* keys, const int64_t* idx, int64_t count,
                                           int64_t padded, int64_t v, int64_t* first_bad) {
  LOOM_GRID_STRIDE(p, padded) {
    int64_t key = kNoRow;
    if (p < count) {
      const int64_t row = idx[p];
      if (row < 0 || row >= v) {
        record_failure(first_bad, p);
      } else {
        key = (row << 32) | p;
      }
    }
    keys[p] = key;
  }
}

// The bitonic sort of `padded` keys (a power of two), ascending, in steps (k, j): k = 2, 4, ...,
// padded, and for each j = k/2, ..., 1 every key t is compare-exchanged with t ^ j (ascending
// where t & k is 0). A step whose j reaches beyond a tile of kSortTile keys runs as one launch
// over all keys (bitonic_step_kernel); the steps of one k with j inside a tile run in one launch
// per k, each tile in shared memory (bitonic_tile_kernel), so GPT-2's 16 x 1024 positions sort
// in 15 launches instead of 105 (one per step).
constexpr int64_t kSortTile = 1024;

__device__ __forceinline__ void compare_exchange(int64_t& a, int64_t& b, bool ascending) {
  if (ascending ? a > b : a < b) {
    const int64_t t = a;
    a = b;
    b = t;
  }
}

// One step (k, j) over all keys, j >= kSortTile.
__global__ void bitonic_step_kernel(int64_t* keys, int64_t padded, int64_t k, int64_t j) {
  LOOM_GRID_STRIDE(t, padded) {
    const int64_t partner = t ^ j;
    if (partner <= t) continue;
    compare_exchange(keys[t], keys[partner], (t & k) == 0);
  }
}

// In each tile of min(padded, kSortTile) keys, in shared memory: every step (k, j) for k from
// k_first to k_last (doubling) and j from min(k/2, tile/2) down to 1. One block per tile.
__global__ void bitonic_tile_kernel(int64_t* keys, int64_t padded, int64_t k_first,
                                    int64_t k_last) {
  __shared__ int64_t tile[kSortTile];
  const int64_t size = padded < kSortTile ? padded : kSortTile;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * size;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) tile[i] = keys[base + i];
  __syncthreads();
  for (int64_t k = k_first; k <= k_last; k <<= 1) {
    for (int64_t j = (k / 2 < size / 2 ? k / 2 : size / 2); j > 0; j /= 2) {
      // Pair p: the key i with bit j clear, and i + j.
      for (int64_t p = threadIdx.x; p < size / 2; p += blockDim.x) {
        const int64_t i = 2 * j * (p / j) + p % j;
        compare_exchange(tile[i], tile[i + j], ((base + i) & k) == 0);
      }
      __syncthreads();
    }
  }
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) keys[base + i] = tile[i];
}

// First key in sorted keys[0, n) not less than `key`.
__device__ int64_t lower_bound(const int64_t* keys, int64_t n, int64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One block per row r of grad_w: the sum of grad_out's rows at r's positions, which the sorted
// keys hold in increasing order (so the sum runs as the CPU's does), in f32, written once in T.
template <typename T>
__global__ void embedding_row_sums_kernel(T* grad_w, const T* g, const int64_t* keys,
                                          int64_t padded, int64_t c, int64_t v) {
  for (int64_t r = blockIdx.x; r < v; r += gridDim.x) {
    const int64_t begin = lower_bound(keys, padded, r << 32);
    const int64_t end = lower_bound(keys, padded, (r + 1) << 32);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      float sum = 0.0f;
      for (int64_t s = begin; s < end; ++s) sum += load(g + (keys[s] & 0xffffffffLL) * c + j);
      grad_w[r * c + j] = convert<T>(sum);
    }
  }
}

}  // namespace

void embedding_forward(DType dtype, void* out, const void* weight, int64_t row_stride,
                       int64_t col_stride, const int64_t* idx, int64_t count, int64_t c, int64_t v,
                       int64_t* first_bad, int device) {
  if (count * c == 0) return;
  visit_floating(dtype, "embedding", [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<T><<<grid_for(count * c), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), static_cast<const T*>(weight), row_stride, col_stride, idx, count, c,
        v, first_bad);
  });
  check_launch("embedding_kernel", device);
}

void embedding_backward(DType dtype, void* grad_w, const void* grad_out, const int64_t* idx,
                        int64_t count, int64_t c, int64_t v, int64_t* keys, int64_t* first_bad,
                        int device) {
  if (v * c == 0) return;
  const int64_t padded = embedding_backward_keys(count);
  cudaStream_t stream = compute_stream(device);
  embedding_sort_keys_kernel<<<grid_for(padded), kThreads, 0, stream>>>(keys, idx, count, padded, v,
                                                                        first_bad);
  check_launch("embedding_sort_keys_kernel", device);
  // Every k up to a tile sorts inside the tiles at once; each larger k takes its steps beyond a
  // tile over all keys, then the rest inside the tiles.
  const int64_t tile = padded < kSortTile ? padded : kSortTile;
  const auto tiles = static_cast<unsigned>(padded / tile);
  if (padded >= 2) {
    bitonic_tile_kernel<<<tiles, kThreads, 0, stream>>>(keys, padded, 2, tile);
    check_launch("bitonic_tile_kernel", device);
  }
  for (int64_t k = 2 * tile; k <= padded; k <<= 1) {
    for (int64_t j = k / 2; j >= tile; j /= 2) {
      bitonic_step_kernel<<<grid_for(padded), kThreads, 0, stream>>>(keys, padded, k, j);
    }
    check_launch("bitonic_step_kernel", device);
    bitonic_tile_kernel<<<tiles, kThreads, 0, stream>>>(keys, padded, k, k);
    check_launch("bitonic_tile_kernel", device);
  }
  visit_floating(dtype, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_row_sums_kernel<T><<<grid_for_rows(v), kThreads, 0, stream>>>(
        static_cast<T*>(grad_w), static_cast<const T*>(grad_out), keys, padded, c, v);
  });
  check_launch("embedding_row_sums_kernel", device);
}

}  // namespace loom::cuda::kernels
