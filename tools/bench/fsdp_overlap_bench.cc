// fsdp_overlap_bench: how much of FSDP's all-gather and reduce-scatter time forward and backward
// hide (dp_shard = 4 by default), measured from timestamps as ddp_overlap_bench does for DDP.
//
//   bazel run -c opt //tools/bench:fsdp_overlap_bench
//   bazel run -c opt //tools/bench:fsdp_overlap_bench -- --world 2 --n-embd 256 --iters 10
//
// The ranks are threads of this process, each with its own ProcessGroupGloo over loopback TCP
// and a GPT fully sharded as the job shards it (per block, the last block and the root without
// resharding). Each timed iteration measures, on every rank, in the same run:
//   T_local  forward + backward of an unsharded replica of the same GPT on the same batch (the
//            compute alone);
//   T_fsdp   forward + backward of the sharded GPT: backward returns once every reduce-scatter
//            finished and the shards' gradients are in place;
//   T_sync   the same with prefetch off (FSDPOptions::prefetch): each unit gathers when it runs;
//   T_comm   the same collectives alone: per unit one all-gather of its flat buffer in forward,
//            one more for each resharding unit in backward, one reduce-scatter — issued one
//            after another and each waited, as they would run without overlap.
// Each measurement starts after a barrier; hidden = 1 - (T_fsdp - T_local) / T_comm from each
// rank's medians, clamped to [0, 1], and "prefetch saves" = (T_sync - T_fsdp) / T_comm: the share
// of the communication time that issuing gathers ahead takes off the step. T_fsdp also pays the
// copies into and out of the flat buffers, which T_local has not, so the share is a lower bound.
// Compute and communication share the machine's cores (each rank: a compute thread, the group's
// worker, Gloo's I/O): with fewer cores than busy threads "overlap" is time-slicing, and the share
// a lower bound on what separate cores (or a GPU and a NIC) give.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <thread>

#include "autograd/engine.h"
#include "models/gpt/gpt.h"
#include "parallel/fsdp/flat_layout.h"
#include "parallel/fsdp/fully_shard.h"
#include "tensor/host_memory.h"
#include "tensor/ops.h"
#include "tools/bench/gloo_threads.h"

namespace {

using namespace loom;
using bench::Clock;
using bench::median;
using bench::ms_since;

struct Settings : bench::GPTRunSettings {
  int world = 4;
};

struct RankResult {
  double local_ms = 0, fsdp_ms = 0, sync_ms = 0, comm_ms = 0;
  int64_t gathered_bytes = 0, reduced_bytes = 0;  // per step, this rank's send
};

// One unit's flat communication sizes (the layout fully_shard uses).
fsdp::FlatLayout unit_layout(const std::vector<Tensor>& params, int world) {
  std::vector<Shape> shapes;
  for (const Tensor& p : params) shapes.push_back(p.shape());
  return fsdp::FlatLayout::make(shapes, world);
}

RankResult run_rank(comm::ProcessGroup& pg, const Settings& s) {
  const models::GPTConfig config = s.config();
  auto local = std::make_shared<models::GPT>(config, /*seed=*/0);
  auto gpt = std::make_shared<models::GPT>(config, /*seed=*/0);
  auto unprefetched = std::make_shared<models::GPT>(config, /*seed=*/0);
  // The units' layouts, before sharding: each block, then the root's own parameters.
  std::vector<fsdp::FlatLayout> layouts;
  std::vector<bool> reshards;
  for (size_t i = 0; i < gpt->h.size(); ++i) {
    layouts.push_back(unit_layout(gpt->h[i]->parameters(), s.world));
    reshards.push_back(i + 1 < gpt->h.size());
  }
  std::vector<Tensor> root_params;
  for (const auto& [name, p] : gpt->named_parameters()) {
    if (name.rfind("h.", 0) != 0 && name != "lm_head.weight") root_params.push_back(p);
  }
  layouts.push_back(unit_layout(root_params, s.world));
  reshards.push_back(false);
  const auto mesh = std::make_shared<const DeviceMesh>(
      pg.shared_from_this(), std::vector<std::string>{"dp_shard"}, std::vector<int64_t>{s.world});
  for (auto [model, prefetch] : {std::pair{gpt.get(), true}, {unprefetched.get(), false}}) {
    for (size_t i = 0; i < model->h.size(); ++i) {
      fsdp::fully_shard(*model->h[i], mesh,
                        {.reshard_after_forward = reshards[i], .prefetch = prefetch});
    }
    fsdp::fully_shard(*model, mesh, {.reshard_after_forward = false, .prefetch = prefetch});
  }

  RankResult r;
  std::vector<std::pair<Tensor, Tensor>> gathers, reduces;  // (output, input)
  for (size_t u = 0; u < layouts.size(); ++u) {
    const fsdp::FlatLayout& layout = layouts[u];
    const int copies = reshards[u] ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      gathers.emplace_back(ops::empty({layout.total_numel()}, kFloat32),
                           ops::full({layout.segment_numel}, 1.0));
      r.gathered_bytes += layout.segment_numel * 4;
    }
    reduces.emplace_back(ops::empty({layout.segment_numel}, kFloat32),
                         ops::full({layout.total_numel()}, 1.0));
    r.reduced_bytes += layout.total_numel() * 4;
  }

