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

// Whether row-major runs would stride through some operand: its last dim's stride is above 1 and
// above the stride of the dim before (a transposed operand, as a weight's gradient taken through
// a transposed view). Row by row, each of its elements would then be a new cache line: an add
// of a (1536, 768) gradient into its transposed accumulator ran at 6 ns per element.
template <size_t N>
bool strides_across_rows(const RunLayout<N>& layout) {
  if (layout.empty || layout.sizes.size() < 2) return false;
  const size_t last = layout.sizes.size() - 1;
  for (size_t k = 0; k < N; ++k) {
    const int64_t inner = layout.strides[k][last], outer = layout.strides[k][last - 1];
    if (inner > 1 && (outer >= 0 ? outer : -outer) < inner) return true;
  }
  return false;
}

// Rows and columns of a tile of the last two dims (strides_across_rows layouts): a tile's lines
// of every operand stay in L1 even where a leading dim aliases to a few cache sets (16: measured
// best for a transposed (1536, 768) copy against 32 and 64).
inline constexpr int64_t kRunTile = 16;

// Calls block(bases, r0, r1) over the rows [row_begin, row_end) of the flattened (outer dims x
// rows) index of a layout of two or more dims, once per stretch of rows [r0, r1) that shares its
// outer index: bases[k] is operand k's offset of that outer index's element (0, 0).
template <size_t N, typename Block>
void for_each_row_block(const RunLayout<N>& layout, int64_t row_begin, int64_t row_end,
                        Block&& block) {
  const auto& sizes = layout.sizes;
  const auto& st = layout.strides;
  const size_t last = sizes.size() - 1;
  const int64_t rows = sizes[last - 1];
  for (int64_t flat = row_begin; flat < row_end;) {
    int64_t outer = flat / rows;
    const int64_t r0 = flat % rows, r1 = std::min(rows, r0 + (row_end - flat));
    std::array<int64_t, N> bases{};
    for (size_t d = last - 1; d-- > 0;) {
      const int64_t i = outer % sizes[d];
      outer /= sizes[d];
      for (size_t k = 0; k < N; ++k) bases[k] += i * st[k][d];
    }
    block(bases, r0, r1);
    flat += r1 - r0;
  }
}

// for_each_row_block with the rows split over the kernel threads (parallel.h) in blocks of whole
// rows, each a multiple of kRunTile: for kernels that write disjoint elements, as
// parallel_for_each_run's.
template <size_t N, typename Block>
void parallel_for_each_row_block(const RunLayout<N>& layout, Block&& block) {
  const int64_t cols = layout.sizes.back();
  parallel_for(layout.numel() / cols, std::max<int64_t>(1, kParallelGrain / cols), kRunTile,
               [&](int64_t begin, int64_t end) { for_each_row_block(layout, begin, end, block); });
}

// The tiles of one stretch of rows [row0, row_stop) at `bases` (for_each_row_block's): within a
// tile, one run of at most kRunTile elements per row.
template <size_t N, typename Inner>
void run_tiles(const RunLayout<N>& layout, const std::array<int64_t, N>& bases, int64_t row0,
               int64_t row_stop, Inner&& inner) {
  const auto& st = layout.strides;
  const size_t last = layout.sizes.size() - 1;
  const int64_t cols = layout.sizes[last];
  std::array<int64_t, N> inner_strides{};
  for (size_t k = 0; k < N; ++k) inner_strides[k] = st[k][last];
  for (int64_t r0 = row0; r0 < row_stop; r0 += kRunTile) {
    const int64_t r1 = std::min(row_stop, r0 + kRunTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kRunTile) {
      const int64_t count = std::min(kRunTile, cols - c0);
      for (int64_t r = r0; r < r1; ++r) {
        std::array<int64_t, N> offsets;
        for (size_t k = 0; k < N; ++k) {
          offsets[k] = bases[k] + r * st[k][last - 1] + c0 * st[k][last];
        }
        inner(offsets, count, inner_strides);
      }
    }
  }
}

// for_each_run_in over the last two dims in kRunTile x kRunTile tiles, for the rows [row_begin,
// row_end) of the flattened (outer dims x rows) index: within a tile, one run of at most kRunTile
// elements per row. Every element is visited once; the order is not row-major.
template <size_t N, typename Inner>
void for_each_run_tiled(const RunLayout<N>& layout, int64_t row_begin, int64_t row_end,
                        Inner&& inner) {
  for_each_row_block(layout, row_begin, row_end,
                     [&](const std::array<int64_t, N>& bases, int64_t row0, int64_t row_stop) {
                       run_tiles(layout, bases, row0, row_stop, inner);
                     });
}

// for_each_run with the elements split over the kernel threads (parallel.h) in contiguous
// row-major ranges (in blocks of whole rows, walked in tiles, where strides_across_rows): for
// kernels whose runs write disjoint elements and read nothing another run writes (element-wise
// ops and copies, not reductions into shared accumulators). Each element's value is the same
// whatever the split and the order.
template <size_t N, typename Inner>
void parallel_for_each_run(const Shape& shape, const std::array<Strides, N>& strides,
                           Inner&& inner) {
  const RunLayout<N> layout = collapse_runs(shape, strides);
  if (strides_across_rows(layout)) {
    parallel_for_each_row_block(
        layout, [&](const std::array<int64_t, N>& bases, int64_t row0, int64_t row_stop) {
          run_tiles(layout, bases, row0, row_stop, inner);
        });
    return;
  }
  parallel_for(layout.numel(), kParallelGrain, 1,
               [&](int64_t begin, int64_t end) { for_each_run_in(layout, begin, end, inner); });
}

}  // namespace loom::cpu
