// ring_overlap_bench: how much of ring attention's send/recv time its block compute hides
// (parallel/cp/ring_attention.h), over a range of per-rank sequence lengths, and where the
// block compute overtakes the transfer (the crossover).
//
//   bazel run -c opt //tools/bench:ring_overlap_bench
//   bazel run -c opt //tools/bench:ring_overlap_bench -- --cp 4 --seq-local 128,512,2048
//
// The ranks are threads of this process, each with its own ProcessGroupGloo over loopback TCP.
// For each per-rank length T (the sequence is cp * T tokens, load-balanced), every rank runs, per
// timed iteration and after a barrier:
//   ring     one causal ring_attention call, forward and backward, with its RingAttentionProfile:
//            compute (the block computes) and exposed (the waits the compute did not hide);
//   alone    the same messages with nothing to overlap: forward cp - 1 exchanges of K and V,
//            backward cp - 2 of K and V and cp - 1 of the f32 dK, dV accumulators, each waited.
// hidden = 1 - exposed / alone (each rank's medians, clamped to [0, 1], then the mean over
// ranks); compute / alone > 1 is the regime the goal (>= 70 % hidden) is about. Compute and
// communication share the machine's cores (Gloo's I/O threads beside each rank's compute): with
// fewer cores than busy threads the share is a lower bound on what separate engines give.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "mesh/device_mesh.h"
#include "parallel/cp/context_parallel.h"
#include "parallel/cp/ring_attention.h"
#include "tensor/host_memory.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tools/bench/gloo_threads.h"

