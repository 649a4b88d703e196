#include "tensor/dtype.h"

namespace loom {

size_t element_size(DType dtype) {
  switch (dtype) {
    case kFloat32:
      return 4;
    case kBFloat16:
      return 2;
    case kFloat16:
      return 2;
    case kInt32:
      return 4;
    case kInt64:
      return 8;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case kFloat32:
      return "f32";
    case kBFloat16:
      return "bf16";
    case kFloat16:
      return "f16";
    case kInt32:
      return "i32";
    case kInt64:
      return "i64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : {kFloat32, kBFloat16, kFloat16, kInt32, kInt64}) {
    if (dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

bool is_floating(DType dtype) {
  return dtype == kFloat32 || dtype == kBFloat16 || dtype == kFloat16;
}

}  // namespace loom
