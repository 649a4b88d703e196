// Typed element access for CPU kernels: one storage type per DType and the visit_dtype switch
// that turns a runtime dtype into a template argument.
#pragma once

#include <cstdint>
#include <type_traits>

#include "base/error.h"
#include "tensor/dtype.h"
#include "tensor/half.h"

namespace loom::cpu {

struct BFloat16 {
  uint16_t bits;
};
struct Float16 {
  uint16_t bits;
};

// Value of a stored element in the type kernels compute in (f32 for all floating types).
inline float to_compute(float v) { return v; }
inline float to_compute(BFloat16 v) { return bf16_to_float(v.bits); }
inline float to_compute(Float16 v) { return f16_to_float(v.bits); }
inline int32_t to_compute(int32_t v) { return v; }
inline int64_t to_compute(int64_t v) { return v; }

template <typename T>
using ComputeType = decltype(to_compute(T{}));

template <typename T, typename V>
inline T from_compute(V v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{float_to_bf16(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, Float16>) {
    return Float16{float_to_f16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}

// Calls f(T{}) with T the storage type of `dtype`.
template <typename F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case kFloat32:
      return f(float{});
    case kBFloat16:
      return f(BFloat16{});
    case kFloat16:
      return f(Float16{});
    case kInt32:
      return f(int32_t{});
    case kInt64:
      return f(int64_t{});
  }
  LOOM_INTERNAL_ASSERT(false, "unknown dtype");
  return f(float{});
}

// Same, for floating dtypes only; `op` names the caller in the error for integer dtypes.
template <typename F>
decltype(auto) visit_floating_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case kFloat32:
      return f(float{});
    case kBFloat16:
      return f(BFloat16{});
    case kFloat16:
      return f(Float16{});
    default:
      break;
  }
  LOOM_FAIL("{}: expected a floating dtype (f32, bf16, f16), got {}", op, dtype_name(dtype));
}

}  // namespace loom::cpu
