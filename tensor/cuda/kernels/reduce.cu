#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/reduce.h"

namespace loom::cuda::kernels {
namespace {

template <typename T>
using Acc = std::conditional_t<std::is_integral_v<T>, long long, double>;

// One block per row and chunk of the row (grid-stride over rows): a row of n elements splits into
// `gridDim.y` chunks when there are few rows (a full reduction is one row: the squared-gradient
// sums of clip_grad_norm, 38 M elements for GPT-2's embedding, once kept one block busy for
// milliseconds). With one chunk the block's sum is the result; with several, each chunk's sum
// goes to `partial` and sum_chunks_kernel adds them in chunk order: deterministic.
template <typename T>
__global__ void sum_rows_kernel(T* out, Acc<T>* partial, const T* in, int64_t rows, int64_t n,
                                int64_t per_chunk, double scale) {
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * per_chunk;
  const int64_t end = begin + per_chunk < n ? begin + per_chunk : n;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * n;
    Acc<T> acc = 0;
    for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
      acc += static_cast<Acc<T>>(load(x + j));
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) {
      if (partial != nullptr) {
        partial[chunk * rows + r] = acc;
      } else if constexpr (std::is_integral_v<T>) {
        out[r] = static_cast<T>(acc);
      } else {
        out[r] = convert<T>(acc * scale);
      }
    }
  }
}

// Column sums of an (n, cols) matrix, as the bias and norm-weight gradients take them over
// batch x time rows. A block is 32 columns x 32 row groups over one chunk of rows: thread (x, y)
// sums rows y, y + 32, ... of the chunk in column x (a warp reads 32 neighbouring columns:
// coalesced), then the 32 partial sums of each column add up in shared memory in a fixed order.
// With one chunk that is the result; with several, each block writes its chunk's sums to the
// workspace and sum_chunks_kernel adds them in chunk order: deterministic, no atomics. (The first
// version ran one thread per column down every row: 768 columns kept 3 of an H200's 132 SMs
// busy, ~1 ms per bias gradient of GPT-2 small; tiles alone still used only 24.)
constexpr int kColumnTile = 32, kRowGroups = 32;
constexpr int64_t kRowsPerChunk = 512;
constexpr int64_t kMaxChunks = 64;

template <typename T>
__device__ __forceinline__ void store_sum(T* out, int64_t c, Acc<T> total, double scale) {
  if constexpr (std::is_integral_v<T>) {
    out[c] = static_cast<T>(total);
  } else {
    out[c] = convert<T>(total * scale);
  }
}

template <typename T>
__global__ void sum_cols_kernel(T* out, Acc<T>* partial_out, const T* in, int64_t n, int64_t cols,
                                int64_t rows_per_chunk, double scale) {
  __shared__ Acc<T> partial[kRowGroups][kColumnTile + 1];  // +1: no bank conflicts
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < n ? begin + rows_per_chunk : n;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kColumnTile; first < cols;
       first += static_cast<int64_t>(gridDim.x) * kColumnTile) {
    const int64_t c = first + threadIdx.x;
    Acc<T> acc = 0;
    if (c < cols) {
      for (int64_t i = begin + threadIdx.y; i < end; i += kRowGroups) {
        acc += static_cast<Acc<T>>(load(in + i * cols + c));
      }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      Acc<T> total = 0;
      for (int g = 0; g < kRowGroups; ++g) total += partial[g][threadIdx.x];
      if (partial_out != nullptr) {
        partial_out[chunk * cols + c] = total;
      } else {
        store_sum(out, c, total, scale);
      }
    }
    __syncthreads();  // the tile's partial sums are read before the next tile writes them
  }
}

template <typename T>
__global__ void sum_chunks_kernel(T* out, const Acc<T>* partial, int64_t chunks, int64_t cols,
                                  double scale) {
  LOOM_GRID_STRIDE(c, cols) {
    Acc<T> total = 0;
    for (int64_t k = 0; k < chunks; ++k) total += partial[k * cols + c];
    store_sum(out, c, total, scale);
  }
}

