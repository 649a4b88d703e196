// Fused attention on tensor cores, FlashAttention-2 style, for bf16 and f16 with head dims
// D == Dv in {16, 32, 64, 128} (flash_attention_mma.h); the plain CUDA kernels of
// flash_attention.cu take every other shape and stay as this one's oracle in the tests.
//
// Tiles of 64 queries by 64 keys, 4 warps per block, each warp owning 16 rows of the tile. The
// products run as `mma.sync.aligned.m16n8k16` (bf16/f16 in, f32 accumulate) on operands read
// from shared memory as 32-bit pairs; the fragment layouts are PTX's (ISA, "Matrix Fragments for
// mma.m16n8k16"): for lane = 4 g + t,
//   A (16 x 16, row-major): {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},
//   B (16 x 8, "col"):      {B[2t..][g], B[2t+8..][g]} (each pair down a column of B),
//   C (16 x 8, f32):        C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
// So a thread holds rows g and g + 8 of its warp's strip of every product: the online softmax
// runs in registers (row max and sum over the 4 threads of a row by two shuffles), and the
// probabilities P, converted to the inputs' dtype, are already the A operand of P V (C tiles 2s
// and 2s + 1 are A's k-step s). Every tile is stored once, row-major, as it is in global memory
// (16-byte stores), and every operand is read by `ldmatrix` (four 8 x 8 matrices per
// instruction): A operands and B operands whose columns are the tile's rows (K for S = Q K^T)
// as they are, B operands whose rows are the tile's rows (V for P V; in the backward K for dS K,
// dO for P^T dO and Q for dS^T Q) with `.trans`, which hands each lane the transposed pairs.
// Rows are padded by 8 elements (16 bytes) so the 8 rows each ldmatrix phase reads fall in
// distinct banks.
//
// Numerics (the plain kernels' semantics; tolerances in cuda_attention_test): scores and
// softmax in f32 (exp2 of log2-scaled scores), P rounded to the inputs' dtype before the P V
// product (as FlashAttention), l summed from the unrounded P, out rounded once; logsumexp f32.
// The backward recomputes P from the saved logsumexp and, like the plain kernels, reads delta as
// given (delta_given: the op's rowsum(dO * out), attention_row_dots.cu) or else takes
// rowsum(P * dP) over the key tiles in the dq kernel, before the dk/dv kernel uses it; no
// atomics, so results repeat bit for bit. Dropout (s.dropout active) draws each element's keep
// factor in the registers that hold its P (tensor/attention_dropout_mask.h): P V takes the
// dropped P, rounded as the undropped one is; the backward redraws it for dP and for dv's P.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <type_traits>

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

constexpr int kWarps = 4;  // each owns 16 rows of a tile
constexpr int kMmaThreads = kWarps * 32;
constexpr int kPad = 8;  // elements of padding per shared row (16 bytes)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The switch: 1 on, 0 off, -1 not yet read from LOOM_TENSOR_CORE_ATTENTION.
std::atomic<int> g_tensor_cores{-1};
std::atomic<size_t> g_shared_memory_cap{0};  // set_attention_shared_memory_limit; 0: none

// ---- the mma instruction and operands -----------------------------------------------------------

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef LOOM_CUDA_EMULATED  // tools/cuda_emulator/device: the same fragments on a CPU
  loom_emu::mma_m16n8k16<T>(c, a, b);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane 8 i + r gives the address of row r of 8 x 8
// matrix i (16 bytes, 16-byte aligned); lane 4 g + t receives in x[i] matrix i's elements
// [g][2t] (low half) and [g][2t + 1]: the fragments mma reads, four per instruction.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&x)[4], const void* row) {
#ifdef LOOM_CUDA_EMULATED  // tools/cuda_emulator/device: the same exchange on a CPU
  loom_emu::ldmatrix_x4(x, row);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
               : "r"(address));
#endif
}

// The same with .trans: lane 4 g + t receives matrix i's elements [2t][g] (low half) and
// [2t + 1][g], the transposed pairs.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&x)[4], const void* row) {
#ifdef LOOM_CUDA_EMULATED  // tools/cuda_emulator/device: the same exchange on a CPU
  loom_emu::ldmatrix_x4_trans(x, row);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
               : "r"(address));
#endif
}

// cp.async.cg.shared.global (sm_80+): 16 bytes from global to shared memory, in flight while the
// thread goes on (zeros, reading nothing, when !valid). A thread's copies join a group at its
// next cp_async_commit() and land by a cp_async_wait(n) that leaves at most n newer groups in
// flight (n is 0 or 1); a __syncthreads() after it shows them to every thread.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#ifdef LOOM_CUDA_EMULATED  // tools/cuda_emulator/device: a copy at once
  loom_emu::cp_async_16(dst, src, valid);
