#include "tensor/ops_cuda.h"

#include "base/error.h"
#include "tensor/cuda/kernels/elementwise.h"

namespace loom::ops::cuda_backend {

kernels::StridedArg strided_arg(const Tensor& t, std::string_view op) {
  LOOM_CHECK(t.dim() <= kernels::kMaxDims,
             "{}: CUDA kernels take tensors of at most {} dims, got {} (reshape it first)", op,
             kernels::kMaxDims, t.description());
  kernels::StridedArg arg;
  arg.data = t.raw_data();
  arg.ndim = static_cast<int>(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    arg.sizes[d] = t.shape()[d];
    arg.strides[d] = t.strides()[d];
  }
  return arg;
}

void unary(kernels::UnaryOp op, const Tensor& out, const Tensor& in, float scalar) {
  kernels::unary(op, out.dtype(), strided_arg(out, "unary"), strided_arg(in, "unary"), scalar,
                 out.device().index);
}

void binary(kernels::BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
            float scalar) {
  kernels::binary(op, out.dtype(), strided_arg(out, "binary"), strided_arg(a, "binary"),
                  strided_arg(b, "binary"), scalar, out.device().index);
}

void silu_mul_backward(const Tensor& grad_gate, const Tensor& grad_up, const Tensor& grad,
                       const Tensor& gate, const Tensor& up) {
  constexpr std::string_view op = "silu_mul_backward";
  kernels::silu_mul_backward(grad_gate.dtype(), strided_arg(grad_gate, op),
                             strided_arg(grad_up, op), strided_arg(grad, op), strided_arg(gate, op),
                             strided_arg(up, op), grad_gate.device().index);
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  kernels::where(out.dtype(), strided_arg(out, "where"), strided_arg(cond, "where"),
                 strided_arg(a, "where"), strided_arg(b, "where"), out.device().index);
}

void copy(const Tensor& dst, const Tensor& src) {
  kernels::copy(dst.dtype(), strided_arg(dst, "copy_"), src.dtype(), strided_arg(src, "copy_"),
                dst.device().index);
}

void accumulate_f32(const Tensor& dst, const Tensor& src) {
  kernels::accumulate_f32(dst.data<float>(), src.dtype(), src.raw_data(), dst.numel(),
                          dst.device().index);
}

void fill(const Tensor& t, double value) {
  kernels::fill(t.dtype(), strided_arg(t, "fill_"), value, t.device().index);
}

}  // namespace loom::ops::cuda_backend
