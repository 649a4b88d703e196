// Dispatch overhead of a DTensor op: sharding propagation + redistribution bookkeeping +
// wrapping, excluding the kernel and communication. Measured on a 1-rank mesh with tiny tensors
// (no collective can run), against the same plain op, cached (a repeated op: the decision comes
// from the per-thread cache) and uncached (cache cleared before every call).
//
//   bazel run //tools/bench:dtensor_dispatch_bench
//
// Overhead = (DTensor op time) - (plain op time).
#include <benchmark/benchmark.h>

#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "dtensor/dtensor.h"
#include "dtensor/sharding/propagator.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

std::shared_ptr<const DeviceMesh> one_rank_mesh() {
  static std::shared_ptr<const DeviceMesh> mesh = [] {
    auto store = std::make_shared<comm::InMemoryStore>();
    auto world = comm::ProcessGroupGloo::create(store, 0, 1, {.name = "bench"},
                                                comm::GlooOptions::loopback());
    return std::make_shared<const DeviceMesh>(world, std::vector<std::string>{"tp"},
                                              std::vector<int64_t>{1});
  }();
  return mesh;
}

void BM_PlainAdd(benchmark::State& state) {
  const Tensor a = ops::ones({4}), b = ops::ones({4});
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(a, b));
}
BENCHMARK(BM_PlainAdd);

void BM_DTensorAddCached(benchmark::State& state) {
  auto mesh = one_rank_mesh();
  const Tensor a = distribute_tensor(ops::ones({4}), mesh, {Shard(0)}, std::nullopt);
  const Tensor b = distribute_tensor(ops::ones({4}), mesh, {Shard(0)}, std::nullopt);
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(a, b));
}
BENCHMARK(BM_DTensorAddCached);

void BM_DTensorAddUncached(benchmark::State& state) {
  auto mesh = one_rank_mesh();
  const Tensor a = distribute_tensor(ops::ones({4}), mesh, {Shard(0)}, std::nullopt);
  const Tensor b = distribute_tensor(ops::ones({4}), mesh, {Shard(0)}, std::nullopt);
  for (auto _ : state) {
    sharding::clear_propagation_cache();
    benchmark::DoNotOptimize(ops::add(a, b));
  }
}
BENCHMARK(BM_DTensorAddUncached);

void BM_PlainMatmul(benchmark::State& state) {
  const Tensor a = ops::ones({2, 2}), b = ops::ones({2, 2});
  for (auto _ : state) benchmark::DoNotOptimize(ops::matmul(a, b));
}
BENCHMARK(BM_PlainMatmul);

void BM_DTensorMatmulCached(benchmark::State& state) {
  auto mesh = one_rank_mesh();
  const Tensor a = distribute_tensor(ops::ones({2, 2}), mesh, {Replicate()}, std::nullopt);
  const Tensor b = distribute_tensor(ops::ones({2, 2}), mesh, {Shard(1)}, std::nullopt);
  for (auto _ : state) benchmark::DoNotOptimize(ops::matmul(a, b));
}
BENCHMARK(BM_DTensorMatmulCached);

void BM_DTensorMatmulUncached(benchmark::State& state) {
  auto mesh = one_rank_mesh();
  const Tensor a = distribute_tensor(ops::ones({2, 2}), mesh, {Replicate()}, std::nullopt);
  const Tensor b = distribute_tensor(ops::ones({2, 2}), mesh, {Shard(1)}, std::nullopt);
  for (auto _ : state) {
    sharding::clear_propagation_cache();
    benchmark::DoNotOptimize(ops::matmul(a, b));
  }
}
BENCHMARK(BM_DTensorMatmulUncached);

}  // namespace

BENCHMARK_MAIN();