#else
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef LOOM_CUDA_EMULATED
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

__device__ __forceinline__ void cp_async_wait(int newer_in_flight) {
#ifndef LOOM_CUDA_EMULATED
  if (newer_in_flight == 0) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  }
#endif
}

// Two f32 values as one register of two T, `lo` in the low half (the lower column). Registers
// change type by memcpy, never by reading one type through a pointer to another (which a C++
// compiler may reorder: the emulated device, built by g++, did).
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    memcpy(&bits, &h, sizeof(bits));
    return bits;
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    uint32_t bits;
    memcpy(&bits, &h, sizeof(bits));
    return bits;
  }
}

template <typename T>
__device__ __forceinline__ void unpack(uint32_t x, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 h;
    memcpy(&h, &x, sizeof(h));
    lo = __bfloat162float(h.x);
    hi = __bfloat162float(h.y);
  } else {
    __half2 h;
    memcpy(&h, &x, sizeof(h));
    lo = __half2float(h.x);
    hi = __half2float(h.y);
  }
}

// A shared-memory matrix of T with `stride` elements per row (a multiple of 8, so every 8
// columns start 16-byte aligned, as ldmatrix needs).
template <typename T>
struct Smem {
  T* p;
  int stride;
};

// Lane 8 i + r's row address for ldmatrix over the 16 x 16 block at (r0, c0) of `m`: matrix i
// is rows r0 + 8 (i & 1) on and columns c0 + 8 (i >> 1) on, or (cols_first) the other way.
template <typename T>
__device__ __forceinline__ const T* block_row(Smem<T> m, int r0, int c0, int lane,
                                              bool cols_first) {
  const int matrix = lane / 8, r = lane % 8;
  const int down = cols_first ? matrix >> 1 : matrix & 1,
            right = cols_first ? matrix & 1 : matrix >> 1;
  return m.p + (r0 + r + 8 * down) * m.stride + c0 + 8 * right;
}

// The A operand of rows [r0, r0 + 16) and columns [c0, c0 + 16) of a row-major matrix: one
// ldmatrix (a0: rows r0.., a1: rows r0 + 8.., a2 and a3 the same 8 columns on).
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], Smem<T> m, int r0, int c0, int lane) {
  ldmatrix_x4(a, block_row(m, r0, c0, lane, /*cols_first=*/false));
}

// The B operands (k 16 x n 8) of n-tiles n0 and n0 + 8 whose column n is row n0 + n of `m`, over
// m's columns [k0, k0 + 16): B = (rows [n0, n0 + 16) of m)^T, one ldmatrix (b0: columns k0.. and
// k0 + 8.. of rows n0.., b1 the same of rows n0 + 8..).
template <typename T>
__device__ __forceinline__ void load_b(uint32_t (&b0)[2], uint32_t (&b1)[2], Smem<T> m, int n0,
                                       int k0, int lane) {
  uint32_t x[4];
  ldmatrix_x4(x, block_row(m, n0, k0, lane, /*cols_first=*/true));
  b0[0] = x[0];
  b0[1] = x[1];
  b1[0] = x[2];
  b1[1] = x[3];
}

// The B operands of n-tiles n0 and n0 + 8 over rows [k0, k0 + 16) of `m`, whose rows are B's k:
// B = m's block itself, read by one ldmatrix.trans (matrices: rows k0.. and k0 + 8.. of columns
// n0.., then of columns n0 + 8..).
template <typename T>
__device__ __forceinline__ void load_b_trans(uint32_t (&b0)[2], uint32_t (&b1)[2], Smem<T> m,
                                             int k0, int n0, int lane) {
  uint32_t x[4];
  ldmatrix_x4_trans(x, block_row(m, k0, n0, lane, /*cols_first=*/false));
  b0[0] = x[0];
  b0[1] = x[1];
  b1[0] = x[2];
  b1[1] = x[3];
}

// The A operand of k-step s from f32 C tiles of 8 columns: tiles 2s and 2s + 1, scaled.
template <typename T>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack<T>(lo[0], lo[1]);
  a[1] = pack<T>(lo[2], lo[3]);
  a[2] = pack<T>(hi[0], hi[1]);
  a[3] = pack<T>(hi[2], hi[3]);
}

