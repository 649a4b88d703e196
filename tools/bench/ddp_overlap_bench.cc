// ddp_overlap_bench: how much of DDP's gradient all-reduce time backward hides (dp = 2).
//
//   bazel run -c opt //tools/bench:ddp_overlap_bench
//   bazel run -c opt //tools/bench:ddp_overlap_bench -- --bucket-mib 1 --batch 8 --iters 20
//
// Two ranks are threads of this process, each with its own ProcessGroupGloo over loopback TCP
// (InMemoryStore rendezvous) and its own GPT replica wrapped in DistributedDataParallel. Each
// timed iteration measures, on every rank, in the same run:
//   T_local  forward + backward under ddp.no_sync() (the reducer launches nothing);
//   T_ddp    forward + backward with DDP (backward returns after finalize() has waited for every
//            bucket's all-reduce, launched from the post-accumulate hooks during backward);
//   T_comm   the same all-reduces run alone, after backward: one f32 buffer per bucket, of the
//            bucket's size (rebuilt from reducer().bucket_names() and the parameters' numel),
//            all_reduce(avg) launched in bucket order, then all waited — as the reducer does.
// Each measurement starts after a barrier. hidden = 1 - (T_ddp - T_local) / T_comm, clamped to
// [0, 1], from each rank's medians. Compute and communication share the machine's cores: each
// rank has a compute thread plus the group's worker and Gloo's I/O thread, so on a machine with
// fewer cores than busy threads "overlap" is time-slicing, and the hidden share is a lower bound
// on what separate cores (or a GPU and a NIC) would give.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "models/gpt/gpt.h"
#include "parallel/ddp/ddp.h"
#include "tensor/host_memory.h"
#include "tensor/ops.h"
#include "tools/bench/gloo_threads.h"

