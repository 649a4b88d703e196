// Reading and writing one element of any dtype as double: the slow, general path used by
// conversions, printing and tests. Kernels use typed loops instead.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/half.h"

namespace loom {

inline double load_element(const void* ptr, DType dtype) {
  switch (dtype) {
    case kFloat32:
      return *static_cast<const float*>(ptr);
    case kBFloat16:
      return bf16_to_float(*static_cast<const uint16_t*>(ptr));
    case kFloat16:
      return f16_to_float(*static_cast<const uint16_t*>(ptr));
    case kInt32:
      return *static_cast<const int32_t*>(ptr);
    case kInt64:
      return static_cast<double>(*static_cast<const int64_t*>(ptr));
  }
  return 0;
}

inline void store_element(void* ptr, DType dtype, double value) {
  switch (dtype) {
    case kFloat32:
      *static_cast<float*>(ptr) = static_cast<float>(value);
      break;
    case kBFloat16:
      *static_cast<uint16_t*>(ptr) = float_to_bf16(static_cast<float>(value));
      break;
    case kFloat16:
      *static_cast<uint16_t*>(ptr) = float_to_f16(static_cast<float>(value));
      break;
    case kInt32:
      *static_cast<int32_t*>(ptr) = static_cast<int32_t>(value);
      break;
    case kInt64:
      *static_cast<int64_t*>(ptr) = static_cast<int64_t>(value);
      break;
  }
}

}  // namespace loom