// c = rows [w0, w0 + 16) of `a` times the kTile rows of `b`, transposed, over D columns: one
// warp's 16 x kTile strip of A B^T (S = Q K^T, dP = dO V^T, and their transposes).
template <typename T, int D>
__device__ __forceinline__ void strip_product(float (&c)[kTile / 8][4], Smem<T> a, Smem<T> b,
                                              int w0, int lane) {
#pragma unroll
  for (int j = 0; j < kTile / 8; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    uint32_t frag_a[4];
    load_a(frag_a, a, w0, kk, lane);
#pragma unroll
    for (int j = 0; j < kTile / 8; j += 2) {
      uint32_t b0[2], b1[2];
      load_b(b0, b1, b, 8 * j, kk, lane);
      mma<T>(c[j], frag_a, b0);
      mma<T>(c[j + 1], frag_a, b1);
    }
  }
}

// acc += c m, where c is a warp's 16 x kTile strip in C tiles (rounded to T as the A operand)
// and `m` (kTile x D) is row-major: O += P V, dq += dS K, dv += P^T dO, dk += dS^T Q.
template <typename T, int D>
__device__ __forceinline__ void accumulate_strip(float (&acc)[D / 8][4],
                                                 const float (&c)[kTile / 8][4], Smem<T> m,
                                                 int lane) {
#pragma unroll
  for (int step = 0; step < kTile / 16; ++step) {
    uint32_t a[4];
    c_to_a<T>(a, c[2 * step], c[2 * step + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b0[2], b1[2];
      load_b_trans(b0, b1, m, 16 * step, 8 * n, lane);
      mma<T>(acc[n], a, b0);
      mma<T>(acc[n + 1], a, b1);
    }
  }
}

// Row r (0: g, 1: g + 8) of a warp's 16 x D strip, times `mul`, into dst (that row's D values).
template <typename T, int D>
__device__ __forceinline__ void store_strip_row(T* dst, const float (&acc)[D / 8][4], int r,
                                                float mul, int t) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    *reinterpret_cast<uint32_t*>(dst + 8 * n + 2 * t) =
        pack<T>(acc[n][2 * r] * mul, acc[n][2 * r + 1] * mul);
  }
}

