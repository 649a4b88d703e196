// The attention backward's row sums taken from the forward's output, FlashAttention-2's
// preprocessing pass (its dot(dO, O)): delta_i = sum_d grad_out[i, d] * out[i, d] in f32.
// rowsum(P * dP) over the key tiles gives the same sums (exactly, but for out's rounding) at the
// price of a second pass of S = Q K^T and dP = dO V^T over every key tile in the dq kernel.
#include "tensor/cuda/kernels/device_common.cuh"
#include "tensor/cuda/kernels/flash_attention_mma.h"

namespace loom::cuda::kernels {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;

// Row i of matrix bh of an operand laid out as `r` says.
template <typename T>
__device__ __forceinline__ const T* row_of(const T* base, const AttentionRows& r, int64_t bh,
                                           int64_t i) {
  return base + (bh / r.heads) * r.batch_stride + (bh % r.heads) * r.head_stride + i * r.row_stride;
}

// A warp per row: each lane multiplies every 32nd element, then the warp adds the lanes' sums
// in a fixed order (deterministic).
template <typename T>
__global__ void row_dots_kernel(float* delta, const T* grad_out, const T* out, AttentionRows g,
                                AttentionRows o, int64_t rows, int64_t tq, int64_t dv) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
       w < rows * tq; w += warps) {
    const int64_t bh = w / tq, i = w % tq;
    const T* gr = row_of(grad_out, g, bh, i);
    const T* orow = row_of(out, o, bh, i);
    float s = 0.0f;
    for (int64_t d = lane; d < dv; d += 32) s += load(gr + d) * load(orow + d);
    s = warp_sum(s);
    if (lane == 0) delta[w] = s;
  }
}

}  // namespace

void attention_row_dots(DType dtype, float* delta, const void* grad_out, const void* out,
                        const AttentionRows& grad_out_rows, const AttentionRows& out_rows,
                        int64_t rows, int64_t tq, int64_t dv, int device) {
  const int64_t n = rows * tq;
  if (n == 0) return;
  const int64_t blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned grid = static_cast<unsigned>(blocks > 65535 * 8 ? 65535 * 8 : blocks);
  visit_floating(dtype, "attention_row_dots", [&](auto tag) {
    using T = decltype(tag);
    row_dots_kernel<T><<<grid, kThreads, 0, compute_stream(device)>>>(
        delta, static_cast<const T*>(grad_out), static_cast<const T*>(out), grad_out_rows, out_rows,
        rows, tq, dv);
  });
  check_launch("row_dots_kernel", device);
}

}  // namespace loom::cuda::kernels
