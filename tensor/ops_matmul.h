// Matrix products (loom::ops, not recorded by autograd), through the CPU GEMM chosen in
// tensor/cpu/gemm.h (f32; bf16/f16 operands are converted) or, for CUDA operands, cuBLASLt
// (tensor/cuda/gemm_cublaslt.h: f32/bf16/f16 in and out, f32 accumulation). A transposed operand
// (a view whose last two dims are swapped) is passed to the GEMM as a transpose flag, never copied.
#pragma once

#include "tensor/tensor.h"

namespace loom::ops {

// torch.matmul semantics: 1-D operands are promoted (and the added dim removed); leading
// (batch) dims broadcast. Shapes (..., M, K) @ (..., K, N) -> (..., M, N).
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace loom::ops
