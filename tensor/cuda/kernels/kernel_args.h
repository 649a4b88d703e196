// What the tensor layer hands a CUDA kernel: plain values, no Tensor (the kernels library sits
// below //tensor and knows only dtypes). Every launcher queues its work on the compute stream of
// `device` (tensor/cuda/stream.h) and returns without waiting; launch failures throw loom::Error.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace loom::cuda::kernels {

// Tensors of more dims than this are collapsed (merging dims contiguous in every operand) or
// refused with an error naming the op.
inline constexpr int kMaxDims = 8;

// One strided operand: `data` points at element [0, 0, ...]; sizes and strides in elements.
struct StridedArg {
  void* data = nullptr;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

enum class UnaryOp : int {
  kCopy,  // same dtype
  kNeg,
  kAbs,
  kExp,
  kLog,
  kTanh,
  kSigmoid,
  kSilu,  // x * sigmoid(x)
  kSqrt,
  kRsqrt,
  kPow,     // x ^ scalar
  kSquare,  // x * x (pow 2, as the CPU computes it)
  kRelu,
  kGelu,
  kAddScalar,
  kSubScalar,   // x - scalar
  kRsubScalar,  // scalar - x
  kMulScalar,
  kDivScalar,
};

enum class BinaryOp : int {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMaximum,
  kEq,
  kGt,
  kGeluBackward,  // a = grad, b = x
  kSiluBackward,  // a = grad, b = x
  kSiluMul,       // silu(a) * b
  kMulScaled,     // a * b * scalar, one rounding (dropout's x * mask / (1 - p))
};

}  // namespace loom::cuda::kernels
