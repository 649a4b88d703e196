// Does fusing Linear's bias into the GEMM pay on CPU? ops::linear (the bias rows are the GEMM's
// starting C, beta = 1) against the composed matmul then add, forward only, on GPT-2 small's
// Linear shapes for one 1024-token microbatch (M = 1024): c_attn 768 -> 2304, attn.c_proj
// 768 -> 768, mlp.c_fc 768 -> 3072, mlp.c_proj 3072 -> 768. The figure is the time per call and
// the fused path's saving (the add's extra pass over the (M, N) output and its allocation).
// The CUDA path (cuBLASLt's bias epilogue) is measured by tools/gpu_check.sh's training run.
//
//   OMP_NUM_THREADS=1 bazel run -c opt //tools/bench:linear_bench
#include <benchmark/benchmark.h>

#include "tensor/ops.h"

namespace {

using namespace loom;

constexpr int64_t kTokens = 1024;

void run(benchmark::State& state, bool fused, DType dtype = kFloat32) {
  const int64_t in = state.range(0), out = state.range(1);
  const Tensor x = ops::to(ops::uniform({kTokens, in}, 1, -1.0, 1.0), dtype);
  const Tensor w = ops::to(ops::uniform({out, in}, 2, -0.05, 0.05), dtype);
  const Tensor b = ops::to(ops::uniform({out}, 3, -0.05, 0.05), dtype);
  for (auto _ : state) {
    benchmark::DoNotOptimize(fused ? ops::linear(x, w, b)
                                   : ops::add(ops::matmul(x, ops::transpose(w, 0, 1)), b));
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kTokens * in * out, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_LinearFusedBias(benchmark::State& state) { run(state, true); }
void BM_MatmulThenAdd(benchmark::State& state) { run(state, false); }
// Mixed precision's Linear: bf16 operands and result. Native bf16 GEMMs where the CPU has
// AVX512_BF16 (tensor/cpu/gemm_bf16.h); elsewhere (or with LOOM_BF16_GEMM=0) converted to f32.
void BM_LinearBf16(benchmark::State& state) { run(state, true, kBFloat16); }

#define GPT2_SMALL_SHAPES \
  ->Args({768, 2304})     \
      ->Args({768, 768})  \
      ->Args({768, 3072}) \
      ->Args({3072, 768}) \
      ->Unit(benchmark::kMillisecond)
BENCHMARK(BM_LinearFusedBias) GPT2_SMALL_SHAPES;
BENCHMARK(BM_MatmulThenAdd) GPT2_SMALL_SHAPES;
BENCHMARK(BM_LinearBf16) GPT2_SMALL_SHAPES;

// The backward's products on the same shapes, by how the second operand lies: dX = dY @ W takes
// W (out, in) as stored (N,N); the forward takes W^T as a transposed view (N,T); dW = dY^T @ X
// takes a transposed first operand (T,N). Args: (M, K, N) of C[M,N] = A[M,K] @ B[K,N].
void run_layout(benchmark::State& state, bool transpose_a, bool transpose_b) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const Tensor a = transpose_a ? ops::transpose(ops::uniform({k, m}, 1, -1.0, 1.0), 0, 1)
                               : ops::uniform({m, k}, 1, -1.0, 1.0);
  const Tensor b = transpose_b ? ops::transpose(ops::uniform({n, k}, 2, -0.05, 0.05), 0, 1)
                               : ops::uniform({k, n}, 2, -0.05, 0.05);
  for (auto _ : state) benchmark::DoNotOptimize(ops::matmul(a, b));
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * m * k * n, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
void BM_MatmulNN(benchmark::State& state) { run_layout(state, false, false); }
void BM_MatmulNT(benchmark::State& state) { run_layout(state, false, true); }
void BM_MatmulTN(benchmark::State& state) { run_layout(state, true, false); }
#define GPT2_SMALL_PRODUCTS     \
  ->Args({1024, 768, 3072})     \
      ->Args({1024, 3072, 768}) \
      ->Args({1024, 768, 2304}) \
      ->Args({1024, 2304, 768}) \
      ->Args({768, 1024, 3072}) \
      ->Unit(benchmark::kMillisecond)
BENCHMARK(BM_MatmulNN) GPT2_SMALL_PRODUCTS;
BENCHMARK(BM_MatmulNT) GPT2_SMALL_PRODUCTS;
BENCHMARK(BM_MatmulTN) GPT2_SMALL_PRODUCTS;

}  // namespace

BENCHMARK_MAIN();