template <int D>
__device__ __forceinline__ void zero(float (&acc)[D / 8][4]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// ---- tiles: global -> shared
// ---------------------------------------------------------------------

// Rows [row0, row0 + kTile) of a (total, D) matrix whose rows are `stride` apart into `rows`
// (kTile x D, row-major) by 16-byte asynchronous copies (the caller commits and waits); rows past
// `total` are zero. total > 0.
template <typename T, int D>
__device__ void load_tile(Smem<T> rows, const T* src, int64_t stride, int64_t row0, int64_t total) {
  constexpr int kVec = 8;  // elements per 16-byte copy
  for (int idx = threadIdx.x; idx < kTile * D / kVec; idx += blockDim.x) {
    const int r = idx / (D / kVec), c = idx % (D / kVec) * kVec;
    const int64_t row = row0 + r;
    const bool inside = row < total;
    cp_async_16(rows.p + r * rows.stride + c, src + (inside ? row : 0) * stride + c, inside);
  }
}

// Matrix bh of an operand laid out as `r` says.
template <typename P>
__device__ __forceinline__ P* matrix(P* base, const AttentionRows& r, int64_t bh) {
  return base + (bh / r.heads) * r.batch_stride + (bh % r.heads) * r.head_stride;
}

// Shared-row stride in elements: a tile's rows of D, padded.
template <int D>
inline constexpr int kRowStride = D + kPad;
// Dynamic shared memory of each kernel: its tiles, `Stages` of each one it loops over (2: the
// next one copied in while the current one is used; 1: for GPUs whose blocks cannot hold two,
// TilePipeline below), and the dk/dv kernel's lse and delta rows.
template <typename T, int D>
inline constexpr size_t kTileBytes = sizeof(T) * kTile* kRowStride<D>;
template <typename T, int D, int Stages>
inline constexpr size_t kForwardSmem = (1 + 2 * Stages) * kTileBytes<T, D>;  // Q, (K, V) each
template <typename T, int D, int Stages>
inline constexpr size_t kDqSmem = (2 + 2 * Stages) * kTileBytes<T, D>;  // Q, dO, (K, V) each
template <typename T, int D, int Stages>
inline constexpr size_t kDkdvSmem = (2 + 2 * Stages) * kTileBytes<T, D> + 2 * kTile * sizeof(float);

// Tile buffer i of a kernel's shared memory.
template <typename T, int D>
__device__ __forceinline__ Smem<T> tile_buffer(unsigned char* smem, int i) {
  return {reinterpret_cast<T*>(smem) + i * kTile * kRowStride<D>, kRowStride<D>};
}

// The two operands a kernel loops over together, tile by tile (K and V; Q and dO in the dk/dv
// kernel), in `Stages` buffers: buffer `buf` holds a[buf] and b[buf]. A loop fetches its first
// tiles into buffer 0; then each step
//   prefetch(buf, next)      with two buffers, copies the next tiles into the other one now,
//                            to land while this step computes;
//   wait_for_current()       every group but the newest has landed (two buffers), or all have
//                            (one), and every thread sees it;
//   ... compute on buffer buf, then __syncthreads() (the buffer's reads are done) ...
//   refill(next)             with one buffer, copies the next tiles into it only now;
//   buf = following(buf).
// Two buffers hide the copies behind the products; one costs exposed copies but fits GPUs whose
// blocks have less shared memory (sm_86 / sm_89: 99 KiB; the D = 128 backward needs 102 KiB
// with two).
template <typename T, int D, int Stages>
struct TilePipeline {
  static_assert(Stages == 1 || Stages == 2, "one or two buffers per operand");
  Smem<T> a[Stages], b[Stages];
  const T* a_src;
  int64_t a_stride;
  const T* b_src;
  int64_t b_stride;
  int64_t total;  // the operands' rows

  // Operand a in tile buffers [first, first + Stages), b in the next Stages.
  __device__ static TilePipeline in(unsigned char* smem, int first, const T* a_src,
                                    int64_t a_stride, const T* b_src, int64_t b_stride,
                                    int64_t total) {
    TilePipeline p{{}, {}, a_src, a_stride, b_src, b_stride, total};
    for (int i = 0; i < Stages; ++i) {
      p.a[i] = tile_buffer<T, D>(smem, first + i);
      p.b[i] = tile_buffer<T, D>(smem, first + Stages + i);
    }
    return p;
  }

  // Rows [row0, row0 + kTile) of both operands into buffer buf when row0 < end, committed as
  // one group (an empty one otherwise, so that every step commits one).
  __device__ void fetch(int buf, int64_t row0, int64_t end) const {
    if (row0 < end) {
      load_tile<T, D>(a[buf], a_src, a_stride, row0, total);
      load_tile<T, D>(b[buf], b_src, b_stride, row0, total);
    }
    cp_async_commit();
  }
  __device__ void prefetch(int buf, int64_t next, int64_t end) const {
    if constexpr (Stages == 2) fetch(buf ^ 1, next, end);
  }
  __device__ static void wait_for_current() {
    cp_async_wait(Stages - 1);
    __syncthreads();
  }
  __device__ void refill(int64_t next, int64_t end) const {
    if constexpr (Stages == 1) fetch(0, next, end);
  }
  __device__ static int following(int buf) { return Stages == 2 ? buf ^ 1 : 0; }
};

// ---- forward ------------------------------------------------------------------------------------

template <typename T, int D, int Stages>
__global__ void __launch_bounds__(kMmaThreads)
    mma_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                       FlashAttentionShape s, AttentionLayouts L) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Smem<T> qs = tile_buffer<T, D>(smem_raw, 0);
  const int64_t q_tiles = ceil_div(s.tq, kTile);
  const int64_t bh = blockIdx.x / q_tiles, q0 = (blockIdx.x % q_tiles) * kTile;
  q = matrix(q, L.q, bh);
  k = matrix(k, L.k, bh / s.group);
  v = matrix(v, L.v, bh / s.group);
  out = matrix(out, L.o, bh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int w0 = warp * 16;  // the warp's first row in the tile
  const int64_t row[2] = {q0 + w0 + g, q0 + w0 + g + 8};
  float o[D / 8][4];
  zero<D>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale = s.scale * kLog2e;  // scores in log2 units
  const int64_t end = key_end(s, q0);
  using Tiles = TilePipeline<T, D, Stages>;
  const Tiles kv = Tiles::in(smem_raw, 1, k, L.k.row_stride, v, L.v.row_stride, s.tk);
  load_tile<T, D>(qs, q, L.q.row_stride, q0, s.tq);  // in the first key tiles' group
  kv.fetch(0, 0, end);
  int buf = 0;
  for (int64_t k0 = 0; k0 < end; k0 += kTile, buf = Tiles::following(buf)) {
    kv.prefetch(buf, k0 + kTile, end);
    Tiles::wait_for_current();
    float sc[kTile / 8][4];
    strip_product<T, D>(sc, qs, kv.a[buf], w0, lane);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = k0 + 8 * j + 2 * t + (e & 1);
        const float x = visible(row[e >> 1], col, s) ? sc[j][e] * scale : -INFINITY;
        sc[j][e] = x;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      }
    }
    float base[2], alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      base[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row without a visible key yet
      alpha[r] = exp2f(m[r] - base[r]);             // 0 while m is -inf
      m[r] = m_new;
    }
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[j][e] - base[e >> 1]);
        sum[e >> 1] += p;  // the softmax's, undropped
        sc[j][e] = s.dropout.active() && p != 0.0f
                       ? p * s.dropout.factor(bh, row[e >> 1], k0 + 8 * j + 2 * t + (e & 1))
                       : p;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];  // this thread's columns
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    }
    accumulate_strip<T, D>(o, sc, kv.b[buf], lane);
    __syncthreads();  // the tile's reads are done before the next step copies into its buffer
    kv.refill(k0 + kTile, end);
  }
  cp_async_wait(0);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (row[r] >= s.tq) continue;
    store_strip_row<T, D>(out + row[r] * L.o.row_stride, o, r, l[r] > 0.0f ? 1.0f / l[r] : 0.0f, t);
    if (t == 0) lse[bh * s.tq + row[r]] = l[r] > 0.0f ? m[r] * kLn2 + logf(l[r]) : -INFINITY;
  }
}

