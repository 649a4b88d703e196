// The CUDA device, emulated on the CPU: what a .cu file's kernel code needs to compile with g++
// and run on host memory (tools/cuda_emulator/device/README.md). Force-included (-include) into
// every .cu file that cu_to_cc has turned into C++, whose `kernel<<<grid, block, smem,
// stream>>>(args)` launches became loom_emu::launch(grid, block, smem, [&] { kernel(args); }).
//
// Each block runs its threads as fibers on the calling thread, one block after another: a fiber
// runs until it reaches __syncthreads() or a warp collective (__shfl_*_sync, __syncwarp), and the
// collective completes once every thread of the block (or warp) that has not returned has reached
// it. So barriers, shuffles and shared memory behave as on a GPU for code that is correct there,
// and atomics are exact (fibers switch only at collectives). A block whose threads wait at
// different collectives forever is reported as a deadlock naming them. Not modelled: timing,
// memory ordering between blocks (blocks run in order), and the hardware's accumulation order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "tools/cuda_emulator/device/emulated_counts.h"
#include "tools/cuda_emulator/device/emulated_limits.h"

#undef __device__
#undef __global__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Shared variables are static: one copy, which every fiber of the running block shares.
#define __shared__ static

// The built-in indices, set by the scheduler for the running fiber.
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace loom_emu {

// Runs `body` as every thread of every block of the grid, then returns (launches are synchronous).
void launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
            const std::function<void()>& body);
// The same, counted as a launch of `kernel` (emulated_counts.h): what cu_to_cc writes.
inline void launch(const char* kernel, dim3 grid, dim3 block, std::size_t dynamic_shared_bytes,
                   const std::function<void()>& body) {
  count(std::string("launch ") + kernel);
  launch(grid, block, dynamic_shared_bytes, body);
}
inline dim3 as_dim3(dim3 d) { return d; }
inline dim3 as_dim3(unsigned x) { return dim3(x, 1, 1); }
inline dim3 as_dim3(int x) { return dim3(static_cast<unsigned>(x), 1, 1); }
inline dim3 as_dim3(long x) { return dim3(static_cast<unsigned>(x), 1, 1); }
inline dim3 as_dim3(long long x) { return dim3(static_cast<unsigned>(x), 1, 1); }
inline dim3 as_dim3(unsigned long x) { return dim3(static_cast<unsigned>(x), 1, 1); }

// The running block's dynamic shared memory (`extern __shared__ T name[]`), 16-byte aligned.
unsigned char* dynamic_shared();

// Warp collectives: every lane deposits `bytes` (at most kSlotBytes) of `value`; once every live
// lane of the warp has, each gets a pointer to the deposits of all 32 lanes (lane i at
// i * kSlotBytes), valid until its next collective.
inline constexpr std::size_t kSlotBytes = 32;
const unsigned char* warp_exchange(const void* value, std::size_t bytes);
void block_barrier();
void warp_barrier();

inline int lane() { return static_cast<int>(threadIdx.x % 32); }

template <typename T>
T lane_value(const unsigned char* all, int lane) {
  T v;
  std::memcpy(&v, all + lane * kSlotBytes, sizeof(T));
  return v;
}

// The 16-bit half of a register as f32: T is __nv_bfloat16 or __half.
template <typename T>
float half_of(uint32_t reg, bool high) {
  const uint16_t bits = static_cast<uint16_t>(high ? reg >> 16 : reg & 0xffff);
  T v;
  std::memcpy(&v, &bits, 2);
  return static_cast<float>(v);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32, a warp collective: D = A B + C with the
// fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"),
// lane = 4 * groupID + tig:
//   A a_i (i = 0..7, two per register, a_{2r} in the low half): row = groupID + 8 * (i in
//     {2,3,6,7}), col = 2 * tig + (i & 1) + 8 * (i >= 4)
//   B b_i (i = 0..3): row (k) = 2 * tig + (i & 1) + 8 * (i >= 2), col (n) = groupID
//   C c_i (i = 0..3): row = groupID + 8 * (i >= 2), col = 2 * tig + (i & 1)
// Products add in double, then round once to f32 (the hardware's order is not modelled).
template <typename T>
void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  const unsigned char* all = warp_exchange(mine, sizeof(mine));
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    uint32_t regs[6];
    std::memcpy(regs, all + l * kSlotBytes, sizeof(regs));
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = g + ((i % 4) >= 2 ? 8 : 0);
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = half_of<T>(regs[i / 2], i & 1);
    }
    for (int i = 0; i < 4; ++i) {
      const int k = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      B[k][g] = half_of<T>(regs[4 + i / 2], i & 1);
    }
  }
  const int g = lane() / 4, t = lane() % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    double acc = c[i];
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
    c[i] = static_cast<float>(acc);
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, a warp collective: lane 8 i + r gives the
// address of row r of 8 x 8 matrix i (16-bit elements); lane 4 g + t receives in x[i] the
// elements [g][2t] (low half) and [g][2t + 1] of matrix i, or with .trans [2t][g] and
// [2t + 1][g] (PTX ISA, "ldmatrix").
// An address an instruction needs 16-byte aligned (ldmatrix's rows, cp.async's operands): a
// misaligned one faults on a GPU, so it aborts here, naming the instruction.
inline void require_16_byte_aligned(const void* p, const char* instruction) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    std::fprintf(stderr, "cuda emulator: %s with a misaligned address %p (16 bytes needed)\n",
                 instruction, p);
    std::abort();
  }
}

