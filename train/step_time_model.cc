#include "train/step_time_model.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "base/cache_dir.h"
#include "base/error.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "parallel/ft/traced_replicas.h"
#include "parallel/pipeline/schedules.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The ranks of the group named `group` ("mesh/tp", "mesh/dp_replicate_dp_shard", "default"):
// the product of the mesh dims its name mentions, the world when it names none; the replicas'
// group has `replicas`.
int64_t group_size(const std::string& group, const ParallelConfig& parallel, int64_t world,
                   int64_t replicas) {
  if (group == parallel::ft::kTracedReplicasGroup) return replicas;
  const std::vector<std::string> names = parallel.dims.names();
  const std::vector<int64_t> sizes = parallel.dims.sizes();
  int64_t size = 1;
  bool any = false;
  for (size_t d = 0; d < names.size(); ++d) {
    if (group.find(names[d]) == std::string::npos) continue;
    // "dp_shard" also contains no other dim's name; "dp_replicate_dp_shard" contains two.
    size *= sizes[d];
    any = true;
  }
  return any ? size : world;
}

// The bandwidth of `group`'s links: the slowest per-dim figure among the dims its name
// mentions, else the machine's.
double group_bytes_per_s(const std::string& group, const MachineModel& m) {
  double rate = 0;
  for (const auto& [dim, bytes_per_s] : m.dim_bytes_per_s) {
    if (group.find(dim) == std::string::npos) continue;
    rate = rate == 0 ? bytes_per_s : std::min(rate, bytes_per_s);
  }
  return rate > 0 ? rate : m.bytes_per_s;
}

// Seconds of one operation of `kind` moving `bytes` (this rank's input) in a group of n ranks
// whose links carry `bytes_per_s`.
double operation_seconds(comm::CollectiveKind kind, double bytes, int64_t n, const MachineModel& m,
                         double bytes_per_s) {
  const double alpha = m.latency_s, beta = 1.0 / bytes_per_s;
  const double p2p_alpha = m.p2p_latency_s > 0 ? m.p2p_latency_s : m.latency_s;
  const double k = static_cast<double>(std::max<int64_t>(n, 1));
  switch (kind) {
    case comm::CollectiveKind::kAllReduce:
      return n <= 1 ? 0 : 2 * (k - 1) * alpha + 2 * (k - 1) / k * bytes * beta;
    case comm::CollectiveKind::kAllGather:
    case comm::CollectiveKind::kGather:
      return n <= 1 ? 0 : (k - 1) * alpha + (k - 1) * bytes * beta;
    case comm::CollectiveKind::kReduceScatter:
    case comm::CollectiveKind::kAllToAll:
    case comm::CollectiveKind::kScatter:
      return n <= 1 ? 0 : (k - 1) * alpha + (k - 1) / k * bytes * beta;
    case comm::CollectiveKind::kBroadcast:
      return n <= 1 ? 0 : std::ceil(std::log2(k)) * alpha + bytes * beta;
    case comm::CollectiveKind::kSend:
      return p2p_alpha + bytes * beta;
    case comm::CollectiveKind::kRecv:
      return p2p_alpha;  // the bytes are its sender's time; the hand-off is paid on both sides
    case comm::CollectiveKind::kBarrier:
      return alpha;
  }
  return 0;
}