// ---- backward -----------------------------------------------------------------------------------

// P = exp(scale * score - lse) of a visible entry (0 otherwise, and where lse is -inf), from the
// f32 product `score`; lse2 is lse in log2 units.
__device__ __forceinline__ float prob(float score, float lse2, bool vis, float scale2) {
  return vis && lse2 != -INFINITY ? exp2f(score * scale2 - lse2) : 0.0f;
}

// One block per query tile: pass 0 sums delta_i = sum_j P_ij dP_ij over the key tiles (skipped
// when delta_given: read instead); pass 1 accumulates dq_i = scale sum_j dS_ij k_j with
// dS = P (dP - delta). S = Q K^T, dP = dO V^T and dS K, all from row-major K and V.
template <typename T, int D, int Stages>
__global__ void __launch_bounds__(kMmaThreads)
    mma_backward_dq_kernel(T* dq, float* delta, const T* grad_out, const T* q, const T* k,
                           const T* v, const float* lse, FlashAttentionShape s, AttentionLayouts L,
                           bool delta_given) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Smem<T> qs = tile_buffer<T, D>(smem_raw, 0), gs = tile_buffer<T, D>(smem_raw, 1);
  const int64_t q_tiles = ceil_div(s.tq, kTile);
  const int64_t bh = blockIdx.x / q_tiles, q0 = (blockIdx.x % q_tiles) * kTile;
  q = matrix(q, L.q, bh);
  grad_out = matrix(grad_out, L.o, bh);
  k = matrix(k, L.k, bh / s.group);
  v = matrix(v, L.v, bh / s.group);
  dq = matrix(dq, L.dq, bh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int w0 = warp * 16;
  const int64_t row[2] = {q0 + w0 + g, q0 + w0 + g + 8};
  float lse2[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = row[r] < s.tq ? lse[bh * s.tq + row[r]] * kLog2e : -INFINITY;
    di[r] = delta_given && row[r] < s.tq ? delta[bh * s.tq + row[r]] : 0.0f;
  }
  const float scale2 = s.scale * kLog2e;
  float acc[D / 8][4];
  zero<D>(acc);
  const int64_t end = key_end(s, q0);
  using Tiles = TilePipeline<T, D, Stages>;
  const Tiles kv = Tiles::in(smem_raw, 2, k, L.k.row_stride, v, L.v.row_stride, s.tk);
  // Q and dO join the first key tiles' group.
  load_tile<T, D>(qs, q, L.q.row_stride, q0, s.tq);
  load_tile<T, D>(gs, grad_out, L.o.row_stride, q0, s.tq);
  for (int pass = delta_given ? 1 : 0; pass < 2; ++pass) {
    float dsum[2] = {0.0f, 0.0f};
    kv.fetch(0, 0, end);
    int buf = 0;
    for (int64_t k0 = 0; k0 < end; k0 += kTile, buf = Tiles::following(buf)) {
      kv.prefetch(buf, k0 + kTile, end);
      Tiles::wait_for_current();
      float p[kTile / 8][4], dp[kTile / 8][4];
      strip_product<T, D>(p, qs, kv.a[buf], w0, lane);
      strip_product<T, D>(dp, gs, kv.b[buf], w0, lane);
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int64_t col = k0 + 8 * j + 2 * t + (e & 1);
          const float pe = prob(p[j][e], lse2[r], visible(row[r], col, s), scale2);
          // dP of the dropped probabilities under dropout
          const float dpe = s.dropout.active() && pe != 0.0f
                                ? dp[j][e] * s.dropout.factor(bh, row[r], col)
                                : dp[j][e];
          if (pass == 0) {
            dsum[r] += pe * dpe;
          } else {
            p[j][e] = pe * (dpe - di[r]) * s.scale;  // dS, scaled
          }
        }
      }
      if (pass == 1) accumulate_strip<T, D>(acc, p, kv.a[buf], lane);
      __syncthreads();  // the tile's reads are done before the next step copies into its buffer
      kv.refill(k0 + kTile, end);
    }
    if (pass == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dsum[r] += __shfl_xor_sync(0xffffffffu, dsum[r], 1);
        dsum[r] += __shfl_xor_sync(0xffffffffu, dsum[r], 2);
        di[r] = dsum[r];
      }
    }
  }
  cp_async_wait(0);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= s.tq) continue;
    if (t == 0 && !delta_given) delta[bh * s.tq + row[r]] = di[r];
    store_strip_row<T, D>(dq + row[r] * L.dq.row_stride, acc, r, 1.0f, t);
  }
}

