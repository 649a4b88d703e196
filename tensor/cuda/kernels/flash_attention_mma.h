// Fused attention on tensor cores (flash_attention_mma.cu): the kernels behind
// flash_attention_forward/backward (nn.h) for bf16 and f16 with head dims D == Dv in
// {16, 32, 64, 128} and 16-byte aligned tensors; every other case takes the plain CUDA kernels
// of flash_attention.cu, which stay as this path's oracle (cuda_attention_test runs both).
#pragma once

#include <initializer_list>

#include "tensor/cuda/kernels/nn.h"

namespace loom::cuda::kernels {

// Process-wide switch (default on): off, every shape takes the plain kernels. For tests and for
// comparing the two paths' speed (tools/bench/attention_bench).
void set_tensor_core_attention(bool enabled);
bool tensor_core_attention_enabled();

// Whether the tensor-core kernels take this call: switched on, bf16 or f16, D == Dv in
// {16, 32, 64, 128}, and every non-null pointer 16-byte aligned.
bool tensor_core_attention_takes(DType dtype, const FlashAttentionShape& shape,
                                 std::initializer_list<const void*> pointers);

// As flash_attention_forward / flash_attention_backward (nn.h), for the shapes above.
void mma_attention_forward(DType dtype, void* out, float* lse, const void* q, const void* k,
                           const void* v, const FlashAttentionShape& shape, int device);
void mma_attention_backward(DType dtype, void* dq, void* dk, void* dv, float* delta,
                            const void* grad_out, const void* q, const void* k, const void* v,
                            const float* lse, const FlashAttentionShape& shape, int device,
                            bool delta_given);

}  // namespace loom::cuda::kernels
