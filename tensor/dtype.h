// Element types a Tensor can hold. bf16 and f16 are storage formats: CPU kernels compute in f32
// and round on store (GPU kernels may compute natively).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace loom {

enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kInt32, kInt64 };

inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kBFloat16 = DType::kBFloat16;
inline constexpr DType kFloat16 = DType::kFloat16;
inline constexpr DType kInt32 = DType::kInt32;
inline constexpr DType kInt64 = DType::kInt64;

size_t element_size(DType dtype);
// "f32", "bf16", "f16", "i32", "i64": the names used in every error message.
std::string_view dtype_name(DType dtype);
// The dtype `dtype_name` calls `name` ("f32", "bf16", ...); none for another name.
std::optional<DType> dtype_from_name(std::string_view name);
bool is_floating(DType dtype);

// Maps a C++ element type to its DType (float -> kFloat32, int64_t -> kInt64, ...).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = kFloat32;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = kInt64;
};

}  // namespace loom
