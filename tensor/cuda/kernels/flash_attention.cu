// Fused attention, FlashAttention-2 style (nn.h): no (tq, tk) matrix in global memory.
//
// Tiling: 64 query rows by 64 key rows; 256 threads, 4 per tile row ("lane" 0..3 of the row), each
// thread holding 16 score columns (lane + 4 j) and up to 32 output columns (lane + 4 c). Tiles are
// f32 in shared memory with a padded row stride (n + 1) against bank conflicts; the inputs'
// dtype is converted on load and outputs are rounded once on store.
//
// Forward: one block per (batch*head, query tile), looping over key tiles with an online softmax
// (running max m and sum l per row in f32); causal blocks stop at the last key tile a row sees
// (key i + causal_offset for the tile's last query i).
// Backward: the dq kernel (one block per query tile) reads delta_i as given (delta_given: the
// op's rowsum(dO * out), attention_row_dots.cu) or else first sums rowsum(P * dP) over the key
// tiles, as the CPU op does, and stores it; then it accumulates
// dq = scale * dS k with dS = P (dP - delta); the dk/dv kernel (one block per key tile) loops over
// the query tiles that can see it (causal: from the tile holding query k0 - causal_offset) and
// accumulates dv = P^T dO and dk = scale * dS^T q. P is recomputed from the saved logsumexp in
// both. Memory: O(T * D) per (batch, head).
// Dropout (s.dropout active): each element's keep factor is drawn where its P is nonzero, in the
// forward for P V, and again in the backward for dP and for dv's P.
#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/flash_attention_mma.h"
#include "tensor/cuda/kernels/flash_attention_tiles.cuh"
#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {
namespace {

using flash::ceil_div;
using flash::key_end;
using flash::kTile;
using flash::query_begin;
using flash::visible;

constexpr int kFlashThreads = 256;                                     // 4 threads per tile row
constexpr int kLanes = kFlashThreads / kTile;                          // threads per tile row
constexpr int kScoreCols = kTile / kLanes;                             // score columns per thread
constexpr int kOutCols = static_cast<int>(kFlashMaxHeadDim) / kLanes;  // output columns per thread

// kTile rows of n f32 values in shared memory, row stride n + 1.
struct Tile {
  float* p;
  int stride;
  __device__ float& at(int r, int c) const { return p[r * stride + c]; }
  __device__ float* end() const { return p + kTile * stride; }
};

__device__ __forceinline__ Tile tile_after(float* p, int n) { return Tile{p, n + 1}; }

// Rows [row0, row0 + kTile) of a contiguous (total, n) matrix as f32; rows past the end are 0.
template <typename T>
__device__ void load_tile(Tile tile, const T* src, int64_t row0, int64_t total, int n) {
  for (int idx = threadIdx.x; idx < kTile * n; idx += blockDim.x) {
    const int r = idx / n, c = idx % n;
    const int64_t row = row0 + r;
    tile.at(r, c) = row < total ? load(src + row * n + c) : 0.0f;
  }
}

// acc[j] = sum_kk a[r][kk] * b[lane + kLanes j][kk]: row r of a against kTile rows of b.
__device__ __forceinline__ void dot_rows(float (&acc)[kScoreCols], Tile a, Tile b, int n, int r,
                                         int lane) {
#pragma unroll
  for (int j = 0; j < kScoreCols; ++j) acc[j] = 0.0f;
  for (int kk = 0; kk < n; ++kk) {
    const float x = a.at(r, kk);
#pragma unroll
    for (int j = 0; j < kScoreCols; ++j) acc[j] += x * b.at(lane + kLanes * j, kk);
  }
}

// acc[c] += sum_j p[r][j] * m[j][lane + kLanes c] for the output columns below n.
__device__ __forceinline__ void accumulate(float (&acc)[kOutCols], Tile p, Tile m, int n, int r,
                                           int lane) {
  for (int j = 0; j < kTile; ++j) {
    const float x = p.at(r, j);
#pragma unroll
    for (int c = 0; c < kOutCols; ++c) {
      if (lane + kLanes * c < n) acc[c] += x * m.at(j, lane + kLanes * c);
    }
  }
}

// Sum and max over the kLanes consecutive threads of one tile row (every thread must call).
__device__ __forceinline__ float row_sum(float v) {
  for (int o = 1; o < kLanes; o *= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float row_max(float v) {
  for (int o = 1; o < kLanes; o *= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// P = exp(scale * score - lse) where visible, else 0 (and 0 everywhere when lse is -inf: no keys).
__device__ __forceinline__ float prob(float score, float lse, bool vis, float scale) {
  return vis && lse != -INFINITY ? expf(score * scale - lse) : 0.0f;
}

template <typename T>
__device__ void store_row(T* dst, const float (&acc)[kOutCols], int n, int lane, float mul) {
#pragma unroll
  for (int c = 0; c < kOutCols; ++c) {
    if (lane + kLanes * c < n) dst[lane + kLanes * c] = convert<T>(acc[c] * mul);
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                         FlashAttentionShape s) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(s.d), dv = static_cast<int>(s.dv);
  const int64_t q_tiles = ceil_div(s.tq, kTile);
  const int64_t bh = blockIdx.x / q_tiles, q0 = (blockIdx.x % q_tiles) * kTile;
  const Tile qs = tile_after(smem, d), ks = tile_after(qs.end(), d);
  const Tile vs = tile_after(ks.end(), dv), ps = tile_after(vs.end(), kTile);
  q += bh * s.tq * d;
  k += bh / s.group * s.tk * d;
  v += bh / s.group * s.tk * dv;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t i = q0 + r;
  load_tile(qs, q, q0, s.tq, d);
  float m = -INFINITY, l = 0.0f, acc[kOutCols];
#pragma unroll
  for (int c = 0; c < kOutCols; ++c) acc[c] = 0.0f;
  // Causal: key tiles past the block's last query are fully masked and skipped.
  for (int64_t k0 = 0; k0 < key_end(s, q0); k0 += kTile) {
    __syncthreads();  // the previous tile's reads are done
    load_tile(ks, k, k0, s.tk, d);
    load_tile(vs, v, k0, s.tk, dv);
    __syncthreads();
    float sc[kScoreCols];
    dot_rows(sc, qs, ks, d, r, lane);
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kScoreCols; ++j) {
      sc[j] = visible(i, k0 + lane + kLanes * j, s) ? sc[j] * s.scale : -INFINITY;
      tile_max = fmaxf(tile_max, sc[j]);
    }
    const float m_new = fmaxf(m, row_max(tile_max));
    const float alpha = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kScoreCols; ++j) {
      const float p = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - m_new);
      sum += p;  // the softmax's, undropped
      ps.at(r, lane + kLanes * j) =
          s.dropout.active() && p != 0.0f ? p * s.dropout.factor(bh, i, k0 + lane + kLanes * j) : p;
    }
    l = l * alpha + row_sum(sum);
    m = m_new;
#pragma unroll
    for (int c = 0; c < kOutCols; ++c) acc[c] *= alpha;
    __syncthreads();
    accumulate(acc, ps, vs, dv, r, lane);
  }
  if (i < s.tq) {
    store_row(out + (bh * s.tq + i) * dv, acc, dv, lane, l > 0.0f ? 1.0f / l : 0.0f);
    if (lane == 0) lse[bh * s.tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(T* dq, float* delta, const T* grad_out, const T* q, const T* k,
                             const T* v, const float* lse, FlashAttentionShape s,
                             bool delta_given) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(s.d), dv = static_cast<int>(s.dv);
  const int64_t q_tiles = ceil_div(s.tq, kTile);
  const int64_t bh = blockIdx.x / q_tiles, q0 = (blockIdx.x % q_tiles) * kTile;
  const Tile qs = tile_after(smem, d), gs = tile_after(qs.end(), dv);
  const Tile ks = tile_after(gs.end(), d), vs = tile_after(ks.end(), dv);
  const Tile ps = tile_after(vs.end(), kTile);
  q += bh * s.tq * d;
  grad_out += bh * s.tq * dv;
  k += bh / s.group * s.tk * d;
  v += bh / s.group * s.tk * dv;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t i = q0 + r;
  const float li = i < s.tq ? lse[bh * s.tq + i] : -INFINITY;
  load_tile(qs, q, q0, s.tq, d);
  load_tile(gs, grad_out, q0, s.tq, dv);
  // Pass 1: delta_i = sum_j P_ij dP_ij with dP = dO v^T.  Pass 2: dq_i += sum_j dS_ij k_j.
  // delta_given: delta_i is read, pass 1 skipped (uniform over the block: every thread skips it).
  float di = delta_given && i < s.tq ? delta[bh * s.tq + i] : 0.0f, acc[kOutCols];
#pragma unroll
  for (int c = 0; c < kOutCols; ++c) acc[c] = 0.0f;
  for (int pass = delta_given ? 1 : 0; pass < 2; ++pass) {
    float dsum = 0.0f;
    for (int64_t k0 = 0; k0 < key_end(s, q0); k0 += kTile) {
      __syncthreads();
      load_tile(ks, k, k0, s.tk, d);
      load_tile(vs, v, k0, s.tk, dv);
      __syncthreads();
      float p[kScoreCols], dp[kScoreCols];
      dot_rows(p, qs, ks, d, r, lane);
      dot_rows(dp, gs, vs, dv, r, lane);
#pragma unroll
      for (int j = 0; j < kScoreCols; ++j) {
        p[j] = prob(p[j], li, visible(i, k0 + lane + kLanes * j, s), s.scale);
        if (s.dropout.active() && p[j] != 0.0f)
          dp[j] *= s.dropout.factor(bh, i, k0 + lane + kLanes * j);
        if (pass == 0) {
          dsum += p[j] * dp[j];
        } else {
          ps.at(r, lane + kLanes * j) = p[j] * (dp[j] - di) * s.scale;
        }
      }
      if (pass == 1) {
        __syncthreads();
        accumulate(acc, ps, ks, d, r, lane);
      }
    }
    if (pass == 0) di = row_sum(dsum);
  }
  if (i < s.tq) {
    if (lane == 0 && !delta_given) delta[bh * s.tq + i] = di;
    store_row(dq + (bh * s.tq + i) * d, acc, d, lane, 1.0f);
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(T* dk, T* dv_out, const float* delta, const T* grad_out, const T* q,
                               const T* k, const T* v, const float* lse, FlashAttentionShape s) {
  extern __shared__ float smem[];
  const int d = static_cast<int>(s.d), dv = static_cast<int>(s.dv);
  const int64_t k_tiles = ceil_div(s.tk, kTile);
  // One key/value row kv per block row of tiles; its group's query rows kv * group.. in turn.
  const int64_t kv = blockIdx.x / k_tiles, k0 = (blockIdx.x % k_tiles) * kTile;
  const Tile ks = tile_after(smem, d), vs = tile_after(ks.end(), dv);
  const Tile qs = tile_after(vs.end(), d), gs = tile_after(qs.end(), dv);
  const Tile ps = tile_after(gs.end(), kTile);
  float* lse_s = ps.end();
  float* delta_s = lse_s + kTile;
  k += kv * s.tk * d;
  v += kv * s.tk * dv;
  // Here a tile row is a key j; the 16 columns of a thread are queries.
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t j = k0 + r;
  load_tile(ks, k, k0, s.tk, d);
  load_tile(vs, v, k0, s.tk, dv);
  float acc_dk[kOutCols], acc_dv[kOutCols];
#pragma unroll
  for (int c = 0; c < kOutCols; ++c) acc_dk[c] = acc_dv[c] = 0.0f;
  for (int64_t bh = kv * s.group; bh < (kv + 1) * s.group; ++bh) {
    const T* qh = q + bh * s.tq * d;
    const T* gh = grad_out + bh * s.tq * dv;
    const float* lse_h = lse + bh * s.tq;
    const float* delta_h = delta + bh * s.tq;
    // Causal: queries before k0 - causal_offset see none of this tile's keys.
    for (int64_t q0 = query_begin(s, k0); q0 < s.tq; q0 += kTile) {
      __syncthreads();
      load_tile(qs, qh, q0, s.tq, d);
      load_tile(gs, gh, q0, s.tq, dv);
      for (int x = threadIdx.x; x < kTile; x += blockDim.x) {
        lse_s[x] = q0 + x < s.tq ? lse_h[q0 + x] : -INFINITY;
        delta_s[x] = q0 + x < s.tq ? delta_h[q0 + x] : 0.0f;
      }
      __syncthreads();
      float p[kScoreCols], dp[kScoreCols], drop[kScoreCols];
      dot_rows(p, ks, qs, d, r, lane);    // scores^T
      dot_rows(dp, vs, gs, dv, r, lane);  // dP^T
#pragma unroll
      for (int c = 0; c < kScoreCols; ++c) {
        const int x = lane + kLanes * c;
        p[c] = prob(p[c], lse_s[x], visible(q0 + x, j, s), s.scale);
        // Under dropout: dv from the dropped P, dP^T through the mask (drop[c] is that factor).
        drop[c] = s.dropout.active() && p[c] != 0.0f ? s.dropout.factor(bh, q0 + x, j) : 1.0f;
        ps.at(r, x) = p[c] * drop[c];
      }
      __syncthreads();
      accumulate(acc_dv, ps, gs, dv, r, lane);
      __syncthreads();
#pragma unroll
      for (int c = 0; c < kScoreCols; ++c) {
        const int x = lane + kLanes * c;
        ps.at(r, x) = p[c] * (dp[c] * drop[c] - delta_s[x]) * s.scale;
      }
      __syncthreads();
      accumulate(acc_dk, ps, qs, d, r, lane);
    }
  }
  if (j < s.tk) {
    store_row(dk + (kv * s.tk + j) * d, acc_dk, d, lane, 1.0f);
    store_row(dv_out + (kv * s.tk + j) * dv, acc_dv, dv, lane, 1.0f);
  }
}

// Shared-memory bytes of a kernel holding `d_tiles` tiles of d columns, `dv_tiles` of dv, one
// (kTile, kTile) P/dS tile and `extra` floats.
size_t smem_bytes(const FlashAttentionShape& s, int d_tiles, int dv_tiles, int extra) {
  const int64_t floats =
      kTile * (d_tiles * (s.d + 1) + dv_tiles * (s.dv + 1) + (kTile + 1)) + extra;
  return static_cast<size_t>(floats) * sizeof(float);
}

void check_shape(const FlashAttentionShape& s, const char* op) {
  LOOM_CHECK(s.d >= 1 && s.d <= kFlashMaxHeadDim && s.dv >= 1 && s.dv <= kFlashMaxHeadDim,
             "{}: the fused CUDA attention supports head dims 1..{}, got D = {} and Dv = {}", op,
             kFlashMaxHeadDim, s.d, s.dv);
}

template <typename Kernel, typename... Args>
void launch(Kernel kernel, const char* name, int64_t blocks, size_t bytes, int device,
            Args... args) {
  flash::launch(kernel, name, blocks, kFlashThreads, bytes, device, args...);
}

}  // namespace

void flash_attention_forward(DType dtype, void* out, float* lse, const void* q, const void* k,
                             const void* v, const FlashAttentionShape& s, int device) {
  check_shape(s, "flash_attention_forward");
  if (s.rows == 0 || s.tq == 0) return;
  if (tensor_core_attention_takes(dtype, s, {out, q, k, v})) {
    return mma_attention_forward(dtype, out, lse, q, k, v, s, contiguous_layouts(s), device);
  }
  visit_floating(dtype, "flash_attention_forward", [&](auto tag) {
    using T = decltype(tag);
    launch(flash_forward_kernel<T>, "flash_forward_kernel", s.rows * ceil_div(s.tq, kTile),
           smem_bytes(s, 2, 1, 0), device, static_cast<T*>(out), lse, static_cast<const T*>(q),
           static_cast<const T*>(k), static_cast<const T*>(v), s);
  });
}

void flash_attention_backward(DType dtype, void* dq, void* dk, void* dv, float* delta,
                              const void* grad_out, const void* q, const void* k, const void* v,
                              const float* lse, const FlashAttentionShape& s, int device,
                              bool delta_given) {
  check_shape(s, "flash_attention_backward");
  if (s.rows == 0) return;
  if (tensor_core_attention_takes(dtype, s, {dq, dk, dv, grad_out, q, k, v})) {
    return mma_attention_backward(dtype, dq, dk, dv, delta, grad_out, q, k, v, lse, s,
                                  contiguous_layouts(s), device, delta_given);
  }
  visit_floating(dtype, "flash_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    const auto g = static_cast<const T*>(grad_out);
    const auto qt = static_cast<const T*>(q), kt = static_cast<const T*>(k);
    const auto vt = static_cast<const T*>(v);
    const size_t bytes = smem_bytes(s, 2, 2, 0);
    if (s.tq > 0) {
      launch(flash_backward_dq_kernel<T>, "flash_backward_dq_kernel",
             s.rows * ceil_div(s.tq, kTile), bytes, device, static_cast<T*>(dq), delta, g, qt, kt,
             vt, lse, s, delta_given);
    }
    if (s.tk > 0) {
      // With tq == 0 every key's gradient is 0: the loop over query tiles is empty.
      launch(flash_backward_dkdv_kernel<T>, "flash_backward_dkdv_kernel",
             s.rows / s.group * ceil_div(s.tk, kTile), bytes + 2 * kTile * sizeof(float), device,
             static_cast<T*>(dk), static_cast<T*>(dv), static_cast<const float*>(delta), g, qt, kt,
             vt, lse, s);
    }
  });
}

}  // namespace loom::cuda::kernels
