// Matrix products (loom::ops; recorded by autograd through tensor/dispatch.h), through the CPU GEMM
// chosen in tensor/cpu/gemm.h (f32; bf16/f16 operands are converted) or, for CUDA operands,
// cuBLASLt (tensor/cuda/gemm_cublaslt.h: f32/bf16/f16 in and out, f32 accumulation). A transposed
// operand (a view whose last two dims are swapped) is passed to the GEMM as a transpose flag, never
// copied.
#pragma once

#include "tensor/tensor.h"

namespace loom::ops {

// torch.matmul semantics: 1-D operands are promoted (and the added dim removed); leading
// (batch) dims broadcast. Shapes (..., M, K) @ (..., K, N) -> (..., M, N).
Tensor matmul(const Tensor& a, const Tensor& b);

// torch.nn.functional.linear: input (..., K) @ weight (N, K)^T + bias (N,), bias optional.
// The bias is fused into the one GEMM: on CUDA through cuBLASLt's bias epilogue, on CPU by
// starting the output as the bias rows and letting the GEMM accumulate into it (beta = 1). Either
// way the separate add's pass over the (..., N) output is gone. Tensors with an extension
// (DTensors) take the composed path, matmul then add, which their sharding rules cover.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace loom::ops