inline void ldmatrix_x4(uint32_t (&x)[4], const void* row, bool trans) {
  require_16_byte_aligned(row, "ldmatrix");
  const unsigned char* all = warp_exchange(&row, sizeof(row));
  const int g = lane() / 4, t = lane() % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (trans) {
      std::memcpy(&lo, lane_value<const uint16_t*>(all, 8 * i + 2 * t) + g, 2);
      std::memcpy(&hi, lane_value<const uint16_t*>(all, 8 * i + 2 * t + 1) + g, 2);
    } else {
      std::memcpy(&lo, lane_value<const uint16_t*>(all, 8 * i + g) + 2 * t, 2);
      std::memcpy(&hi, lane_value<const uint16_t*>(all, 8 * i + g) + 2 * t + 1, 2);
    }
    x[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}
inline void ldmatrix_x4(uint32_t (&x)[4], const void* row) { ldmatrix_x4(x, row, false); }

// cp.async.cg.shared.global's 16 bytes, copied at once (zeros when !valid): a kernel waits for
// its copies before any thread reads them, so copying early changes no result. The attention
// harness (tools/cuda_emulator/harness.cc) delays them to the wait instead, to catch a missing one.
inline void cp_async_16(void* dst, const void* src, bool valid) {
  require_16_byte_aligned(dst, "cp.async");
  require_16_byte_aligned(src, "cp.async");
  if (valid) {
    std::memcpy(dst, src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
}
inline void ldmatrix_x4_trans(uint32_t (&x)[4], const void* row) { ldmatrix_x4(x, row, true); }

}  // namespace loom_emu

// Attributes of a kernel: the emulated runtime's (emulated_runtime.cc), which refuses more dynamic
// shared memory than the GPU's opt-in limit, as a GPU does.
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

inline void __syncthreads() { loom_emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { loom_emu::warp_barrier(); }

template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const unsigned char* all = loom_emu::warp_exchange(&v, sizeof(T));
  const int lane = loom_emu::lane();
  return loom_emu::lane_value<T>(all, (lane / width) * width + (src % width));
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const unsigned char* all = loom_emu::warp_exchange(&v, sizeof(T));
  const int lane = loom_emu::lane();
  if (lane % width + static_cast<int>(delta) >= width) return v;
  return loom_emu::lane_value<T>(all, lane + static_cast<int>(delta));
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const unsigned char* all = loom_emu::warp_exchange(&v, sizeof(T));
  const int lane = loom_emu::lane();
  if (lane % width < static_cast<int>(delta)) return v;
  return loom_emu::lane_value<T>(all, lane - static_cast<int>(delta));
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const unsigned char* all = loom_emu::warp_exchange(&v, sizeof(T));
  const int lane = loom_emu::lane();
  const int src = lane ^ mask;
  if (src / width != lane / width) return v;
  return loom_emu::lane_value<T>(all, src);
}

// Atomics: fibers switch only at collectives, so a plain read-modify-write is atomic.
namespace loom_emu {
template <typename T, typename F>
T read_modify_write(T* p, F update) {
  const T old = *p;
  *p = update(old);
  return old;
}
template <typename To, typename From>
To bits_as(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &x, sizeof(out));
  return out;
}
}  // namespace loom_emu
template <typename T>
T atomicAdd(T* p, T v) {
  return loom_emu::read_modify_write(p, [&](T old) { return old + v; });
}
template <typename T>
T atomicMin(T* p, T v) {
  return loom_emu::read_modify_write(p, [&](T old) { return v < old ? v : old; });
}
template <typename T>
T atomicMax(T* p, T v) {
  return loom_emu::read_modify_write(p, [&](T old) { return v > old ? v : old; });
}
template <typename T>
T atomicExch(T* p, T v) {
  return loom_emu::read_modify_write(p, [&](T) { return v; });
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  return loom_emu::read_modify_write(p, [&](T old) { return old == compare ? v : old; });
}

// Device math that the host's libm does not spell the same way.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __float_as_int(float x) { return loom_emu::bits_as<int>(x); }
inline unsigned __float_as_uint(float x) { return loom_emu::bits_as<unsigned>(x); }
inline float __int_as_float(int i) { return loom_emu::bits_as<float>(i); }
inline float __uint_as_float(unsigned i) { return loom_emu::bits_as<float>(i); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
// CUDA's min and max take mixed integer types (int and int64_t) and floats alike.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) > static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
