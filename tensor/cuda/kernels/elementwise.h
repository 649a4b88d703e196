// Elementwise CUDA kernels over strided operands of one shape (broadcasting is done by the caller
// through stride-0 views). Floating dtypes compute in f32 and round once on store; integer
// dtypes compute in i64.
#pragma once

#include "tensor/cuda/kernels/kernel_args.h"

namespace loom::cuda::kernels {

// out = op(in) (same dtype, same sizes). Floating-only ops must not be given integer dtypes.
void unary(UnaryOp op, DType dtype, const StridedArg& out, const StridedArg& in, float scalar,
           int device);
// out = op(a, b), all of `dtype` and of out's sizes.
void binary(BinaryOp op, DType dtype, const StridedArg& out, const StridedArg& a,
            const StridedArg& b, float scalar, int device);
// grad_gate = grad * up * silu'(gate), grad_up = grad * silu(gate): silu(gate) * up's gradients,
// all five of floating `dtype` and of grad_gate's sizes, in one pass.
void silu_mul_backward(DType dtype, const StridedArg& grad_gate, const StridedArg& grad_up,
                       const StridedArg& grad, const StridedArg& gate, const StridedArg& up,
                       int device);
// out = cond != 0 ? a : b; cond is f32, a/b/out of `dtype`.
void where(DType dtype, const StridedArg& out, const StridedArg& cond, const StridedArg& a,
           const StridedArg& b, int device);
// out = in converted from in_dtype to out_dtype (round to nearest even).
void copy(DType out_dtype, const StridedArg& out, DType in_dtype, const StridedArg& in, int device);
// out[i] += in[i] for i < n, out f32 and in of `in_dtype`, both contiguous: in converted to f32
// (exactly) and added in f32, the values of copying it to f32 and adding, in one pass (a bf16
// gradient accumulated into its f32 master's .grad).
void accumulate_f32(float* out, DType in_dtype, const void* in, int64_t n, int device);
// Every element of out = value converted to dtype.
void fill(DType dtype, const StridedArg& out, double value, int device);

}  // namespace loom::cuda::kernels
