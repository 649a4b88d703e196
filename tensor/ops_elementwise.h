// Elementwise ops with NumPy broadcasting (loom::ops, also spelled loom::add etc.; they record
// autograd through tensor/dispatch.h like every op).
// Mixed dtypes promote: any floating operand makes the result floating (f32 when two different
// floating dtypes meet), otherwise i64 when i32 meets i64.
#pragma once

#include <span>

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
// d silu(x)/dx * grad = grad s (1 + x (1 - s)), s = sigmoid(x), computed in f32 with one rounding
// (torch's silu_backward): one pass where the composed formula took five.
Tensor silu_backward(const Tensor& grad, const Tensor& x);
// silu(gate) * up, broadcasting as mul, computed in f32 with one rounding: the SwiGLU
// feed-forward's activation (Llama: w2(silu(w1 x) * w3 x); Liger's fused silu_mul). One pass
// writing one tensor where silu then mul write two, and its backward is one pass too
// (silu_mul_backward), so no silu(gate) is kept for backward.
Tensor silu_mul(const Tensor& gate, const Tensor& up);
struct SiluMulGrads {
  Tensor grad_gate;  // grad * up * silu'(gate)
  Tensor grad_up;    // grad * silu(gate)
};
// Both gradients of silu_mul at the broadcast shape of the three inputs (the caller sums them to
// its inputs' shapes), in their promoted floating dtype, from one pass.
SiluMulGrads silu_mul_backward(const Tensor& grad, const Tensor& gate, const Tensor& up);

// cond != 0 ? a : b, broadcasting all three.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// self with `value` wherever mask != 0 (mask broadcasts to self).
Tensor masked_fill(const Tensor& self, const Tensor& mask, double value);

// 1.0 where a == b / a > b, else 0.0, in the promoted dtype.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);

// In place: self += other (broadcast to self's shape). For gradient accumulation. Written
// directly, with no temporary copied back, on the CPU (contiguous f32) and on a GPU (contiguous
// self; other of self's dtype, not a shifted or transposed view of self).
void add_(const Tensor& self, const Tensor& other);
// In place: self *= scalar (gradient clipping's scale), likewise without a temporary.
void mul_(const Tensor& self, double scalar);

// The AdamW update of many parameters in place, fused (torch.optim.AdamW(fused=True)): each
// element of param, grad and both moments read once and param and moments written once, with
// torch.optim.AdamW's formula in f32, as optim::AdamW composes it from ops otherwise. On the CPU
// one vectorized, threaded pass per parameter (tensor/cpu/vector_math.h); on CUDA up to
// cuda::kernels::kAdamWTensorsPerLaunch parameters of a device per kernel launch
// (tensor/cuda/kernels/adamw.h). Not a dispatched op: nothing differentiates or shards it.
struct AdamWHyperparameters {
  double lr, beta1, beta2, eps, weight_decay;
};
struct AdamWParameter {
  Tensor param, grad, exp_avg, exp_avg_sq;
  double bias1, bias2;  // 1 - beta^step, the parameter's own step count
};
// Whether the fused pass takes it: four plain (not DTensor) contiguous f32 tensors of one shape
// on one device (CPU, CUDA or meta). The caller composes the others' updates from ops.
bool adamw_fusable(const AdamWParameter& x);
// Every entry must be fusable (throws naming the first that is not, before changing anything).
void adamw_update_fused_(std::span<const AdamWParameter> params, const AdamWHyperparameters& h);

}  // namespace loom::ops
