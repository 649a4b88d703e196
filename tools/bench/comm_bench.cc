// comm_bench: time per op and bandwidth of the Gloo backend's collectives, like nccl-tests.
//
//   bazel run -c opt //tools/bench:comm_bench                      # 2 and 4 ranks, 4 KiB..64 MiB
//   bazel run -c opt //tools/bench:comm_bench -- --worlds 4 --collectives all_reduce
//
// Ranks are threads of this process, each with its own ProcessGroupGloo (its own Gloo TCP device
// and connections over loopback, rendezvous through an InMemoryStore), so the numbers include
// the real TCP stack but share the machine's cores among all ranks — on a 2-core machine 4 ranks
// contend for CPU. f32 data, ReduceOp::kSum. Each rank runs ~3 threads (caller, group worker,
// Gloo I/O loop), so on a small machine small-message times are mostly scheduler wake-up
// latency, and other load on the machine shows up directly (`nice -n -10` helps).
//
// Definitions (nccl-tests, PERFORMANCE.md). "size" is:
//   all_reduce      the buffer (in place)
//   all_gather      the gathered output (world x each rank's input); all_gather_into_tensor
//   reduce_scatter  the input (world x each rank's output);         reduce_scatter_tensor
//   all_to_all      each rank's send buffer (world chunks; as much is received)
// time is the average over the timed iterations (each issued and waited on in turn, after
// warm-up), the slowest rank's average; algbw = size / time; busbw = algbw x 2(n-1)/n for
// all_reduce and x (n-1)/n for the others (the bytes a rank's link carries). memcpy is one
// thread's std::memcpy of `size` bytes (size / time) in this run, the ceiling a ring-style
// implementation that copies each byte once would approach.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "tensor/ops.h"

namespace {

using namespace loom;
using comm::ProcessGroup;
using Clock = std::chrono::steady_clock;

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll };

struct CollectiveInfo {
  Collective kind;
  const char* name;
};
constexpr CollectiveInfo kCollectives[] = {{Collective::kAllReduce, "all_reduce"},
                                           {Collective::kAllGather, "all_gather"},
                                           {Collective::kReduceScatter, "reduce_scatter"},
                                           {Collective::kAllToAll, "all_to_all"}};

double bus_factor(Collective kind, int world) {
  const double n = world;
  return kind == Collective::kAllReduce ? 2.0 * (n - 1) / n : (n - 1) / n;
}

// One rank's buffers for one collective at one size (bytes as defined above).
struct Buffers {
  Tensor input;
  Tensor output;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
};

Buffers make_buffers(Collective kind, int64_t bytes, int world, int rank) {
  const int64_t count = bytes / static_cast<int64_t>(sizeof(float));
  const int64_t chunk = count / world;
  Buffers b;
  switch (kind) {
    case Collective::kAllReduce:
      b.input = ops::full({count}, rank + 1.0);
      break;
    case Collective::kAllGather:
      b.input = ops::full({chunk}, rank + 1.0);
      b.output = Tensor::empty({count});
      break;
    case Collective::kReduceScatter:
      b.input = ops::full({count}, rank + 1.0);
      b.output = Tensor::empty({chunk});
      break;
    case Collective::kAllToAll:
      for (int r = 0; r < world; ++r) {
        b.inputs.push_back(ops::full({chunk}, rank + 1.0));
        b.outputs.push_back(Tensor::empty({chunk}));
      }
      break;
  }
  return b;
}