// One block per key tile, a warp per 16 keys, looping over the query tiles that see them:
// S^T = K Q^T, dP^T = V dO^T, dv += P^T dO and dk += dS^T Q, all from row-major Q and dO.
template <typename T, int D, int Stages>
__global__ void __launch_bounds__(kMmaThreads)
    mma_backward_dkdv_kernel(T* dk, T* dv_out, const float* delta, const T* grad_out, const T* q,
                             const T* k, const T* v, const float* lse, FlashAttentionShape s,
                             AttentionLayouts L) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Smem<T> ks = tile_buffer<T, D>(smem_raw, 0), vs = tile_buffer<T, D>(smem_raw, 1);
  float* lse_s = reinterpret_cast<float*>(tile_buffer<T, D>(smem_raw, 2 + 2 * Stages).p);
  float* delta_s = lse_s + kTile;
  const int64_t k_tiles = ceil_div(s.tk, kTile);
  // One key/value matrix kv per block row of tiles; its group's query matrices kv * group.. in
  // turn, accumulating into the same dk and dv.
  const int64_t kv = blockIdx.x / k_tiles, k0 = (blockIdx.x % k_tiles) * kTile;
  k = matrix(k, L.k, kv);
  v = matrix(v, L.v, kv);
  dk = matrix(dk, L.dk, kv);
  dv_out = matrix(dv_out, L.dv, kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int w0 = warp * 16;  // the warp's first key in the tile
  const int64_t key[2] = {k0 + w0 + g, k0 + w0 + g + 8};
  const float scale2 = s.scale * kLog2e;
  float acc_dk[D / 8][4], acc_dv[D / 8][4];
  zero<D>(acc_dk);
  zero<D>(acc_dv);
  const int64_t begin = query_begin(s, k0);
  using Tiles = TilePipeline<T, D, Stages>;
  // K and V join the first query tiles' group.
  load_tile<T, D>(ks, k, L.k.row_stride, k0, s.tk);
  load_tile<T, D>(vs, v, L.v.row_stride, k0, s.tk);
  for (int64_t bh = kv * s.group; bh < (kv + 1) * s.group; ++bh) {
    // Each query matrix's loop starts with no copy in flight (the last step prefetched none)
    // and every read of the buffers done (its closing __syncthreads).
    const float* lse_h = lse + bh * s.tq;
    const float* delta_h = delta + bh * s.tq;
    const Tiles qg = Tiles::in(smem_raw, 2, matrix(q, L.q, bh), L.q.row_stride,
                               matrix(grad_out, L.o, bh), L.o.row_stride, s.tq);
    qg.fetch(0, begin, s.tq);
    int buf = 0;
    for (int64_t q0 = begin; q0 < s.tq; q0 += kTile, buf = Tiles::following(buf)) {
      qg.prefetch(buf, q0 + kTile, s.tq);
      for (int x = threadIdx.x; x < kTile; x += blockDim.x) {
        lse_s[x] = q0 + x < s.tq ? lse_h[q0 + x] * kLog2e : -INFINITY;
        delta_s[x] = q0 + x < s.tq ? delta_h[q0 + x] : 0.0f;
      }
      Tiles::wait_for_current();
      float p[kTile / 8][4], dp[kTile / 8][4];  // transposed: rows are keys, columns queries
      strip_product<T, D>(p, ks, qg.a[buf], w0, lane);
      strip_product<T, D>(dp, vs, qg.b[buf], w0, lane);
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = 8 * j + 2 * t + (e & 1);  // the query's row in the tile
          const float pe = prob(p[j][e], lse_s[x], visible(q0 + x, key[e >> 1], s), scale2);
          // Under dropout: dP^T through the mask, and dv from the dropped P.
          const float drop =
              s.dropout.active() && pe != 0.0f ? s.dropout.factor(bh, q0 + x, key[e >> 1]) : 1.0f;
          dp[j][e] = pe * (dp[j][e] * drop - delta_s[x]) * s.scale;  // dS^T
          p[j][e] = pe * drop;
        }
      }
      accumulate_strip<T, D>(acc_dv, p, qg.b[buf], lane);
      accumulate_strip<T, D>(acc_dk, dp, qg.a[buf], lane);
      __syncthreads();  // the tile's reads are done before the next step refills its buffers
      qg.refill(q0 + kTile, s.tq);
    }
  }
  cp_async_wait(0);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= s.tk) continue;
    store_strip_row<T, D>(dk + key[r] * L.dk.row_stride, acc_dk, r, 1.0f, t);
    store_strip_row<T, D>(dv_out + key[r] * L.dv.row_stride, acc_dv, r, 1.0f, t);
  }
}

