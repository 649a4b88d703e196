// Elementwise ops with NumPy broadcasting (loom::ops, also spelled loom::add etc.; they record
// autograd through tensor/dispatch.h like every op).
// Mixed dtypes promote: any floating operand makes the result floating (f32 when two different
// floating dtypes meet), otherwise i64 when i32 meets i64.
#pragma once

#include "tensor/tensor.h"

namespace loom::ops {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);   // a - b
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
// Maximum/minimum of two tensors (broadcasting).
Tensor maximum(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
// 1 / (1 + exp(-x)).
Tensor sigmoid(const Tensor& a);
// x * sigmoid(x) (Llama's SwiGLU activation; torch.nn.functional.silu).
Tensor silu(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
// GPT-2's GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& a);
// d gelu(x)/dx * grad.
Tensor gelu_backward(const Tensor& grad, const Tensor& x);

// cond != 0 ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// self with `value` wherever mask != 0 (mask broadcasts to self).
Tensor masked_fill(const Tensor& self, const Tensor& mask, double value);

// 1.0 where a == b / a > b, else 0.0, in the promoted dtype.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);

// In place: self += other (broadcast to self's shape). For gradient accumulation.
void add_(const Tensor& self, const Tensor& other);
// In place: self *= scalar (gradient clipping's scale, without a temporary and a copy back).
void mul_(const Tensor& self, double scalar);

// The AdamW update of one parameter in place, fused into one vectorized, threaded pass
// (tensor/cpu/vector_math.h; torch.optim.AdamW's formula in f32, as optim::AdamW composes it)
// when the four tensors are plain contiguous f32 CPU tensors of one shape. Returns false and
// changes nothing otherwise (DTensors, CUDA, other dtypes): the caller composes the update from
// ops. Not a dispatched op: nothing differentiates or shards it.
struct AdamWScalars {
  double lr, beta1, beta2, eps, weight_decay;
  double bias1, bias2;  // 1 - beta^step
};
bool adamw_update_fused_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamWScalars& scalars);

}  // namespace loom::ops
