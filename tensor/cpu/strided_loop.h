// Iteration over N strided operands of one shape: the loop every elementwise, copy and
// broadcast kernel shares. Dims of size 1 are dropped and adjacent dims that are contiguous in
// every operand are merged, so the common cases run as one flat inner loop.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "tensor/cpu/parallel.h"
#include "tensor/shape.h"

namespace loom::cpu {

// A shape and N operands' strides with unit dims dropped and mergeable dims merged.
template <size_t N>
struct RunLayout {
  bool empty = false;          // some dim is 0: no element
  std::vector<int64_t> sizes;  // empty: a single element
  std::array<std::vector<int64_t>, N> strides;
  int64_t numel() const {
    if (empty) return 0;
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
};

template <size_t N>
RunLayout<N> collapse_runs(const Shape& shape, const std::array<Strides, N>& strides) {
  // Keep dims with size != 1; merge dim d into d+1 when every operand has
  // stride[d] == stride[d+1] * size[d+1].
  RunLayout<N> layout;
  auto& sizes = layout.sizes;
  auto& st = layout.strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) {
      layout.empty = true;
      return layout;
    }
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
  return layout;
}

// Calls `inner(offsets, count, inner_strides)` for the runs of elements [begin, end) (row-major
// positions) of `layout`: element j of a run sits at offsets[k] + j * inner_strides[k] (in
// elements) in operand k.
template <size_t N, typename Inner>
void for_each_run_in(const RunLayout<N>& layout, int64_t begin, int64_t end, Inner&& inner) {
  if (layout.empty || begin >= end) return;
  std::array<int64_t, N> offsets{};
  std::array<int64_t, N> inner_strides{};
  const auto& sizes = layout.sizes;
  const auto& st = layout.strides;
  if (sizes.empty()) {
    inner(offsets, int64_t{1}, inner_strides);
    return;
  }
  const size_t ndim = sizes.size(), last = ndim - 1;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = st[k][last];
  // The multi-index of `begin`, and its offsets.
  std::vector<int64_t> counter(ndim, 0);
  int64_t rest = begin;
  for (size_t d = ndim; d-- > 0;) {
    counter[d] = rest % sizes[d];
    rest /= sizes[d];
    for (size_t k = 0; k < N; ++k) offsets[k] += counter[d] * st[k][d];
  }
  int64_t left = end - begin;
  while (true) {
    const int64_t count = std::min(sizes[last] - counter[last], left);
    inner(offsets, count, inner_strides);
    left -= count;
    if (left == 0) return;
    // The inner dim wraps to 0; advance the outer dims like an odometer.
    for (size_t k = 0; k < N; ++k) offsets[k] -= counter[last] * st[k][last];
    counter[last] = 0;
    size_t d = last;
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

// Calls `inner(offsets, count, inner_strides)` for runs of `count` elements: element j of the
// run sits at offsets[k] + j * inner_strides[k] (in elements) in operand k. Row-major order.
template <size_t N, typename Inner>
void for_each_run(const Shape& shape, const std::array<Strides, N>& strides, Inner&& inner) {
  const RunLayout<N> layout = collapse_runs(shape, strides);
  for_each_run_in(layout, 0, layout.numel(), inner);
}

// for_each_run with the elements split over the kernel threads (parallel.h) in contiguous
// row-major ranges: for kernels whose runs write disjoint elements and read nothing another run
// writes (element-wise ops and copies, not reductions into shared accumulators). Each element's
// value is the same whatever the split.
template <size_t N, typename Inner>
void parallel_for_each_run(const Shape& shape, const std::array<Strides, N>& strides,
                           Inner&& inner) {
  const RunLayout<N> layout = collapse_runs(shape, strides);
  parallel_for(layout.numel(), kParallelGrain, 1,
               [&](int64_t begin, int64_t end) { for_each_run_in(layout, begin, end, inner); });
}

}  // namespace loom::cpu
