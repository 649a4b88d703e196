// cpu::for_each_run_in and parallel_for_each_run: any split of the element range visits the same
// elements at the same offsets as the whole loop, and the threaded loop writes every element
// once whatever the thread count; parallel_for names a chunk's error on the caller.
#include "tensor/cpu/strided_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/parallel.h"

namespace loom::cpu {
namespace {

// (offset of operand 0, offset of operand 1) of every element, in the order visited.
using Visits = std::vector<std::pair<int64_t, int64_t>>;

Visits visit(const RunLayout<2>& layout, int64_t begin, int64_t end) {
  Visits out;
  for_each_run_in(layout, begin, end, [&](const auto& off, int64_t count, const auto& in) {
    for (int64_t j = 0; j < count; ++j) out.emplace_back(off[0] + j * in[0], off[1] + j * in[1]);
  });
  return out;
}

struct Case {
  Shape shape;
  Strides a, b;
};

TEST(ForEachRunIn, EverySplitVisitsTheWholeLoopsElementsInOrder) {
  const std::vector<Case> cases = {
      {{16, 12, 64}, {768, 64, 1}, {768, 1, 12}},    // a transpose of the last two dims
      {{3, 1, 5, 7}, {35, 35, 7, 1}, {0, 0, 1, 0}},  // broadcast operand, a unit dim
      {{2, 3, 4}, {12, 4, 1}, {12, 4, 1}},           // contiguous: one merged run
      {{}, {}, {}},                                  // a scalar: one element
      {{5}, {3}, {1}},
  };
  for (const Case& c : cases) {
    const RunLayout<2> layout = collapse_runs<2>(c.shape, {c.a, c.b});
    const int64_t n = layout.numel();
    const Visits whole = visit(layout, 0, n);
    ASSERT_EQ(static_cast<int64_t>(whole.size()), n) << shape_str(c.shape);
    for (int64_t cut = 0; cut <= n; cut += std::max<int64_t>(1, n / 13)) {
      Visits parts = visit(layout, 0, cut);
      const Visits rest = visit(layout, cut, n);
      parts.insert(parts.end(), rest.begin(), rest.end());
      EXPECT_EQ(parts, whole) << shape_str(c.shape) << " split at " << cut;
    }
  }
}

TEST(ForEachRunIn, AZeroSizedDimHasNoElement) {
  const RunLayout<2> layout = collapse_runs<2>({4, 0, 3}, {Strides{3, 3, 1}, Strides{3, 3, 1}});
  EXPECT_EQ(layout.numel(), 0);
  EXPECT_TRUE(visit(layout, 0, 10).empty());
}

TEST(ParallelForEachRun, WritesEveryElementOnceOnAnyThreadCount) {
  // A transposed copy large enough to split: out[i][j] = in[j][i].
  const int64_t rows = 300, cols = 257;
  std::vector<float> in(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  for (int threads : {1, 2, 3}) {
    set_gemm_threads(threads);
    std::vector<float> out(in.size(), -1.0f);
    std::vector<int> writes(in.size(), 0);
    parallel_for_each_run<2>(Shape{cols, rows}, {Strides{rows, 1}, Strides{1, cols}},
                             [&](const auto& off, int64_t count, const auto& st) {
                               for (int64_t j = 0; j < count; ++j) {
                                 out[off[0] + j * st[0]] = in[off[1] + j * st[1]];
                                 ++writes[off[0] + j * st[0]];
                               }
                             });
    for (int64_t r = 0; r < cols; ++r) {
      for (int64_t c = 0; c < rows; ++c) {
        ASSERT_EQ(out[r * rows + c], in[c * cols + r]) << r << "," << c << " threads " << threads;
        ASSERT_EQ(writes[r * rows + c], 1) << r << "," << c << " threads " << threads;
      }
    }
  }
  set_gemm_threads(2);
}

TEST(ForEachRunTiled, AnyRowRangeVisitsItsElementsOnceAsTheRowMajorLoopDoes) {
  // Outer dims (3), rows not a multiple of the tile (131), a transposed operand.
  const Shape shape{3, 131, 70};
  const Strides a{131 * 70, 70, 1}, b{131 * 70, 1, 131};
  const RunLayout<2> layout = collapse_runs<2>(shape, {a, b});
  ASSERT_TRUE(strides_across_rows(layout));
  Visits whole = visit(layout, 0, layout.numel());
  std::sort(whole.begin(), whole.end());
  const int64_t rows = 3 * 131;
  for (int64_t cut : {int64_t{0}, int64_t{64}, int64_t{100}, int64_t{131}, int64_t{200}, rows}) {
    Visits tiled;
    const auto record = [&](const auto& off, int64_t count, const auto& in) {
      EXPECT_LE(count, kRunTile);
      for (int64_t j = 0; j < count; ++j)
        tiled.emplace_back(off[0] + j * in[0], off[1] + j * in[1]);
    };
    for_each_run_tiled(layout, 0, cut, record);
    for_each_run_tiled(layout, cut, rows, record);
    std::sort(tiled.begin(), tiled.end());
    EXPECT_EQ(tiled, whole) << "rows split at " << cut;
  }
}

TEST(ForEachRunTiled, OnlyLayoutsThatStrideAcrossRowsAreTiled) {
  EXPECT_TRUE(strides_across_rows(collapse_runs<2>({64, 32}, {Strides{32, 1}, Strides{1, 64}})));
  // Contiguous (one merged run), a broadcast row, a column slice every other element: row-major.
  EXPECT_FALSE(strides_across_rows(collapse_runs<2>({64, 32}, {Strides{32, 1}, Strides{32, 1}})));
  EXPECT_FALSE(strides_across_rows(collapse_runs<2>({64, 32}, {Strides{32, 1}, Strides{0, 1}})));
  EXPECT_FALSE(strides_across_rows(collapse_runs<2>({64, 32}, {Strides{32, 1}, Strides{64, 2}})));
}

TEST(ParallelFor, AChunksErrorReachesTheCaller) {
  set_gemm_threads(2);
  try {
    parallel_for(1 << 20, 1, 1, [](int64_t begin, int64_t) {
      if (begin > 0) throw std::runtime_error("chunk at " + std::to_string(begin) + " failed");
    });
    FAIL() << "expected the second chunk's error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("chunk at 524288 failed"));
  }
}

}  // namespace
}  // namespace loom::cpu
