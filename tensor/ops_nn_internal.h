// Private helpers shared by the ops_nn*.cc kernels (not part of the library's interface: listed
// in the tensor target's srcs, not hdrs).
#pragma once

#include <string_view>
#include <vector>

#include "base/error.h"
#include "tensor/ops_copy.h"
#include "tensor/tensor.h"

namespace loom::ops::nn_internal {

// `t` is defined and on CPU (the only device these kernels exist for so far).
inline void check_cpu(const Tensor& t, std::string_view op, std::string_view name) {
  LOOM_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
  LOOM_CHECK(t.device().is_cpu(), "{}: CUDA kernels for this op are not built yet ({} is {})", op,
             name, t.description());
}

// `t` is a defined CPU tensor of a floating dtype.
inline void check_floating(const Tensor& t, std::string_view op, std::string_view name) {
  check_cpu(t, op, name);
  LOOM_CHECK(is_floating(t.dtype()),
             "{}: expected {} to have a floating dtype (f32, bf16, f16), got {} of shape {}", op,
             name, dtype_name(t.dtype()), shape_str(t.shape()));
}

// `t` is a defined CPU tensor of dtype i64 or i32 (class or row indices).
inline void check_index(const Tensor& t, std::string_view op, std::string_view name) {
  check_cpu(t, op, name);
  LOOM_CHECK(t.dtype() == kInt64 || t.dtype() == kInt32,
             "{}: expected {} to have dtype i64 or i32, got {} of shape {}", op, name,
             dtype_name(t.dtype()), shape_str(t.shape()));
}

// The kernels' working form: contiguous f32 (a no-op for contiguous f32 input). bf16/f16 values
// convert exactly; results round once when converted back with `to`.
inline Tensor as_f32(const Tensor& t) { return contiguous(to(t, kFloat32)); }

// Index values of an i64/i32 tensor in row-major order.
inline std::vector<int64_t> index_values(const Tensor& t) {
  const Tensor c = contiguous(to(t, kInt64));
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
