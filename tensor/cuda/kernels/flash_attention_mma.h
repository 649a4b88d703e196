// Fused attention on tensor cores (flash_attention_mma.cu): the kernels behind
// flash_attention_forward/backward (nn.h) for bf16 and f16 with head dims D == Dv in
// {16, 32, 64, 128} and 16-byte aligned tensors; every other case takes the plain CUDA kernels
// of flash_attention.cu, which stay as this path's oracle (cuda_attention_test runs both).
#pragma once

#include <cstddef>
#include <initializer_list>

#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {

// Process-wide switch (default on): off, every shape takes the plain kernels. For tests and for
// comparing the two paths' speed (tools/bench/cuda_attention_bench). Its first value comes from
// LOOM_TENSOR_CORE_ATTENTION (0 off, 1 on; unset or empty: on), so a job can run on the plain
// kernels where the tensor-core ones fail (tools/gpu_check.sh's fallback); another value is an
// error naming it.
void set_tensor_core_attention(bool enabled);
bool tensor_core_attention_enabled();

// Caps the shared memory per block the tensor-core kernels plan for (0, the default: the device's
// opt-in limit, cudaDevAttrMaxSharedMemoryPerBlockOptin). A kernel whose double-buffered tiles do
// not fit keeps one buffer per operand it loops over (sm_86 / sm_89's 99 KiB at D = 128 in the
// backward), and fails naming both sizes when even that does not fit. Tests set a cap to run the
// single-buffered kernels on any GPU.
void set_attention_shared_memory_limit(size_t bytes);

// How the tensor-core kernels run head dim d in dtype on `device` (under the limit above): each
// kernel's tile buffers per operand it loops over (2, 1, or 0: it does not fit, and the call
// fails) and its dynamic shared memory per block. For reports and tests.
struct AttentionKernelPlan {
  int tile_buffers = 0;
  size_t shared_bytes = 0;  // what it takes (single-buffered when it fits nowhere)
  size_t double_buffered_bytes = 0, single_buffered_bytes = 0;  // its two variants' needs
};
struct TensorCoreAttentionPlan {
  AttentionKernelPlan forward, dq, dkdv;
  size_t shared_memory_per_block = 0;  // what a block of the device may use
};
TensorCoreAttentionPlan tensor_core_attention_plan(DType dtype, int64_t d, int device);

// Where one operand's rows lie, so the kernels read and write attention's usual strided views
// without a copy (q, k, v sliced out of a fused QKV projection's (B, T, H, 3, D) output and
// transposed to (B, H, T, D); out and the gradients laid out (B, T, H, D)): matrix bh of the
// call's `rows` starts at (bh / heads) * batch_stride + (bh % heads) * head_stride elements, its
// rows row_stride apart, each row's D elements contiguous. A contiguous (rows, T, D) operand is
// contiguous_rows(T, D).
struct AttentionRows {
  int64_t heads = 1;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};
inline AttentionRows contiguous_rows(int64_t t, int64_t d) {
  return {.heads = 1, .batch_stride = t * d, .head_stride = 0, .row_stride = d};
}
// o: out in the forward, grad_out in the backward; dq, dk, dv: the backward's outputs.
struct AttentionLayouts {
  AttentionRows q, k, v, o, dq, dk, dv;
};
// The layouts of contiguous operands of `shape`.
inline AttentionLayouts contiguous_layouts(const FlashAttentionShape& s) {
  const AttentionRows q = contiguous_rows(s.tq, s.d), k = contiguous_rows(s.tk, s.d);
  const AttentionRows v = contiguous_rows(s.tk, s.dv), o = contiguous_rows(s.tq, s.dv);
  return {.q = q, .k = k, .v = v, .o = o, .dq = q, .dk = k, .dv = v};
}

// The rules of tensor_core_attention_takes that need neither pointers nor a device: bf16 or f16,
// D == Dv in {16, 32, 64, 128}, every stride of `rows` a multiple of 8 elements. A meta trace of
// a GPU's step follows the tensor-core kernels' allocations where these hold (tensors fresh from
// an allocator are aligned).
inline bool tensor_core_attention_layout_fits(DType dtype, const FlashAttentionShape& s,
                                              std::initializer_list<AttentionRows> rows) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return false;
  if (s.d != s.dv || (s.d != 16 && s.d != 32 && s.d != 64 && s.d != 128)) return false;
  for (const AttentionRows& r : rows) {
    if (r.heads < 1 || r.batch_stride % 8 != 0 || r.head_stride % 8 != 0 || r.row_stride % 8 != 0)
      return false;
  }
  return true;
}

// Whether the tensor-core kernels take this call: switched on, the layout rules above, every
// non-null pointer 16-byte aligned (the tiles' 16-byte loads).
bool tensor_core_attention_takes(DType dtype, const FlashAttentionShape& shape,
                                 std::initializer_list<const void*> pointers,
                                 std::initializer_list<AttentionRows> rows = {});

// As flash_attention_forward / flash_attention_backward (nn.h), for the shapes above, with each
// operand where `layouts` says (lse and delta stay contiguous (rows, tq)).
void mma_attention_forward(DType dtype, void* out, float* lse, const void* q, const void* k,
                           const void* v, const FlashAttentionShape& shape,
                           const AttentionLayouts& layouts, int device);
void mma_attention_backward(DType dtype, void* dq, void* dk, void* dv, float* delta,
                            const void* grad_out, const void* q, const void* k, const void* v,
                            const float* lse, const FlashAttentionShape& shape,
                            const AttentionLayouts& layouts, int device, bool delta_given);

// delta[bh * tq + i] = sum_d grad_out[bh, i, d] * out[bh, i, d] in f32 for the rows * tq rows
// (attention_row_dots.cu): the backward's row sums from the forward's output, FlashAttention-2's
// form, for either kernel's delta_given. grad_out and out are of `dtype` (f32, bf16, f16), each
// where its layout says.
void attention_row_dots(DType dtype, float* delta, const void* grad_out, const void* out,
                        const AttentionRows& grad_out_rows, const AttentionRows& out_rows,
                        int64_t rows, int64_t tq, int64_t dv, int device);

}  // namespace loom::cuda::kernels