namespace {

using namespace loom;
using bench::Clock;
using bench::median;
using bench::ms_since;

struct Settings {
  int cp = 2;
  int64_t batch = 1, heads = 8, head_dim = 64;
  std::vector<int64_t> seq_local = {32, 64, 128, 256, 512, 1024, 2048};
  int warmup = 2, iters = 7, timeout_s = 300;
};

struct Point {
  double ring_ms = 0, compute_ms = 0, exposed_ms = 0, alone_ms = 0;
  int64_t sent_bytes = 0;
};

// The ring's messages alone (ring_attention.h's contract), each exchange waited before the next.
double transfer_alone_ms(comm::ProcessGroup& pg, const std::vector<Tensor>& kv,
                         const std::vector<Tensor>& grads) {
  const int n = pg.size(), r = pg.rank();
  const auto exchange = [&](const std::vector<Tensor>& out, bool forward) {
    const int to = forward ? (r + 1) % n : (r + n - 1) % n;
    const int from = forward ? (r + n - 1) % n : (r + 1) % n;
    std::vector<std::shared_ptr<comm::Work>> works;
    for (size_t i = 0; i < out.size(); ++i) {
      const Tensor in = ops::empty(out[i].shape(), out[i].dtype());
      works.push_back(pg.send(out[i], to, static_cast<int>(i)));
      works.push_back(pg.recv(in, from, static_cast<int>(i)));
    }
    for (auto& w : works) w->wait();
  };
  const auto start = Clock::now();
  for (int step = 0; step + 1 < n; ++step) exchange(kv, true);      // forward
  for (int step = 0; step + 2 < n; ++step) exchange(kv, false);     // backward's blocks
  for (int step = 0; step + 1 < n; ++step) exchange(grads, false);  // backward's accumulators
  return ms_since(start);
}

std::vector<Point> run_rank(comm::ProcessGroup& pg, const Settings& s) {
  const auto mesh = std::make_shared<const DeviceMesh>(
      pg.shared_from_this(), std::vector<std::string>{"cp"}, std::vector<int64_t>{s.cp});
  const parallel::cp::ContextParallel context(mesh, {.load_balance = true, .attention = "ring"});
  std::vector<Point> points;
  for (const int64_t t : s.seq_local) {
    const parallel::cp::SequenceLayout layout = context.layout(t * s.cp);
    const Shape shape = {s.batch, s.heads, t, s.head_dim};
    const uint64_t seed = 100 * pg.rank();
    Tensor q = ops::normal(shape, seed + 1), k = ops::normal(shape, seed + 2),
           v = ops::normal(shape, seed + 3);
    const Tensor g = ops::normal(shape, seed + 4);
    for (Tensor* x : {&q, &k, &v}) x->set_requires_grad(true);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    std::vector<double> ring, compute, exposed, alone;
    Point p;
    for (int it = 0; it < s.warmup + s.iters; ++it) {
      parallel::cp::RingAttentionProfile profile;
      pg.barrier()->wait();
      auto start = Clock::now();
      const Tensor out = parallel::cp::ring_attention(q, k, v, /*is_causal=*/true, scale, layout,
                                                      mesh->group(0), &profile);
      backward(sum(mul(out, g)));
      const double ring_ms = ms_since(start);
      for (Tensor* x : {&q, &k, &v}) x->set_grad(Tensor());
      pg.barrier()->wait();
      const double alone_ms = transfer_alone_ms(
          pg, {detach(k), detach(v)}, {ops::empty(shape, kFloat32), ops::empty(shape, kFloat32)});
      if (it < s.warmup) continue;
      ring.push_back(ring_ms);
      compute.push_back(profile.compute_ms);
      exposed.push_back(profile.wait_ms);
      alone.push_back(alone_ms);
      p.sent_bytes = profile.sent_bytes;
    }
    p.ring_ms = median(ring);
    p.compute_ms = median(compute);
    p.exposed_ms = median(exposed);
    p.alone_ms = median(alone);
    points.push_back(p);
  }
  return points;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_host_memory();  // as loom_train: tensor/host_memory.h
  CLI::App app{"Share of ring attention's send/recv time hidden behind its block compute"};
  Settings s;
  app.add_option("--cp", s.cp, "context-parallel ranks (threads)")->check(CLI::Range(2, 16));
  app.add_option("--batch", s.batch, "sequences")->check(CLI::Range(1, 64));
  app.add_option("--heads", s.heads, "attention heads")->check(CLI::Range(1, 128));
  app.add_option("--head-dim", s.head_dim, "head dimension")->check(CLI::Range(1, 512));
  app.add_option("--seq-local", s.seq_local,
                 "tokens per rank (comma-separated; each a multiple of 2, the head-tail chunks)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  app.add_option("--warmup", s.warmup, "untimed iterations")->check(CLI::Range(0, 100));
  app.add_option("--iters", s.iters, "timed iterations (medians)")->check(CLI::Range(1, 1000));
  app.add_option("--timeout-s", s.timeout_s, "the group's operation timeout")
      ->check(CLI::Range(1, 3600));
  CLI11_PARSE(app, argc, argv);
  for (const int64_t t : s.seq_local) {
    if (t % 2 != 0) {
      fmt::print(stderr,
                 "ring_overlap_bench: --seq-local {} is odd; the head-tail split needs "
                 "two equal chunks per rank\n",
                 t);
      return 2;
    }
  }

  const auto results = bench::run_on_gloo_threads<std::vector<Point>>(
      "ring_overlap_bench", s.cp, "cp", s.timeout_s,
      [&](comm::ProcessGroup& pg) { return run_rank(pg, s); });
  fmt::print(
      "ring_overlap_bench: cp {} (threads, loopback Gloo), causal, load-balanced, batch {} x {} "
      "heads x head dim {}, f32; {} hardware threads; medians of {} iterations, mean over ranks\n",
      s.cp, s.batch, s.heads, s.head_dim, std::thread::hardware_concurrency(), s.iters);
  fmt::print("{:>8} | {:>8} | {:>10} | {:>9} | {:>10} | {:>10} | {:>10} | {:>7} | {:>9}\n",
             "T/rank", "T", "MiB sent", "ring ms", "compute ms", "alone ms", "exposed ms", "hidden",
             "comp/xfer");
  for (size_t i = 0; i < s.seq_local.size(); ++i) {
    double ring = 0, compute = 0, exposed = 0, alone = 0, hidden = 0;
    for (const auto& rank : results) {
      const Point& p = rank[i];
      ring += p.ring_ms / s.cp;
      compute += p.compute_ms / s.cp;
      exposed += p.exposed_ms / s.cp;
      alone += p.alone_ms / s.cp;
      hidden += bench::hidden_share(p.exposed_ms, 0, p.alone_ms) / s.cp;
    }
    fmt::print(
        "{:>8} | {:>8} | {:>10.2f} | {:>9.2f} | {:>10.2f} | {:>10.2f} | {:>10.2f} | {:>6.0f}% "
        "| {:>9.2f}\n",
        s.seq_local[i], s.seq_local[i] * s.cp, results[0][i].sent_bytes / double(1 << 20), ring,
        compute, alone, exposed, 100 * hidden, compute / alone);
  }
  return 0;
}
