// The CPU attention kernels' options, each against what it replaces, on one attention forward
// and backward (ops::scaled_dot_product_attention and its backward, causal, f32):
// - grouped-query attention, Hq 8 query heads over Hkv 2 (a Llama-3-like group of 4), head dim
//   64, batch 2: k and v repeated to every query head and the gradients summed back per group
//   (what Llama did before enable_gqa), against enable_gqa (the kernel reads key/value head
//   h / g in place and sums each group into dk, dv);
// - attention dropout (p 0.1, its keep factors drawn in the kernel, a Philox block per visible
//   score in the forward and again in the backward) against none, on 8 heads of their own.
// Sequence 256 and 1024.
//
//   OMP_NUM_THREADS=2 bazel run -c opt //tools/bench:attention_bench --
//     --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true   (one command)
#include <benchmark/benchmark.h>

#include "tensor/ops.h"

namespace {

using namespace loom;

constexpr int64_t kBatch = 2, kQueryHeads = 8, kKvHeads = 2, kHeadDim = 64;
constexpr int64_t kGroup = kQueryHeads / kKvHeads;

// k and v repeated per query head (B, Hkv g, T, D), and a gradient of that summed back per group.
Tensor repeat_heads(const Tensor& t) { return ops::repeat_interleave(t, kGroup, 1); }
Tensor sum_groups(const Tensor& t) {
  const Shape& s = t.shape();
  return ops::sum(ops::reshape(t, {s[0], s[1] / kGroup, kGroup, s[2], s[3]}), {2});
}

void run(benchmark::State& state, bool in_place) {
  const int64_t t = state.range(0);
  const Tensor q = ops::normal({kBatch, kQueryHeads, t, kHeadDim}, 1);
  const Tensor k = ops::normal({kBatch, kKvHeads, t, kHeadDim}, 2);
  const Tensor v = ops::normal({kBatch, kKvHeads, t, kHeadDim}, 3);
  const Tensor g = ops::normal({kBatch, kQueryHeads, t, kHeadDim}, 4);
  for (auto _ : state) {
    if (in_place) {
      const auto out = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, {}, true);
      const auto grads = ops::scaled_dot_product_attention_backward(
          g, q, k, v, out.out, out.logsumexp, true, 0.0, 0, false, {}, true);
      benchmark::DoNotOptimize(grads.dk);
    } else {
      const Tensor kr = repeat_heads(k), vr = repeat_heads(v);
      const auto out = ops::scaled_dot_product_attention(q, kr, vr, true);
      const auto grads =
          ops::scaled_dot_product_attention_backward(g, q, kr, vr, out.out, out.logsumexp, true);
      benchmark::DoNotOptimize(sum_groups(grads.dk));
      benchmark::DoNotOptimize(sum_groups(grads.dv));
    }
  }
}

void BM_RepeatedKeysAndValues(benchmark::State& state) { run(state, false); }
void BM_GroupedQueryInPlace(benchmark::State& state) { run(state, true); }

BENCHMARK(BM_RepeatedKeysAndValues)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GroupedQueryInPlace)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

void run_dropout(benchmark::State& state, double p) {
  const int64_t t = state.range(0);
  const Shape shape{kBatch, kQueryHeads, t, kHeadDim};
  const Tensor q = ops::normal(shape, 1), k = ops::normal(shape, 2), v = ops::normal(shape, 3);
  const Tensor g = ops::normal(shape, 4);
  const AttentionDropout dropout{.p = p, .seed = 5};
  for (auto _ : state) {
    const auto out = ops::scaled_dot_product_attention(q, k, v, true, 0.0, 0, dropout);
    const auto grads = ops::scaled_dot_product_attention_backward(
        g, q, k, v, out.out, out.logsumexp, true, 0.0, 0, false, dropout);
    benchmark::DoNotOptimize(grads.dq);
  }
}

void BM_NoDropout(benchmark::State& state) { run_dropout(state, 0.0); }
void BM_DropoutInKernel(benchmark::State& state) { run_dropout(state, 0.1); }

BENCHMARK(BM_NoDropout)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DropoutInKernel)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
