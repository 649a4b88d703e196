// The tests' one family of value checks: expect_close (within a Tolerance), expect_equal (exact
// values) and expect_bitwise_equal (identical bytes). Every argument is named, so `actual` and
// `expected` cannot be swapped unnoticed:
//
//   expect_close({.actual = out, .expected = ref, .tol = {.rtol = 1e-5, .atol = 1e-6},
//                 .what = "forward"});
//   expect_equal({.actual = full_tensor(y), .expected = x, .what = "round trip"});
//   expect_close({.actual = t, .expected = {0.5, 1.5}, .tol = {.atol = 1e-6}, .what = "t"});
//
// Operands are tensors (any dtype, any device: values are copied to the host and read as f64 by
// ops::to_vector; a DTensor fails the check, compare its full_tensor) or flat lists of values.
// Between two tensors the shapes and the dtypes must be equal; against a list only the number of
// elements must match. A mismatch fails the check with both sides named, never crashes. A failed
// check is one non-fatal failure reported at the caller's line: how many elements fail, the worst
// one (index, actual, expected, absolute and relative error, allowed error) and the tolerance.
#pragma once

#include <initializer_list>
#include <source_location>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::testing {

// What rtol multiplies: each element's own |expected| (numpy.isclose, torch.allclose), or the
// largest finite |expected| of the whole operand (for results, like gradients, whose small
// elements carry the absolute rounding error of the large ones).
enum class RelativeTo { kElement, kLargest };

// An element passes when
//   - actual == expected (so inf matches inf of the same sign, and -0 matches +0), or
//   - both are NaN and equal_nan is set, or
//   - both are finite and |actual - expected| <= atol + rtol * scale, scale being |expected| of
//     the element (RelativeTo::kElement) or the largest finite |expected| (kLargest).
// NaN or an infinity on one side only always fails. The default, {} (kExact), is exact equality.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
  RelativeTo relative_to = RelativeTo::kElement;
  bool equal_nan = false;
};
inline constexpr Tolerance kExact{};

// One side of a check: a tensor, or a flat list of values (row-major).
class Operand {
 public:
  Operand(const Tensor& tensor) : tensor_(tensor), is_tensor_(true) {}  // NOLINT: implicit
  Operand(std::vector<double> values) : values_(std::move(values)) {}   // NOLINT: implicit
  Operand(std::initializer_list<double> values) : values_(values) {}    // NOLINT: implicit

  bool is_tensor() const { return is_tensor_; }
  const Tensor& tensor() const { return tensor_; }
  const std::vector<double>& values() const { return values_; }

 private:
  Tensor tensor_;
  std::vector<double> values_;
  bool is_tensor_ = false;
};

struct CloseCheck {
  Operand actual;
  Operand expected;
  Tolerance tol;  // {} is exact: always say what is allowed
  std::string what;
};
struct EqualCheck {
  Operand actual;
  Operand expected;
  std::string what;
};
struct BitwiseCheck {
  Tensor actual;
  Tensor expected;
  std::string what;
};

// Every element of `actual` within `tol` of the matching element of `expected`.
void expect_close(const CloseCheck& check,
                  std::source_location where = std::source_location::current());

// Exactly equal values (expect_close with kExact): -0 equals +0, NaN equals nothing. Values are
// compared as f64, so i64 beyond 2^53 compare as their f64 roundings (see expect_bitwise_equal).
void expect_equal(const EqualCheck& check,
                  std::source_location where = std::source_location::current());

// Same shape, same dtype, and the same bytes in every element (row-major; views compare by
// their elements, not their storage): tells -0 from +0 and NaN payloads apart.
void expect_bitwise_equal(const BitwiseCheck& check,
                          std::source_location where = std::source_location::current());

// `values` as a tensor of `dtype` holds them (through f32, as ops::from_vector stores them): the
// exact expected values of results computed in dtype.
std::vector<double> rounded_to(DType dtype, const std::vector<double>& values);

}  // namespace loom::testing