// Is (v, i) a better maximum than (best, best_i)? NaN beats numbers; ties keep the lower index.
template <typename V>
__device__ __forceinline__ bool better(V v, int64_t i, V best, int64_t best_i) {
  const bool v_nan = v != v, best_nan = best != best;
  if (v_nan != best_nan) return v_nan;
  if (!v_nan && v != best) return v > best;
  return i < best_i;
}

// One warp per row; each lane scans its strided share, then the lanes combine.
template <typename T>
__global__ void max_rows_kernel(T* values, int64_t* indices, const T* in, int64_t rows, int64_t n) {
  const int lane = threadIdx.x % 32;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps_total) {
    const T* x = in + r * n;
    Compute<T> best = load(x);
    int64_t best_i = 0;
    for (int64_t j = lane; j < n; j += 32) {
      const Compute<T> v = load(x + j);
      if (better(v, j, best, best_i)) {
        best = v;
        best_i = j;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const Compute<T> v = __shfl_down_sync(0xffffffffu, best, offset);
      const int64_t i = __shfl_down_sync(0xffffffffu, best_i, offset);
      if (better(v, i, best, best_i)) {
        best = v;
        best_i = i;
      }
    }
    if (lane == 0) {
      values[r] = x[best_i];
      indices[r] = best_i;
    }
  }
}

// One warp per row, k rounds. Round c picks the best element strictly after round c - 1's winner
// in the total order (value descending, index ascending), so nothing but the last winner is kept
// and k may be anything up to n. A row holding a NaN gets -1 in every slot.
template <typename T>
__global__ void top_k_rows_kernel(int64_t* indices, const T* in, int64_t rows, int64_t n,
                                  int64_t k) {
  const int lane = threadIdx.x % 32;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps_total) {
    const T* x = in + r * n;
    int64_t* out = indices + r * k;
    int nan = 0;
    for (int64_t j = lane; j < n; j += 32) {
      const Compute<T> v = load(x + j);
      nan |= v != v;
    }
    for (int offset = 16; offset > 0; offset /= 2)
      nan |= __shfl_down_sync(0xffffffffu, nan, offset);
    if (__shfl_sync(0xffffffffu, nan, 0)) {
      for (int64_t c = lane; c < k; c += 32) out[c] = -1;
      continue;
    }
    Compute<T> last = 0;
    int64_t last_i = -1;  // no winner yet
    for (int64_t c = 0; c < k; ++c) {
      int have = 0;
      Compute<T> best = 0;
      int64_t best_i = n;
      for (int64_t j = lane; j < n; j += 32) {
        const Compute<T> v = load(x + j);
        const bool after = last_i < 0 || v < last || (v == last && j > last_i);
        if (after && (!have || v > best || (v == best && j < best_i))) {
          have = 1;
          best = v;
          best_i = j;
        }
      }
      for (int offset = 16; offset > 0; offset /= 2) {
        const Compute<T> v = __shfl_down_sync(0xffffffffu, best, offset);
        const int64_t i = __shfl_down_sync(0xffffffffu, best_i, offset);
        const int h = __shfl_down_sync(0xffffffffu, have, offset);
        if (h && (!have || v > best || (v == best && i < best_i))) {
          have = 1;
          best = v;
          best_i = i;
        }
      }
      last = __shfl_sync(0xffffffffu, best, 0);
      last_i = __shfl_sync(0xffffffffu, best_i, 0);
      if (lane == 0) out[c] = last_i;
    }
  }
}

}  // namespace

