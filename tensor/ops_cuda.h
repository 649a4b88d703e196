// The CUDA backend of the plain ops: one function per kernel family, taking Tensors. The op
// families in tensor/ops_*.cc check arguments, pick the device (op_device.h), allocate outputs
// there, and call these on CUDA instead of their CPU loops; so checks, dtype promotion and
// broadcasting are shared by both devices and only the loops differ.
//
// Preconditions (the callers' job): every tensor is defined and on one CUDA device; shapes are
// already broadcast (stride-0 views); dtypes as each function says. Kernels run asynchronously
// on the device's compute stream (tensor/cuda/stream.h).
#pragma once

#include <string_view>
#include <vector>

#include "tensor/cuda/kernels/kernel_args.h"
#include "tensor/tensor.h"

namespace loom::ops::cuda_backend {

namespace kernels = ::loom::cuda::kernels;

// `t` as a kernel argument. Throws naming `op` when t has more than kernels::kMaxDims dims.
kernels::StridedArg strided_arg(const Tensor& t, std::string_view op);

// ---- elementwise, copy, fill (ops_cuda.cc) ----
// out = op(in), one dtype.
void unary(kernels::UnaryOp op, const Tensor& out, const Tensor& in, float scalar);
// out = op(a, b), one dtype and one shape.
void binary(kernels::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
            float scalar = 0.0f);
// silu(gate) * up's two gradients (kernels::silu_mul_backward), all of one floating dtype and
// shape.
void silu_mul_backward(const Tensor& grad_gate, const Tensor& grad_up, const Tensor& grad,
                       const Tensor& gate, const Tensor& up);
// out = cond != 0 ? a : b; cond f32.
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// dst = src converted to dst's dtype (same shape, any strides).
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& t, double value);
// dst += src: dst f32, src of another floating dtype, one shape, both contiguous.
void accumulate_f32(const Tensor& dst, const Tensor& src);

}  // namespace loom::ops::cuda_backend

namespace loom::ops::cuda_backend {

// ---- reductions (ops_cuda_reduce.cc) ----
// scale * sum of self over the dims where reduced[d], shaped as ops::sum gives it.
Tensor sum(const Tensor& self, const std::vector<bool>& reduced, bool keepdim, double scale);
// Row maxima of contiguous `in` (rows, n) into values (rows) and i64 indices (rows).
void max_rows(const Tensor& values, const Tensor& indices, const Tensor& in, int64_t rows,
              int64_t n);
// Each row's k largest values' i64 indices (rows, k) of contiguous `in` (rows, n)
// (ops_top_k.h's order).
void top_k_rows(const Tensor& indices, const Tensor& in, int64_t rows, int64_t n, int64_t k);

}  // namespace loom::ops::cuda_backend