// ---- launching ----------------------------------------------------------------------------------

template <typename Kernel, typename... Args>
void launch(Kernel kernel, const char* name, int64_t blocks, size_t bytes, int device,
            Args... args) {
  flash::launch(kernel, name, blocks, kMmaThreads, bytes, device, args...);
}

// Calls f(T{}, std::integral_constant<int, D>{}) for the dtype and head dim (both supported).
template <typename F>
void visit(DType dtype, int64_t d, F&& f) {
  const auto with_d = [&](auto tag) {
    switch (d) {
      case 16:
        return f(tag, std::integral_constant<int, 16>{});
      case 32:
        return f(tag, std::integral_constant<int, 32>{});
      case 64:
        return f(tag, std::integral_constant<int, 64>{});
      case 128:
        return f(tag, std::integral_constant<int, 128>{});
    }
    LOOM_FAIL("tensor-core attention: head dim {} is not 16, 32, 64 or 128", d);
  };
  if (dtype == DType::kBFloat16) return with_d(__nv_bfloat16{});
  if (dtype == DType::kFloat16) return with_d(__half{});
  LOOM_FAIL("tensor-core attention: dtype {} is not bf16 or f16", static_cast<int>(dtype));
}

// The shared memory a block of `device` may use: its opt-in limit, or the cap if lower.
size_t shared_memory_per_block(int device) {
  int optin = 0;
  LOOM_CUDA_CHECK_ON(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), device);
  const size_t cap = g_shared_memory_cap.load();
  return cap > 0 && cap < static_cast<size_t>(optin) ? cap : static_cast<size_t>(optin);
}

// A kernel's plan: double-buffered tiles (`two` bytes) where they fit `limit`, else single-buffered
// ones (`one`), else none (0 buffers).
AttentionKernelPlan plan_for(size_t two, size_t one, size_t limit) {
  const int buffers = two <= limit ? 2 : one <= limit ? 1 : 0;
  return {buffers, buffers == 2 ? two : one, two, one};
}

// Calls f(std::integral_constant<int, Stages>{}) with the kernel's plan on `device`; fails naming
// both sizes and the limit when neither fits.
template <typename F>
void with_stages(const char* kernel, int d, size_t two, size_t one, int device, F&& f) {
  const size_t limit = shared_memory_per_block(device);
  switch (plan_for(two, one, limit).tile_buffers) {
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 1:
      return f(std::integral_constant<int, 1>{});
  }
  LOOM_FAIL(
      "tensor-core attention: {} at head dim {} needs {} bytes of shared memory per block with "
      "single-buffered tiles ({} double-buffered), but a block of device {} may use {}; "
      "cuda::kernels::set_tensor_core_attention(false) routes attention to the plain kernels",
      kernel, d, one, two, device, limit);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void set_tensor_core_attention(bool enabled) { g_tensor_cores.store(enabled ? 1 : 0); }
bool tensor_core_attention_enabled() {
  int on = g_tensor_cores.load();
  if (on >= 0) return on == 1;
  const char* value = std::getenv("LOOM_TENSOR_CORE_ATTENTION");
  const std::string_view given = value == nullptr || *value == '\0' ? "1" : value;
  LOOM_CHECK(given == "0" || given == "1",
             "LOOM_TENSOR_CORE_ATTENTION='{}': expected 0 (attention on the plain CUDA kernels) or "
             "1 (on tensor cores where they take the call, the default)",
             given);
  on = given == "1" ? 1 : 0;
  int unread = -1;
  g_tensor_cores.compare_exchange_strong(unread, on);  // a set_tensor_core_attention first wins
  return g_tensor_cores.load() == 1;
}
void set_attention_shared_memory_limit(size_t bytes) { g_shared_memory_cap.store(bytes); }

bool tensor_core_attention_takes(DType dtype, const FlashAttentionShape& s,
                                 std::initializer_list<const void*> pointers,
                                 std::initializer_list<AttentionRows> rows) {
  if (!tensor_core_attention_enabled()) return false;
  if (!tensor_core_attention_layout_fits(dtype, s, rows)) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !aligned16(p)) return false;  // the tiles' 16-byte loads
  }
  return true;
}

