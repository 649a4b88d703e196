// f32 element-wise work with an operand stored transposed (tensor/cpu/transpose.h) against the
// same work on contiguous operands: an add of a (1536, 768) gradient, one operand a transposed
// view (as a tensor-parallel weight's gradient came back before linear recorded itself on
// DTensors), and contiguous() of such a view. The figure is the time per call; the transposed
// rows should stay within a few times the contiguous add's.
//
//   OMP_NUM_THREADS=1 bazel run -c opt //tools/bench:transposed_operand_bench
#include <benchmark/benchmark.h>

#include "tensor/ops.h"

namespace {

using namespace loom;

constexpr int64_t kRows = 1536, kCols = 768;

void BM_AddContiguous(benchmark::State& state) {
  const Tensor a = ops::normal({kRows, kCols}, 1), b = ops::normal({kRows, kCols}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(a, b));
}

void BM_AddOneOperandTransposed(benchmark::State& state) {
  const Tensor a = ops::normal({kRows, kCols}, 1);
  const Tensor b = ops::transpose(ops::normal({kCols, kRows}, 2), 0, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(a, b));
}

void BM_ContiguousOfTransposed(benchmark::State& state) {
  const Tensor b = ops::transpose(ops::normal({kCols, kRows}, 2), 0, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::contiguous(b));
}

BENCHMARK(BM_AddContiguous)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddOneOperandTransposed)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ContiguousOfTransposed)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
