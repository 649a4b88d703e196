// Helpers shared by the tests/comm suites: deterministic inputs every rank can recompute, and
// the expected values of reductions, rounded exactly as the backend rounds.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/types.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace loom::comm::test {

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes = {kFloat32, kBFloat16, kFloat16, kInt32, kInt64};
  return dtypes;
}

inline const std::vector<ReduceOp>& all_reduce_ops() {
  static const std::vector<ReduceOp> reduce_ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                                   ReduceOp::kMin, ReduceOp::kProduct};
  return reduce_ops;
}

// A 1-D tensor of `n` elements, element i = value(i), converted to `dtype`.
inline Tensor make_tensor(DType dtype, int64_t n, const std::function<double(int64_t)>& value) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(value(i));
  return ops::from_vector(values, {n}, dtype);
}

// Small integers whose sums (≤ 4 ranks), products, and averages are exact or rounded the same
// way by the test and by the backend, for every dtype. Negative values exercise truncating
// integer averages.
inline double input_value(ReduceOp op, int rank, int64_t slot, int64_t i) {
  const int64_t k = rank + 3 * slot + i;
  switch (op) {
    case ReduceOp::kProduct: {
      const int64_t m = k % 3;
      return m == 0 ? 2.0 : (m == 1 ? -1.0 : 1.0);
    }
    case ReduceOp::kMax:
    case ReduceOp::kMin:
      return static_cast<double>((rank * 7 + i * 3 + slot) % 11) - 5.0;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<double>((rank + 1) * ((i % 2) ? -1 : 1) + (i + slot) % 3);
  }
  return 0;
}

// The backend's result for reducing `values` (rank order) of `dtype` with `op`: f32
// accumulation for floating dtypes (then one rounding to dtype), int64 arithmetic with
// truncating average for integer dtypes.
// One step of `op`'s fold (kAvg folds as a sum; the caller divides).
template <typename T>
T fold(T acc, T v, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return acc + v;
    case ReduceOp::kProduct:
      return acc * v;
    case ReduceOp::kMax:
      return std::max(acc, v);
    case ReduceOp::kMin:
      return std::min(acc, v);
  }
  return acc;
}

inline double reduce_expected(DType dtype, ReduceOp op, const std::vector<double>& values) {
  const int world = static_cast<int>(values.size());
  if (dtype == kInt32 || dtype == kInt64) {
    int64_t acc = static_cast<int64_t>(values[0]);
    for (int r = 1; r < world; ++r) acc = fold(acc, static_cast<int64_t>(values[r]), op);
    if (op == ReduceOp::kAvg) acc /= world;
    return static_cast<double>(acc);
  }
  // Inputs went through `dtype` first.
  auto round = [&](double v) {
    return ops::to_vector(ops::to(ops::from_vector({static_cast<float>(v)}, {1}), dtype))[0];
  };
  float acc = static_cast<float>(round(values[0]));
  for (int r = 1; r < world; ++r) acc = fold(acc, static_cast<float>(round(values[r])), op);
  if (op == ReduceOp::kAvg) acc /= static_cast<float>(world);
  return round(acc);
}

}  // namespace loom::comm::test
