#include "tests/testing/tensor_checks.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "tensor/ops.h"

namespace loom::testing {
namespace {

// "tensor (2, 3) f32 on cuda:0" / "list of 6 values".
std::string describe(const Operand& operand) {
  if (!operand.is_tensor()) return fmt::format("list of {} values", operand.values().size());
  const Tensor& t = operand.tensor();
  if (!t.defined()) return "undefined tensor";
  return fmt::format("tensor {} {} on {}", shape_str(t.shape()), dtype_name(t.dtype()),
                     t.device().str());
}

// "[1, 4]" for flat index 9 of shape (2, 5); "[9]" without a shape.
std::string index_str(int64_t flat, const Shape* shape) {
  if (shape == nullptr || shape->size() <= 1) return fmt::format("[{}]", flat);
  std::vector<int64_t> index(shape->size());
  for (size_t d = shape->size(); d-- > 0;) {
    index[d] = flat % (*shape)[d];
    flat /= (*shape)[d];
  }
  return fmt::format("[{}]", fmt::join(index, ", "));
}

// Why `actual` and `expected` cannot be compared element by element, or nullopt.
std::optional<std::string> layout_mismatch(const Operand& actual, const Operand& expected) {
  const auto mismatch = [&](std::string_view what) {
    return fmt::format("{} differs: actual is a {}, expected a {}", what, describe(actual),
                       describe(expected));
  };
  for (const Operand* side : {&actual, &expected}) {
    if (side->is_tensor() && !side->tensor().defined()) return mismatch("definedness");
  }
  for (const Operand* side : {&actual, &expected}) {
    if (side->is_tensor() && side->tensor().extension()) {
      return fmt::format("{} is a distributed tensor ({}): compare its full_tensor",
                         side == &actual ? "actual" : "expected", side->tensor().description());
    }
  }
  if (actual.is_tensor() && expected.is_tensor()) {
    if (actual.tensor().shape() != expected.tensor().shape()) return mismatch("shape");
    if (actual.tensor().dtype() != expected.tensor().dtype()) return mismatch("dtype");
    return std::nullopt;
  }
  const auto numel = [](const Operand& o) {
    return o.is_tensor() ? o.tensor().numel() : static_cast<int64_t>(o.values().size());
  };
  if (numel(actual) != numel(expected)) return mismatch("number of elements");
  return std::nullopt;
}

std::vector<double> values_of(const Operand& operand) {
  return operand.is_tensor() ? ops::to_vector(operand.tensor()) : operand.values();
}

std::string tolerance_str(const Tolerance& tol, double largest) {
  if (tol.rtol == 0 && tol.atol == 0) {
    return fmt::format("exact equality{}", tol.equal_nan ? ", NaN equal to NaN" : "");
  }
  const std::string scale = tol.relative_to == RelativeTo::kElement
                                ? "|expected|"
                                : fmt::format("max |expected| (= {:.9g})", largest);
  return fmt::format("|actual - expected| <= atol + rtol * {} with rtol {:g}, atol {:g}{}", scale,
                     tol.rtol, tol.atol, tol.equal_nan ? ", NaN equal to NaN" : "");
}

// The failure message of `check`, or nullopt when it passes.
std::optional<std::string> close_failure(const CloseCheck& check) {
  if (auto mismatch = layout_mismatch(check.actual, check.expected)) return mismatch;
  const std::vector<double> a = values_of(check.actual), e = values_of(check.expected);
  const Tolerance& tol = check.tol;
  double largest = 0;
  for (double v : e) {
    if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
  }
  // The worst element: the largest excess of its error over what it is allowed (infinite for
  // NaN or infinity mismatches, which come first).
  int64_t failing = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == e[i]) continue;
    const bool nan = std::isnan(a[i]) || std::isnan(e[i]);
    if (nan && tol.equal_nan && std::isnan(a[i]) && std::isnan(e[i])) continue;
    double excess = INFINITY;
    if (!nan && std::isfinite(a[i]) && std::isfinite(e[i])) {
      const double scale = tol.relative_to == RelativeTo::kElement ? std::abs(e[i]) : largest;
      const double allowed = tol.atol + tol.rtol * scale;
      if (std::abs(a[i] - e[i]) <= allowed) continue;
      excess = std::abs(a[i] - e[i]) - allowed;
    }
    ++failing;
    if (worst < 0 || excess > worst_excess) {
      worst = static_cast<int64_t>(i);
      worst_excess = excess;
    }
  }
  if (failing == 0) return std::nullopt;
  const double wa = a[worst], we = e[worst], error = std::abs(wa - we);
  const double scale = tol.relative_to == RelativeTo::kElement ? std::abs(we) : largest;
  const Shape* shape = check.expected.is_tensor() ? &check.expected.tensor().shape()
                       : check.actual.is_tensor() ? &check.actual.tensor().shape()
                                                  : nullptr;
  return fmt::format(
      "{} of {} elements out of tolerance; worst at {}: actual {:.9g}, expected {:.9g}, "
      "abs error {:.3g}, relative error {:.3g}, allowed {:.3g}; tolerance: {}",
      failing, a.size(), index_str(worst, shape), wa, we, error, error / std::abs(we),
      tol.atol + tol.rtol * scale, tolerance_str(tol, largest));
}

void report(const std::optional<std::string>& failure, const std::string& what,
            const std::source_location& where) {
  if (!failure) return;
  ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line()))
      << (what.empty() ? "" : what + ": ") << *failure;
}

}  // namespace

void expect_close(const CloseCheck& check, std::source_location where) {
  report(close_failure(check), check.what, where);
}

void expect_equal(const EqualCheck& check, std::source_location where) {
  report(close_failure({check.actual, check.expected, kExact, check.what}), check.what, where);
}

void expect_bitwise_equal(const BitwiseCheck& check, std::source_location where) {
  const Operand actual(check.actual), expected(check.expected);
  std::optional<std::string> failure = layout_mismatch(actual, expected);
  if (!failure) {
    const Tensor a = ops::contiguous(ops::to(check.actual, Device::cpu()));
    const Tensor e = ops::contiguous(ops::to(check.expected, Device::cpu()));
    const size_t size = element_size(a.dtype());
    const auto* pa = static_cast<const unsigned char*>(a.raw_data());
    const auto* pe = static_cast<const unsigned char*>(e.raw_data());
    int64_t differing = 0, first = -1;
    for (int64_t i = 0; i < a.numel(); ++i) {
      if (std::memcmp(pa + i * size, pe + i * size, size) == 0) continue;
      if (differing++ == 0) first = i;
    }
    if (differing > 0) {
      const std::vector<double> av = ops::to_vector(a), ev = ops::to_vector(e);
      failure = fmt::format(
          "{} of {} elements differ in their bytes; first at {}: actual {:.9g}, expected {:.9g}",
          differing, a.numel(), index_str(first, &a.shape()), av[first], ev[first]);
    }
  }
  report(failure, check.what, where);
}

std::vector<double> rounded_to(DType dtype, const std::vector<double>& values) {
  const std::vector<float> as_float(values.begin(), values.end());
  return ops::to_vector(
      ops::to(ops::from_vector(as_float, {static_cast<int64_t>(as_float.size())}), dtype));
}

}  // namespace loom::testing
