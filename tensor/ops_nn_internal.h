// Private helpers shared by the ops_nn*.cc kernels (not part of the library's interface: listed
// in the tensor target's srcs, not hdrs).
#pragma once

#include <string_view>
#include <vector>

#include "base/error.h"
#include "tensor/ops_copy.h"
#include "tensor/tensor.h"

namespace loom::ops::nn_internal {

// `t` is defined (on any device: each op checks its operands share one, tensor/op_device.h).
inline void check_defined(const Tensor& t, std::string_view op, std::string_view name) {
  LOOM_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
}

// `t` is a defined tensor of a floating dtype.
inline void check_floating(const Tensor& t, std::string_view op, std::string_view name) {
  check_defined(t, op, name);
  LOOM_CHECK(is_floating(t.dtype()),
             "{}: expected {} to have a floating dtype (f32, bf16, f16), got {} of shape {}", op,
             name, dtype_name(t.dtype()), shape_str(t.shape()));
}

// `t` is a defined tensor of dtype i64 or i32 (class or row indices).
inline void check_index(const Tensor& t, std::string_view op, std::string_view name) {
  check_defined(t, op, name);
  LOOM_CHECK(t.dtype() == kInt64 || t.dtype() == kInt32,
             "{}: expected {} to have dtype i64 or i32, got {} of shape {}", op, name,
             dtype_name(t.dtype()), shape_str(t.shape()));
}

// The kernels' working form, on the tensor's device: contiguous f32 (a no-op for contiguous f32).
// bf16/f16 values convert exactly; results round once when converted back with `to`.
inline Tensor as_f32(const Tensor& t) { return contiguous(to(t, kFloat32)); }

// Element offset of each matrix of `t` (its last two dims) from its first, for `count` = the
// product of the batch dims, in row-major batch order; broadcast dims have stride 0. Defined in
// ops_matmul.cc (the batched GEMM's walk over any batch layout).
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t count);

// Index values of an i64/i32 tensor in row-major order, on the host (for CUDA tensors this copies
// them over and waits: the range checks with their precise messages run on the CPU).
inline std::vector<int64_t> index_values(const Tensor& t) {
  const Tensor c = contiguous(to(to(t, kInt64), Device::cpu()));
  const int64_t* p = c.data<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// The multi-index of row-major element `flat` of `shape`, printed like a shape: "(1, 2)".
inline std::string position_str(int64_t flat, const Shape& shape) {
  Shape index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return shape_str(index);
}

}  // namespace loom::ops::nn_internal
