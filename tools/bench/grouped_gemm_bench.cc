// The MoE's grouped expert GEMM (ops::grouped_mm: every expert's rows in one call, written in
// place) against a loop of per-expert GEMMs over the same token counts (torchtitan's
// _run_experts_for_loop: the rows split per expert, one matmul each, the outputs concatenated),
// on uneven loads: expert e gets a share of the slots proportional to 1 / (e + 1) (Zipf), the
// last experts none when the slots run out. One projection, x (slots, dim) times each expert's
// (hidden, dim)^T, f32 on CPU. Args: experts, slots, dim, hidden.
//
//   bazel run -c opt //tools/bench:grouped_gemm_bench
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "tensor/ops.h"

namespace {

using namespace loom;

// Zipf-shaped loads over `experts` summing to `slots`, as G + 1 offsets.
std::vector<int64_t> uneven_offsets(int64_t experts, int64_t slots) {
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) total += 1.0 / static_cast<double>(e + 1);
  std::vector<int64_t> offsets(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    const auto share =
        static_cast<int64_t>(std::floor(slots / (total * static_cast<double>(e + 1))));
    offsets[e + 1] = std::min(slots, offsets[e] + share);
  }
  offsets[experts] = slots;  // the rounding's remainder to the last expert
  return offsets;
}

void run(benchmark::State& state, bool grouped) {
  const int64_t experts = state.range(0), slots = state.range(1), dim = state.range(2),
                hidden = state.range(3);
  const Tensor x = ops::uniform({slots, dim}, 1, -1.0, 1.0);
  const Tensor w = ops::uniform({experts, hidden, dim}, 2, -0.05, 0.05);
  const std::vector<int64_t> offsets = uneven_offsets(experts, slots);
  for (auto _ : state) {
    if (grouped) {
      benchmark::DoNotOptimize(ops::grouped_mm(x, w, offsets, /*transpose_b=*/true));
      continue;
    }
    std::vector<Tensor> parts;
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t n = offsets[e + 1] - offsets[e];
      if (n == 0) continue;
      parts.push_back(ops::matmul(ops::narrow(x, 0, offsets[e], n),
                                  ops::transpose(ops::squeeze(ops::narrow(w, 0, e, 1), 0), 0, 1)));
    }
    benchmark::DoNotOptimize(ops::cat(parts, 0));
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * slots * dim * hidden, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void BM_GroupedMm(benchmark::State& state) { run(state, true); }
void BM_PerExpertLoop(benchmark::State& state) { run(state, false); }

// llama-moe-tiny's layer (8 experts of 48 over dim 64, 2 x 256 slots), then DeepSeek-like
// fine-grained experts at a CPU-sized width (dim 512, hidden 256) with 8 to 256 experts.
#define MOE_SHAPES                  \
  ->Args({8, 512, 64, 48})          \
      ->Args({8, 4096, 512, 256})   \
      ->Args({16, 4096, 512, 256})  \
      ->Args({32, 4096, 512, 256})  \
      ->Args({64, 4096, 512, 256})  \
      ->Args({128, 4096, 512, 256}) \
      ->Args({256, 4096, 512, 256}) \
      ->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_GroupedMm) MOE_SHAPES;
BENCHMARK(BM_PerExpertLoop) MOE_SHAPES;

}  // namespace

BENCHMARK_MAIN();