  const Tensor x = bench::random_batch(1234 + pg.rank(), s.batch, s.seq, s.vocab);
  const Tensor y = bench::random_batch(5678 + pg.rank(), s.batch, s.seq, s.vocab);

  std::vector<double> local_ms, fsdp_ms, sync_ms, comm_ms;
  for (int it = 0; it < s.warmup + s.iters; ++it) {
    const bool timed = it >= s.warmup;
    local->zero_grad();
    pg.barrier()->wait();
    auto start = Clock::now();
    backward(local->loss(x, y));
    if (timed) local_ms.push_back(ms_since(start));

    gpt->zero_grad();
    pg.barrier()->wait();
    start = Clock::now();
    backward(gpt->loss(x, y));
    if (timed) fsdp_ms.push_back(ms_since(start));

    unprefetched->zero_grad();
    pg.barrier()->wait();
    start = Clock::now();
    backward(unprefetched->loss(x, y));
    if (timed) sync_ms.push_back(ms_since(start));

    pg.barrier()->wait();
    start = Clock::now();
    for (auto& [out, in] : gathers) pg.all_gather_into_tensor(out, in)->wait();
    for (auto& [out, in] : reduces) pg.reduce_scatter_tensor(out, in, comm::ReduceOp::kAvg)->wait();
    if (timed) comm_ms.push_back(ms_since(start));
  }
  r.local_ms = median(local_ms);
  r.fsdp_ms = median(fsdp_ms);
  r.sync_ms = median(sync_ms);
  r.comm_ms = median(comm_ms);
  return r;
}

double hidden_share(const RankResult& r) {
  return bench::hidden_share(r.fsdp_ms, r.local_ms, r.comm_ms);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_host_memory();  // as loom_train: tensor/host_memory.h
  CLI::App app{"Share of FSDP all-gather and reduce-scatter time hidden behind compute"};
  Settings s;
  s.n_embd = 256;
  s.batch = 2;
  s.warmup = 2;
  s.iters = 8;
  app.add_option("--world", s.world, "dp_shard ranks (threads)")->check(CLI::Range(2, 16));
  s.add_options(app);
  CLI11_PARSE(app, argc, argv);

  const std::vector<RankResult> results = bench::run_on_gloo_threads<RankResult>(
      "fsdp_overlap_bench", s.world, "dp_shard", s.timeout_s,
      [&](comm::ProcessGroup& pg) { return run_rank(pg, s); });
  fmt::print(
      "fsdp_overlap_bench: dp_shard {} (threads, loopback Gloo), GPT {} layers x {} wide, "
      "batch {} x {} per rank; {} hardware threads\n",
      s.world, s.n_layer, s.n_embd, s.batch, s.seq, std::thread::hardware_concurrency());
  const RankResult& r0 = results[0];
  fmt::print("per step and rank: all-gathers send {:.2f} MiB, reduce-scatters {:.2f} MiB\n",
             r0.gathered_bytes / double(1 << 20), r0.reduced_bytes / double(1 << 20));
  fmt::print("{:>5} | {:>10} | {:>10} | {:>14} | {:>10} | {:>7}\n", "rank", "local ms", "fsdp ms",
             "no-prefetch ms", "comm ms", "hidden");
  double sum = 0;
  for (int rank = 0; rank < s.world; ++rank) {
    const RankResult& r = results[rank];
    fmt::print("{:>5} | {:>10.1f} | {:>10.1f} | {:>14.1f} | {:>10.1f} | {:>6.0f}%\n", rank,
               r.local_ms, r.fsdp_ms, r.sync_ms, r.comm_ms, 100 * hidden_share(r));
    sum += hidden_share(r);
  }
  double saved = 0;
  for (const RankResult& r : results) saved += (r.sync_ms - r.fsdp_ms) / r.comm_ms;
  fmt::print("hidden (mean over ranks): {:.0f}% of the all-gather and reduce-scatter time\n",
             100 * sum / s.world);
  fmt::print(
      "prefetch saves (mean over ranks): {:.0f}% of the all-gather and reduce-scatter "
      "time ({:.1f} ms of {:.1f} ms on rank 0)\n",
      100 * saved / s.world, r0.sync_ms - r0.fsdp_ms, r0.comm_ms);
  return 0;
}
