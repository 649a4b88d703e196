// Multi-tensor ops (torch's torch._foreach_* family): one pass over many tensors, for the
// per-parameter work at a step's end (gradient clipping's norms and scaling). On a GPU they run
// many tensors per kernel launch (tensor/cuda/kernels/foreach.h) where the per-tensor ops would
// launch one or two kernels per parameter, each too small to keep the device busy while the
// host issues the next. Not dispatched ops: plain tensors (a DTensor's local shard), nothing
// differentiates them. Every tensor must be on one device (throws naming both otherwise).
#pragma once

#include <span>
#include <vector>

#include "tensor/tensor.h"

namespace loom::ops {

// (n,) f32 on the tensors' device: entry i is the sum of the squares of tensors[i] in f32
// (sum(mul(x, x)) of x as f32). On the CPU composed exactly so, tensor by tensor (the values
// optim::clip_grad_norm_ always had); on CUDA contiguous f32 tensors go many per launch (each
// chunk summed in f32, the chunks added in double: deterministic, within f32 rounding of the
// CPU's), the others composed. An empty list gives an empty (0,) CPU tensor.
Tensor foreach_sum_of_squares(std::span<const Tensor> tensors);

// Every tensor *= scalar in place, in f32 for f32 tensors (ops::mul_'s values); on CUDA
// contiguous f32 tensors go many per launch, the others through mul_.
void foreach_mul_(std::span<const Tensor> tensors, double scalar);

// New tensors: tensors[i] converted to `dtype` (ops::to's values, and its result as is for a
// tensor already of `dtype`). On CUDA, plain contiguous f32 tensors to bf16 or f16 go up to 64
// per launch (mixed precision's casts of every weight at a forward's start); the others through
// ops::to, DTensors included. Recorded by no autograd: the caller records what it needs.
std::vector<Tensor> foreach_to(std::span<const Tensor> tensors, DType dtype);

}  // namespace loom::ops