TensorCoreAttentionPlan tensor_core_attention_plan(DType dtype, int64_t d, int device) {
  TensorCoreAttentionPlan plan;
  plan.shared_memory_per_block = shared_memory_per_block(device);
  visit(dtype, d, [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int D = decltype(dim)::value;
    const size_t limit = plan.shared_memory_per_block;
    plan.forward = plan_for(kForwardSmem<T, D, 2>, kForwardSmem<T, D, 1>, limit);
    plan.dq = plan_for(kDqSmem<T, D, 2>, kDqSmem<T, D, 1>, limit);
    plan.dkdv = plan_for(kDkdvSmem<T, D, 2>, kDkdvSmem<T, D, 1>, limit);
  });
  return plan;
}

void mma_attention_forward(DType dtype, void* out, float* lse, const void* q, const void* k,
                           const void* v, const FlashAttentionShape& s,
                           const AttentionLayouts& layouts, int device) {
  if (s.rows == 0 || s.tq == 0) return;
  visit(dtype, s.d, [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int D = decltype(dim)::value;
    with_stages("the forward kernel", D, kForwardSmem<T, D, 2>, kForwardSmem<T, D, 1>, device,
                [&](auto stages) {
                  constexpr int S = decltype(stages)::value;
                  launch(mma_forward_kernel<T, D, S>, "mma_forward_kernel",
                         s.rows * ceil_div(s.tq, kTile), kForwardSmem<T, D, S>, device,
                         static_cast<T*>(out), lse, static_cast<const T*>(q),
                         static_cast<const T*>(k), static_cast<const T*>(v), s, layouts);
                });
  });
}

void mma_attention_backward(DType dtype, void* dq, void* dk, void* dv, float* delta,
                            const void* grad_out, const void* q, const void* k, const void* v,
                            const float* lse, const FlashAttentionShape& s,
                            const AttentionLayouts& layouts, int device, bool delta_given) {
  if (s.rows == 0) return;
  visit(dtype, s.d, [&](auto tag, auto dim) {
    using T = decltype(tag);
    constexpr int D = decltype(dim)::value;
    const auto g = static_cast<const T*>(grad_out);
    const auto qt = static_cast<const T*>(q), kt = static_cast<const T*>(k);
    const auto vt = static_cast<const T*>(v);
    if (s.tq > 0) {
      with_stages("the dq kernel", D, kDqSmem<T, D, 2>, kDqSmem<T, D, 1>, device, [&](auto stages) {
        constexpr int S = decltype(stages)::value;
        launch(mma_backward_dq_kernel<T, D, S>, "mma_backward_dq_kernel",
               s.rows * ceil_div(s.tq, kTile), kDqSmem<T, D, S>, device, static_cast<T*>(dq), delta,
               g, qt, kt, vt, lse, s, layouts, delta_given);
      });
    }
    if (s.tk > 0) {
      with_stages("the dk/dv kernel", D, kDkdvSmem<T, D, 2>, kDkdvSmem<T, D, 1>, device,
                  [&](auto stages) {
                    constexpr int S = decltype(stages)::value;
                    launch(mma_backward_dkdv_kernel<T, D, S>, "mma_backward_dkdv_kernel",
                           s.rows / s.group * ceil_div(s.tk, kTile), kDkdvSmem<T, D, S>, device,
                           static_cast<T*>(dk), static_cast<T*>(dv),
                           static_cast<const float*>(delta), g, qt, kt, vt, lse, s, layouts);
                  });
    }
  });
}

}  // namespace loom::cuda::kernels
