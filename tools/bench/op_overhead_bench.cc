// Per-call overhead of a small elementwise op (64 f32 elements): the plain op, the
// differentiable op with grad mode off, and the differentiable op recording a graph node.
// The kernel itself is ~64 adds, so these times are almost all bookkeeping: allocation,
// broadcasting checks, dispatch, and (when recording) the graph node.
//
//   bazel run //tools/bench:op_overhead_bench
#include <benchmark/benchmark.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

constexpr int64_t kElements = 64;

void BM_PlainAdd(benchmark::State& state) {
  const Tensor a = ops::ones({kElements}), b = ops::ones({kElements});
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(a, b));
}
BENCHMARK(BM_PlainAdd);

void BM_PlainMulScalar(benchmark::State& state) {
  const Tensor a = ops::ones({kElements});
  for (auto _ : state) benchmark::DoNotOptimize(ops::mul(a, 2.0));
}
BENCHMARK(BM_PlainMulScalar);

void BM_DifferentiableAddNoGradInputs(benchmark::State& state) {
  const Tensor a = ops::ones({kElements}), b = ops::ones({kElements});
  for (auto _ : state) benchmark::DoNotOptimize(add(a, b));
}
BENCHMARK(BM_DifferentiableAddNoGradInputs);

void BM_DifferentiableAddRecording(benchmark::State& state) {
  Tensor a = ops::ones({kElements}), b = ops::ones({kElements});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  for (auto _ : state) benchmark::DoNotOptimize(add(a, b));
}
BENCHMARK(BM_DifferentiableAddRecording);

void BM_DifferentiableAddUnderNoGrad(benchmark::State& state) {
  Tensor a = ops::ones({kElements}), b = ops::ones({kElements});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  NoGradGuard no_grad;
  for (auto _ : state) benchmark::DoNotOptimize(add(a, b));
}
BENCHMARK(BM_DifferentiableAddUnderNoGrad);

void BM_ForwardAndBackwardAdd(benchmark::State& state) {
  // Recording plus running the one-node backward (seeded, no sum), for scale.
  Tensor a = ops::ones({kElements}), b = ops::ones({kElements});
  a.set_requires_grad(true);
  const Tensor seed = ops::ones({kElements});
  for (auto _ : state) {
    Tensor y = add(a, b);
    backward(y, seed);
    a.set_grad(Tensor());
  }
}
BENCHMARK(BM_ForwardAndBackwardAdd);

}  // namespace

BENCHMARK_MAIN();