int64_t sum_rows_chunks(int64_t rows, int64_t n) {
  // Enough blocks to fill the GPU several times over, each chunk at least 16 Ki elements.
  constexpr int64_t kMinChunk = 16384, kBlocksWanted = 1024;
  if (rows >= kBlocksWanted) return 1;
  int64_t chunks = (n + kMinChunk - 1) / kMinChunk;
  const int64_t cap = kBlocksWanted / (rows < 1 ? 1 : rows);
  if (chunks > cap) chunks = cap;
  return chunks < 1 ? 1 : chunks;
}

void sum_rows(DType dtype, void* out, const void* in, int64_t rows, int64_t n, double scale,
              void* workspace, int device) {
  if (rows == 0) return;
  const int threads = n >= 256 ? 256 : (n <= 32 ? 32 : static_cast<int>((n + 31) / 32 * 32));
  const int64_t chunks = sum_rows_chunks(rows, n);
  const int64_t per_chunk = (n + chunks - 1) / chunks;
  const dim3 grid(grid_for_rows(rows), static_cast<unsigned>(chunks));
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* partial = chunks > 1 ? static_cast<Acc<T>*>(workspace) : nullptr;
    sum_rows_kernel<T><<<grid, threads, 0, compute_stream(device)>>>(
        static_cast<T*>(out), partial, static_cast<const T*>(in), rows, n, per_chunk, scale);
    if (chunks > 1) {
      sum_chunks_kernel<T><<<grid_for(rows), kThreads, 0, compute_stream(device)>>>(
          static_cast<T*>(out), partial, chunks, rows, scale);
    }
  });
  check_launch("sum_rows_kernel", device);
}

int64_t sum_cols_chunks(int64_t n) {
  const int64_t chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  return chunks < 1 ? 1 : (chunks > kMaxChunks ? kMaxChunks : chunks);
}

void sum_cols(DType dtype, void* out, const void* in, int64_t n, int64_t cols, double scale,
              void* workspace, int device) {
  if (cols == 0) return;
  const int64_t chunks = sum_cols_chunks(n);
  const int64_t rows_per_chunk = (n + chunks - 1) / chunks;
  const int64_t tiles = (cols + kColumnTile - 1) / kColumnTile;
  const dim3 grid(static_cast<unsigned>(tiles > 65535 * 4 ? 65535 * 4 : tiles),
                  static_cast<unsigned>(chunks));
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* partial = chunks > 1 ? static_cast<Acc<T>*>(workspace) : nullptr;
    sum_cols_kernel<T><<<grid, dim3(kColumnTile, kRowGroups), 0, compute_stream(device)>>>(
        static_cast<T*>(out), partial, static_cast<const T*>(in), n, cols, rows_per_chunk, scale);
    if (chunks > 1) {
      sum_chunks_kernel<T><<<grid_for(cols), kThreads, 0, compute_stream(device)>>>(
          static_cast<T*>(out), partial, chunks, cols, scale);
    }
  });
  check_launch("sum_cols_kernel", device);
}

namespace {

// The grid of a kernel that gives each row one warp of a kThreads block.
unsigned warp_per_row_grid(int64_t rows) {
  constexpr int kWarpsPerBlock = kThreads / 32;
  return grid_for_rows((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void max_rows(DType dtype, void* values, int64_t* indices, const void* in, int64_t rows, int64_t n,
              int device) {
  if (rows == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    max_rows_kernel<T><<<warp_per_row_grid(rows), kThreads, 0, compute_stream(device)>>>(
        static_cast<T*>(values), indices, static_cast<const T*>(in), rows, n);
  });
  check_launch("max_rows_kernel", device);
}

void top_k_rows(DType dtype, int64_t* indices, const void* in, int64_t rows, int64_t n, int64_t k,
                int device) {
  if (rows == 0) return;
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    top_k_rows_kernel<T><<<warp_per_row_grid(rows), kThreads, 0, compute_stream(device)>>>(
        indices, static_cast<const T*>(in), rows, n, k);
  });
  check_launch("top_k_rows_kernel", device);
}

}  // namespace loom::cuda::kernels