void run_once(ProcessGroup& pg, Collective kind, const Buffers& b) {
  switch (kind) {
    case Collective::kAllReduce:
      pg.all_reduce(b.input)->wait();
      return;
    case Collective::kAllGather:
      pg.all_gather_into_tensor(b.output, b.input)->wait();
      return;
    case Collective::kReduceScatter:
      pg.reduce_scatter_tensor(b.output, b.input)->wait();
      return;
    case Collective::kAllToAll:
      pg.all_to_all(b.outputs, b.inputs)->wait();
      return;
  }
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Settings {
  std::vector<int> worlds{2, 4};
  std::vector<std::string> collectives{"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 64 << 20;
  int step = 4;
  int warmup = 5;
  int min_iters = 3;
  int max_iters = 1000;
  double target_s = 0.25;
  int timeout_s = 120;
  std::vector<std::string> transports{"shm", "tcp"};
};

struct Row {
  std::string collective;
  int64_t bytes;
  int iters;
  double seconds;  // per op, slowest rank
};

// The timed loop of one rank: warm-up, rank 0 picks the iteration count from its warm-up time
// (broadcast, so every rank issues the same collectives), timed iterations, max over ranks.
Row measure(ProcessGroup& pg, Collective kind, const char* name, int64_t bytes, const Settings& s) {
  const Buffers b = make_buffers(kind, bytes, pg.size(), pg.rank());
  pg.barrier()->wait();
  const auto warm_start = Clock::now();
  for (int i = 0; i < s.warmup; ++i) run_once(pg, kind, b);
  const double warm_per_op = seconds_since(warm_start) / std::max(s.warmup, 1);
  Tensor iters_t = ops::full(
      {1}, std::clamp(static_cast<int>(std::ceil(s.target_s / std::max(warm_per_op, 1e-7))),
                      s.min_iters, s.max_iters));
  pg.broadcast(iters_t, 0)->wait();
  const int iters = static_cast<int>(ops::to_vector(iters_t)[0]);
  pg.barrier()->wait();
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) run_once(pg, kind, b);
  const double per_op = seconds_since(start) / iters;
  Tensor ns = ops::full({1}, std::round(per_op * 1e9), kInt64);
  pg.all_reduce(ns, comm::ReduceOp::kMax)->wait();
  return Row{name, bytes, iters, ops::to_vector(ns)[0] * 1e-9};
}

volatile char g_sink;

// Bytes per second of one thread's memcpy of `bytes` (size / time), best of a few runs.
double memcpy_bandwidth(int64_t bytes, double target_s) {
  std::vector<char> src(static_cast<size_t>(bytes), 1);
  std::vector<char> dst(static_cast<size_t>(bytes), 0);
  std::memcpy(dst.data(), src.data(), src.size());  // fault the pages in
  double best = 0;
  for (int repeat = 0; repeat < 3; ++repeat) {
    int64_t copies = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      std::memcpy(dst.data(), src.data(), src.size());
      ++copies;
      elapsed = seconds_since(start);
    } while (elapsed < target_s / 3);
    best = std::max(best, static_cast<double>(bytes) * copies / elapsed);
  }
  g_sink = dst[static_cast<size_t>(bytes) / 2];  // the copies are observable
  return best;
}

