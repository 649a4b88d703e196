// Iteration over N strided operands of one shape: the loop every elementwise, copy and
// broadcast kernel shares. Dims of size 1 are dropped and adjacent dims that are contiguous in
// every operand are merged, so the common cases run as one flat inner loop.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tensor/shape.h"

namespace loom::cpu {

// Calls `inner(offsets, count, inner_strides)` for runs of `count` elements: element j of the
// run sits at offsets[k] + j * inner_strides[k] (in elements) in operand k. Row-major order.
template <size_t N, typename Inner>
void for_each_run(const Shape& shape, const std::array<Strides, N>& strides, Inner&& inner) {
  // Collapse: keep dims with size != 1; merge dim d into d+1 when every operand has
  // stride[d] == stride[d+1] * size[d+1].
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = st[k].back() == strides[k][d] * shape[d];
    }
    if (merge) {
      sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = strides[k][d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
    }
  }
  std::array<int64_t, N> offsets{};
  std::array<int64_t, N> inner_strides{};
  if (sizes.empty()) {
    inner(offsets, int64_t{1}, inner_strides);
    return;
  }
  const size_t ndim = sizes.size();
  for (size_t k = 0; k < N; ++k) inner_strides[k] = st[k][ndim - 1];
  const int64_t inner_count = sizes[ndim - 1];
  std::vector<int64_t> counter(ndim, 0);
  while (true) {
    inner(offsets, inner_count, inner_strides);
    // Advance the outer dims (all but the last) like an odometer.
    size_t d = ndim - 1;
    while (true) {
      if (d == 0) return;
      --d;
      ++counter[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += st[k][d];
      if (counter[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= st[k][d] * sizes[d];
      counter[d] = 0;
    }
  }
}

}  // namespace loom::cpu