// Runs body(group, rank) on two thread ranks of a Gloo group named `name` over loopback; a rank's
// exception is rethrown here, never out of its thread.
void on_two_thread_ranks(const std::string& name,
                         const std::function<void(comm::ProcessGroup&, int)>& body) {
  const auto store = std::make_shared<comm::InMemoryStore>();
  std::vector<std::exception_ptr> failed(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto pg = comm::ProcessGroupGloo::create(store, r, 2, {.name = name},
                                                 comm::GlooOptions::loopback());
        body(*pg, r);
      } catch (...) {
        failed[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

// Seconds a point-to-point send or receive adds to a rank that computes between them (a
// pipeline's hand-off): two thread ranks exchange a small message back and forth after each
// small GEMM, against the same GEMMs alone; the median of five rounds, per op. Unlike a
// collective (a shared-memory barrier between the ranks' op threads), a send or receive passes
// through Gloo's TCP transport and wakes several threads (the op's, Gloo's I/O thread, the
// waiting caller), each of which waits for a core once the ranks have gone to sleep.
double measure_p2p_handoff() {
  const int64_t rounds = 5, exchanges = 40;
  std::vector<double> excess(rounds, 0);
  on_two_thread_ranks("calibrate_p2p", [&](comm::ProcessGroup& pg, int r) {
    NoGradGuard no_grad;
    const Tensor a = ops::normal({192, 192}, 3 + r), b = ops::normal({192, 192}, 5 + r);
    const Tensor message = ops::zeros({256});
    const int peer = 1 - r;
    const auto run = [&](bool exchange) {
      pg.barrier()->wait();
      const auto begin = Clock::now();
      for (int64_t i = 0; i < exchanges; ++i) {
        ops::matmul(a, b);
        if (!exchange) continue;
        // Rank 0 sends first (tag 0) and rank 1 answers (tag 1).
        if (r == 0) pg.send(message, peer, 0)->wait();
        pg.recv(message, peer, 1 - r)->wait();
        if (r == 1) pg.send(message, peer, 1)->wait();
      }
      pg.barrier()->wait();
      return seconds_since(begin);
    };
    run(true);  // warm up: connections, helper threads, the GEMM's kernel
    for (int64_t k = 0; k < rounds; ++k) {
      const double alone = run(false), with = run(true);
      // Each rank sends once and receives once per exchange.
      if (r == 0) excess[k] = std::max(0.0, with - alone) / (2.0 * exchanges);
    }
  });
  std::sort(excess.begin(), excess.end());
  return excess[rounds / 2];
}

}  // namespace

MachineModel MachineModel::for_cpu_ranks(const nlohmann::json& calibration, int64_t ranks) {
  MachineModel m;
  const double host = calibration.at("gemm_flops_per_s").get<double>();
  const double share = static_cast<double>(std::max<int64_t>(ranks, 1));
  const double cores = std::max(1.0, calibration.value("cores", 1.0));
  m.rank_flops_per_s = host / share;
  m.seconds_per_written_byte = calibration.value("seconds_per_written_byte", 0.0) * share;
  m.ranks_per_core = std::max(1.0, share / cores);
  m.seconds_per_op = calibration.value("seconds_per_op", 0.0) * m.ranks_per_core;
  m.latency_s = calibration.at("latency_s").get<double>();
  // The hand-off's thread wake-ups each wait for a core shared by ranks_per_core ranks
  // (calibrations written before the hand-off was measured fall back to the collectives').
  m.p2p_latency_s = calibration.value("p2p_handoff_s", m.latency_s) * m.ranks_per_core;
  // The calibration's two ranks each had min(1, cores / 2) of a core to move bytes with; these
  // ranks have min(1, cores / ranks) each.
  const double core_share = std::min(1.0, cores / share) / std::min(1.0, cores / 2);
  m.bytes_per_s = calibration.at("bytes_per_s").get<double>() * core_share;
  m.data_parallel_overlap = share < cores ? 1 : 0;
  m.source = fmt::format("calibrated on {} at {} ({}; {} ranks share its {} cores)",
                         calibration.value("host", "?"), calibration.value("when", "?"),
                         calibration_path(), ranks, calibration.value("cores", 0));
  return m;
}

nlohmann::json calibrate_machine() {
  std::optional<NoGradGuard> no_grad(std::in_place);
  // The GEMM: an MLP-sized f32 product with every core, as a CPU job's ranks share them.
  const int64_t m = 512, k = 768, n = 3072;
  const Tensor a = ops::normal({m, k}, 1), b = ops::normal({k, n}, 2);
  ops::matmul(a, b);  // warm up (oneDNN's first call picks its kernel)
  int reps = 0;
  const auto start = Clock::now();
  while (reps < 5 || seconds_since(start) < 1.0) {
    ops::matmul(a, b);
    ++reps;
  }
  const double gemm = 2.0 * m * n * k * reps / seconds_since(start);

  // Memory-bound ops: a large add (every core, as the kernels split it) per written byte.
  const Tensor big_a = ops::zeros({16 << 20}), big_b = ops::zeros({16 << 20});
  ops::add(big_a, big_b);
  const auto add_start = Clock::now();
  for (int i = 0; i < 10; ++i) ops::add(big_a, big_b);
  const double per_byte = seconds_since(add_start) / (10.0 * 4 * (16 << 20));
  // A small op's overhead, recorded by autograd as a training step's ops are.
  no_grad.reset();
  Tensor leaf = ops::zeros({256});
  leaf.set_requires_grad(true);
  const auto op_start = Clock::now();
  for (int i = 0; i < 2000; ++i) ops::add(leaf, leaf);
  const double per_op = seconds_since(op_start) / 2000;

  // Gloo all-reduces between two thread ranks: a small one's time is latency, a large one's
  // adds its bytes.
  double small_s = 0, large_s = 0;
  const int64_t small_elems = 256, large_elems = 4 << 20;  // 1 KiB, 16 MiB
  on_two_thread_ranks("calibrate", [&](comm::ProcessGroup& pg, int r) {
    // The best of five rounds: what the link can do, not what a busy moment allowed.
    const auto time = [&](int64_t elems, int count) {
      const Tensor t = ops::zeros({elems});
      double best = 1e30;
      for (int round = 0; round < 5; ++round) {
        pg.barrier()->wait();
        const auto begin = Clock::now();
        for (int i = 0; i < count; ++i) pg.all_reduce(t)->wait();
        best = std::min(best, seconds_since(begin) / count);
      }
      return best;
    };
    const double s = time(small_elems, 100), l = time(large_elems, 4);
    if (r == 0) small_s = s, large_s = l;
  });
  const double p2p_handoff = measure_p2p_handoff();
  // Two ranks: 2 alpha + B beta (operation_seconds' all_reduce with n = 2).
  const double latency = small_s / 2;
  const double large_bytes = 4.0 * large_elems;
  const double bytes_per_s = large_bytes / std::max(large_s - 2 * latency, 1e-9);

  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M", std::gmtime(&now));
  return {{"gemm_flops_per_s", gemm},
          {"seconds_per_written_byte", per_byte},
          {"seconds_per_op", per_op},
          {"gemm_shape", fmt::format("({}, {}) x ({}, {}) f32", m, k, k, n)},
          {"cores", std::thread::hardware_concurrency()},
          {"latency_s", latency},
          {"bytes_per_s", bytes_per_s},
          {"p2p_handoff_s", p2p_handoff},
          {"all_reduce_1KiB_s", small_s},
          {"all_reduce_16MiB_s", large_s},
          {"host", host},
          {"when", when}};
}

std::string calibration_path() {
  return (std::filesystem::path(loom_cache_dir()) / "plan_machine.json").string();
}

std::optional<nlohmann::json> load_calibration() {
  std::ifstream in(calibration_path());
  if (!in) return std::nullopt;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        fmt::format("{}: not a calibration written by `loom plan --calibrate` ({}); run "
                    "it again",
                    calibration_path(), e.what()));
  }
}