std::string human_bytes(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Gloo collective bandwidth (nccl-tests style): ranks are threads, over shared memory and "
      "loopback TCP"};
  Settings s;
  app.add_option("--worlds", s.worlds, "world sizes (ranks = threads of this process)")
      ->check(CLI::Range(2, 64));
  app.add_option("--collectives", s.collectives, "all_reduce all_gather reduce_scatter all_to_all")
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}));
  app.add_option("--min-bytes", s.min_bytes, "smallest size (bytes)")
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 32));
  app.add_option("--max-bytes", s.max_bytes, "largest size (bytes)")
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 32));
  app.add_option("--step", s.step, "size multiplier between rows")->check(CLI::Range(2, 1024));
  app.add_option("--warmup", s.warmup, "warm-up iterations per row")->check(CLI::Range(0, 1000));
  app.add_option("--target-s", s.target_s,
                 "timed seconds per row (iterations = target / warm-up time)")
      ->check(CLI::Range(0.001, 60.0));
  app.add_option("--min-iters", s.min_iters, "fewest timed iterations per row")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--max-iters", s.max_iters, "most timed iterations per row")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--timeout-s", s.timeout_s, "the groups' operation timeout")
      ->check(CLI::Range(1, 3600));
  app.add_option(
         "--transports", s.transports,
         "shm (shared memory; all_to_all still TCP) and/or tcp (GlooOptions::shared_memory)")
      ->check(CLI::IsMember({"shm", "tcp"}));
  CLI11_PARSE(app, argc, argv);
  if (s.max_iters < s.min_iters) s.max_iters = s.min_iters;

  std::vector<int64_t> sizes;
  for (int64_t bytes = s.min_bytes; bytes <= s.max_bytes; bytes *= s.step) sizes.push_back(bytes);
  std::vector<CollectiveInfo> chosen;
  for (const auto& info : kCollectives) {
    if (std::find(s.collectives.begin(), s.collectives.end(), info.name) != s.collectives.end())
      chosen.push_back(info);
  }
  const auto run_start = Clock::now();
  fmt::print(
      "comm_bench: ProcessGroupGloo over shared memory and/or loopback TCP; ranks are threads of "
      "one process "
      "(InMemoryStore rendezvous); f32, sum; {} hardware threads\n",
      std::thread::hardware_concurrency());
  fmt::print(
      "time: slowest rank's average over the timed iterations after {} warm-up; GB/s = 1e9 B/s; "
      "busbw: all_reduce 2(n-1)/n, others (n-1)/n\n",
      s.warmup);

  std::map<int64_t, double> memcpy_bw;
  for (int64_t bytes : sizes) memcpy_bw[bytes] = memcpy_bandwidth(bytes, 0.1);

  for (const std::string& transport : s.transports) {
    for (int world : s.worlds) {
      for (int64_t bytes : sizes) {
        LOOM_CHECK(bytes % (static_cast<int64_t>(sizeof(float)) * world) == 0,
                   "comm_bench: size {} is not a multiple of 4 bytes x world {}", bytes, world);
      }
      fmt::print("\n# world {} ({} ranks), {}\n", world, world,
                 transport == "shm" ? "shared memory" : "TCP");
      fmt::print("# {:<15} {:>8} {:>6} {:>11} {:>11} {:>11} {:>12}\n", "collective", "size",
                 "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "memcpy(GB/s)");
      std::fflush(stdout);
      auto store = std::make_shared<comm::InMemoryStore>();
      std::mutex print_mutex;
      std::vector<std::string> errors;
      std::vector<std::thread> ranks;
      for (int rank = 0; rank < world; ++rank) {
        ranks.emplace_back([&, rank] {
          try {
            comm::GlooOptions gloo = comm::GlooOptions::loopback();
            gloo.shared_memory = transport == "shm";
            auto pg = comm::ProcessGroupGloo::create(
                store, rank, world, {.name = "bench", .timeout = std::chrono::seconds(s.timeout_s)},
                gloo);
            LOOM_CHECK(pg->uses_shared_memory() == gloo.shared_memory,
                       "comm_bench: asked for {} but the group uses the other transport",
                       transport);
            for (const auto& info : chosen) {
              for (int64_t bytes : sizes) {
                const Row row = measure(*pg, info.kind, info.name, bytes, s);
                if (rank != 0) continue;
                const double algbw = static_cast<double>(bytes) / row.seconds / 1e9;
                fmt::print("  {:<15} {:>8} {:>6} {:>11.1f} {:>11.3f} {:>11.3f} {:>12.2f}\n",
                           row.collective, human_bytes(bytes), row.iters, row.seconds * 1e6, algbw,
                           algbw * bus_factor(info.kind, world), memcpy_bw[bytes] / 1e9);
                std::fflush(stdout);
              }
            }
          } catch (const std::exception& e) {
            std::lock_guard<std::mutex> lock(print_mutex);
            errors.push_back(fmt::format("rank {}: {}", rank, e.what()));
          }
        });
      }
      for (auto& t : ranks) t.join();
      if (!errors.empty()) {
        for (const auto& e : errors) fmt::print(stderr, "comm_bench: {}\n", e);
        return 1;
      }
    }
  }
  fmt::print("\ncomm_bench: {:.1f} s in all\n", seconds_since(run_start));
  return 0;
}