namespace {

using namespace loom;
using bench::Clock;
using bench::median;
using bench::ms_since;

struct Settings : bench::GPTRunSettings {
  double bucket_mib = 0.25;
};

struct RankResult {
  double local_ms = 0, ddp_ms = 0, comm_ms = 0;
  size_t buckets = 0;
  int64_t launched_during_backward = 0;
  std::vector<int64_t> bucket_bytes;
  int64_t params = 0;
};

RankResult run_rank(comm::ProcessGroup& pg, const Settings& s) {
  const models::GPTConfig config = s.config();
  auto gpt = std::make_shared<models::GPT>(config, /*seed=*/0);
  const auto cap = static_cast<int64_t>(s.bucket_mib * (1 << 20));
  ddp::DistributedDataParallel ddp(gpt, pg.shared_from_this(),
                                   {.caps = {.first_bucket_bytes = cap, .bucket_bytes = cap}});

  // The bucket sizes, rebuilt from the parameter names in each bucket.
  std::map<std::string, int64_t> numel;
  RankResult r;
  for (const auto& [name, p] : gpt->named_parameters()) {
    numel[name] = p.numel();
    r.params += p.numel();
  }
  std::vector<Tensor> comm_buffers;
  for (const auto& names : ddp.reducer().bucket_names()) {
    int64_t n = 0;
    for (const auto& name : names) n += numel.at(name);
    r.bucket_bytes.push_back(n * static_cast<int64_t>(sizeof(float)));
    comm_buffers.push_back(ops::full({n}, 1.0));
  }
  r.buckets = ddp.reducer().bucket_count();

  // Each rank its own random batch (data parallel).
  const Tensor x = bench::random_batch(1234 + pg.rank(), s.batch, s.seq, s.vocab);
  const Tensor y = bench::random_batch(5678 + pg.rank(), s.batch, s.seq, s.vocab);

  auto fwd_bwd = [&] { backward(gpt->loss(x, y)); };
  std::vector<double> local, with_ddp, comm_alone;
  for (int it = 0; it < s.warmup + s.iters; ++it) {
    const bool timed = it >= s.warmup;
    // (a) no communication
    ddp.zero_grad();
    pg.barrier()->wait();
    auto start = Clock::now();
    {
      auto guard = ddp.no_sync();
      fwd_bwd();
    }
    if (timed) local.push_back(ms_since(start));
    // (b) DDP: all-reduces overlapped with backward, waited in finalize()
    ddp.zero_grad();
    pg.barrier()->wait();
    start = Clock::now();
    fwd_bwd();
    if (timed) with_ddp.push_back(ms_since(start));
    r.launched_during_backward = ddp.reducer().buckets_launched_during_backward();
    // (c) the same bucket all-reduces alone
    pg.barrier()->wait();
    start = Clock::now();
    std::vector<std::shared_ptr<comm::Work>> works;
    for (const auto& buffer : comm_buffers)
      works.push_back(pg.all_reduce(buffer, comm::ReduceOp::kAvg));
    for (auto& w : works) w->wait();
    if (timed) comm_alone.push_back(ms_since(start));
  }
  r.local_ms = median(local);
  r.ddp_ms = median(with_ddp);
  r.comm_ms = median(comm_alone);
  return r;
}

double hidden_share(const RankResult& r) {
  return bench::hidden_share(r.ddp_ms, r.local_ms, r.comm_ms);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_host_memory();  // as loom_train: tensor/host_memory.h
  CLI::App app{
      "Share of DDP all-reduce time hidden behind backward, dp = 2 threads over loopback Gloo"};
  Settings s;
  app.add_option("--bucket-mib", s.bucket_mib, "DDP bucket cap (first and later buckets), MiB")
      ->check(CLI::Range(1e-6, 1024.0));
  s.add_options(app);
  CLI11_PARSE(app, argc, argv);

  constexpr int kWorld = 2;
  const std::vector<RankResult> results = bench::run_on_gloo_threads<RankResult>(
      "ddp_overlap_bench", kWorld, "dp", s.timeout_s,
      [&](comm::ProcessGroup& pg) { return run_rank(pg, s); });

  const RankResult& r0 = results[0];
  fmt::print(
      "ddp_overlap_bench: dp={} (threads, ProcessGroupGloo over loopback TCP); {} hardware "
      "threads\n",
      kWorld, std::thread::hardware_concurrency());
  fmt::print("GPT n_layer={} n_embd={} n_head={} vocab={}; {} params; batch {} x seq {} per rank\n",
             s.n_layer, s.n_embd, s.n_head, s.vocab, r0.params, s.batch, s.seq);
  std::string sizes;
  for (int64_t b : r0.bucket_bytes)
    sizes += fmt::format("{}{:.0f}", sizes.empty() ? "" : " ", b / 1024.0);
  fmt::print("buckets: {} (cap {} MiB; KiB: {}); launched during backward: {}\n", r0.buckets,
             s.bucket_mib, sizes, r0.launched_during_backward);
  fmt::print("medians over {} iterations after {} warm-up (ms):\n", s.iters, s.warmup);
  fmt::print("  {:<36} {:>9} {:>9}\n", "", "rank 0", "rank 1");
  fmt::print("  {:<36} {:>9.2f} {:>9.2f}\n", "T_local  fwd+bwd, no_sync", results[0].local_ms,
             results[1].local_ms);
  fmt::print("  {:<36} {:>9.2f} {:>9.2f}\n", "T_ddp    fwd+bwd, DDP", results[0].ddp_ms,
             results[1].ddp_ms);
  fmt::print("  {:<36} {:>9.2f} {:>9.2f}\n", "T_comm   bucket all-reduces alone",
             results[0].comm_ms, results[1].comm_ms);
  fmt::print("  {:<36} {:>9.2f} {:>9.2f}\n", "T_ddp - T_local (exposed comm)",
             results[0].ddp_ms - results[0].local_ms, results[1].ddp_ms - results[1].local_ms);
  fmt::print("  {:<36} {:>8.0f}% {:>8.0f}%\n", "hidden = 1 - exposed / T_comm",
             100 * hidden_share(results[0]), 100 * hidden_share(results[1]));
  fmt::print("hidden share (mean of ranks): {:.0f}%\n",
             50 * (hidden_share(results[0]) + hidden_share(results[1])));
  return 0;
}