double pipeline_bubble(const ParallelConfig& parallel) {
  if (parallel.dims.pp == 1) return 1;
  // The job's own schedule on a timeline: B twice F, half of it the weights' (Qi et al.'s
  // F = I = W), so every schedule's bubble, the split ones' included, comes the same way.
  const pipeline::Schedule schedule =
      pipeline::schedule_by_name(parallel.pipeline.schedule, static_cast<int>(parallel.dims.pp),
                                 parallel.microbatches(), parallel.pipeline.virtual_stages);
  return 1.0 / (1.0 - pipeline::simulated_idle_share(schedule, 1.0, 2.0, 1.0));
}

double step_bubble(double bubble, const MachineModel& machine) {
  return machine.ranks_per_core > 1 ? std::max(1.0, bubble / machine.ranks_per_core) : bubble;
}

StepTimeEstimate estimate_step_time(const std::vector<TracedRank>& traced,
                                    const ParallelConfig& parallel, int64_t tokens,
                                    int64_t world_size, const MachineModel& machine,
                                    int64_t replicas) {
  LOOM_CHECK(machine.rank_flops_per_s > 0 && machine.bytes_per_s > 0,
             "estimate_step_time: the machine's rates must be positive, got {} FLOP/s and {} B/s",
             machine.rank_flops_per_s, machine.bytes_per_s);
  StepTimeEstimate out;
  double slowest = -1;
  int64_t flops_of_slowest = 0;
  for (const TracedRank& rank : traced) {
    const double compute =
        static_cast<double>(rank.flops) / machine.rank_flops_per_s +
        static_cast<double>(rank.allocated_bytes) * machine.seconds_per_written_byte +
        static_cast<double>(rank.in_place_bytes) * machine.seconds_per_written_byte / 3 +
        static_cast<double>(rank.allocations) * machine.seconds_per_op;
    double critical = 0, data_parallel = 0;
    for (const auto& [group, counters] : rank.collectives) {
      const int64_t n = group_size(group, parallel, world_size, replicas);
      const double rate = group_bytes_per_s(group, machine);
      double seconds = 0;
      for (size_t k = 0; k < counters.calls.size(); ++k) {
        if (counters.calls[k] == 0) continue;
        // Each call's latency, the bytes at the bandwidth.
        const auto kind = static_cast<comm::CollectiveKind>(k);
        const double one = operation_seconds(kind, 0, n, machine, rate);
        seconds +=
            one * static_cast<double>(counters.calls[k]) +
            (operation_seconds(kind, static_cast<double>(counters.bytes[k]), n, machine, rate) -
             one);
      }
      (group.find("dp") != std::string::npos ? data_parallel : critical) += seconds;
    }
    const double exposed =
        critical + std::max(0.0, data_parallel - machine.data_parallel_overlap * compute);
    if (compute + exposed > slowest) {
      slowest = compute + exposed;
      out.compute_ms = 1e3 * compute;
      out.exposed_comm_ms = 1e3 * exposed;
      flops_of_slowest = rank.flops - rank.recompute_flops;  // model FLOPs: MFU's numerator
    }
  }
  out.bubble = step_bubble(pipeline_bubble(parallel), machine);
  out.step_ms = (out.compute_ms + out.exposed_comm_ms) * out.bubble;
  out.tokens_per_s = out.step_ms > 0 ? static_cast<double>(tokens) / (out.step_ms / 1e3) : 0;
  if (machine.peak_flops_per_s > 0 && out.step_ms > 0) {
    out.mfu =
        static_cast<double>(flops_of_slowest) / (out.step_ms / 1e3) / machine.peak_flops_per_s;
  }
  return out;
}

}  // namespace loom::train
