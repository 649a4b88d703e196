// pipeline_bench: the pipeline bubble and activation memory of GPipe, 1F1B, ZB-H1, interleaved
// 1F1B, and the V schedules ZBV and DualPipeV (two stages per rank).
//
//   bazel run -c opt //tools/bench:pipeline_bench
//   bazel run -c opt //tools/bench:pipeline_bench -- --ranks 4 --microbatches 8 --stages-per-rank 2
//   bazel run -c opt //tools/bench:pipeline_bench -- --compute mlp --width 512
//   bazel run -c opt //tools/bench:pipeline_bench -- --ranks 2 --microbatches 4 --timeline
//
// The p ranks are threads of this process, each with its own ProcessGroupGloo over loopback TCP
// (InMemoryStore rendezvous), each running PipelineExecutor::step on its stages. Per schedule:
// one warm-up step, then --steps timed steps; from each rank's StepStats:
//   idle      = 1 - (time in forwards and backwards) / (step time): the share of the step a
//               rank is not computing, averaged over ranks and steps; "in recv" is the part of
//               it blocked in receives (sends are asynchronous). Beside it: "sim", the
//               schedule's own idle share from a timeline of its actions with these compute
//               times and free messages, and the textbook figure for uniform stages,
//               (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m+p-1) for interleaved, and for the
//               split ones from their bubble per rank (chunk times f, b = i + w, w of a stage):
//               ZB-H1 (p-1)(f+i-w) (Qi et al.); ZBV (p-1) f, the last rank's wait for its first
//               input, which a V cannot fill (the rest it fills when f = i = w); DualPipeV
//               (p-1)(f&b + b - 3w) (DeepSeek's DualPipe table with PP = 2p stages, f&b = f + b
//               run in order); then Megatron's bubble/ideal ratio beside idle / (1 - idle).
//   in flight = the most microbatches whose forward ran and backward had not on a rank (the
//               activations it holds), measured and as the schedule predicts
//               (peak_microbatches_in_flight), and the boundary tensors' bytes at that peak.
// --compute sleep (default) makes each stage's forward and backward sleep (forward_ms / v and
// backward_ms / v per stage, so every rank does the same work under every schedule): it models
// one core (or GPU) per rank, which this machine may not have, and isolates the schedule's own
// bubble. --compute mlp runs real Linear+GELU layers instead; with more ranks than cores the
// ranks then share the CPUs and "idle" also absorbs time-slicing.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/in_memory_store.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/split.h"
#include "tensor/ops.h"

namespace {

using namespace loom;
using namespace loom::pipeline;

struct Settings {
  int ranks = 4;
  int microbatches = 8;
  int stages_per_rank = 2;
  std::string compute = "sleep";
  double forward_ms = 20;   // per rank and microbatch (all its layers)
  double backward_ms = 40;  // of which weight_ms is the weights' part (W in zero-bubble schedules)
  double weight_ms = 20;
  int64_t width = 64;
  int64_t rows_per_microbatch = 8;
  int layers_per_rank = 4;  // mlp mode
  int steps = 5;
  int timeout_s = 120;
};

void sleep_ms(double ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

// Identity whose forward and backward take a fixed time.
class Sleep : public autograd::Function {
 public:
  Sleep(double forward_ms, double backward_ms)
      : forward_ms_(forward_ms), backward_ms_(backward_ms) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    sleep_ms(forward_ms_);
    return {ops::clone(in[0])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad) override {
    sleep_ms(backward_ms_);
    return {grad[0]};
  }

 private:
  double forward_ms_, backward_ms_;
};

// A stage of the sleep model: one parameter (so there is a gradient to accumulate) and two
// sleeps: one on the input's path (forward, and the backward's input part), one on the
// parameter's alone (the backward's weight part: W under a zero-bubble schedule, part of B
// otherwise).
class SleepStage : public nn::Module {
 public:
  SleepStage(int64_t width, double forward_ms, double input_ms, double weight_ms)
      : Module("SleepStage"),
        scale_(register_parameter("scale", ops::ones({width}))),
        forward_ms_(forward_ms),
        input_ms_(input_ms),
        weight_ms_(weight_ms) {}
  Tensor forward(const Tensor& x) override {
    const Tensor weight =
        autograd::Function::apply(std::make_shared<Sleep>(0.0, weight_ms_), {scale_})[0];
    return autograd::Function::apply(std::make_shared<Sleep>(forward_ms_, input_ms_),
                                     {mul(x, weight)})[0];
  }

 private:
  const Tensor& scale_;
  double forward_ms_, input_ms_, weight_ms_;
};

class Block : public nn::Module {
 public:
  Block(int64_t width, int64_t layer) : Module("Block") {
    fc_ = register_module(
        "fc", std::make_shared<nn::Linear>(
                  width, width, nn::LinearOptions{.seed = static_cast<uint64_t>(layer)}));
    act_ = register_module("act", std::make_shared<nn::GELU>());
  }
  Tensor forward(const Tensor& x) override { return (*act_)((*fc_)(x)); }

 private:
  std::shared_ptr<nn::Linear> fc_;
  std::shared_ptr<nn::GELU> act_;
};

std::shared_ptr<nn::Module> make_stage_module(const Settings& s, const Schedule& schedule,
                                              int stage) {
  const int v = schedule.num_stages / schedule.num_ranks;
  if (s.compute == "sleep")
    return std::make_shared<SleepStage>(s.width, s.forward_ms / v,
                                        (s.backward_ms - s.weight_ms) / v, s.weight_ms / v);
  const auto ranges =
      split_layers(static_cast<int64_t>(s.layers_per_rank) * s.ranks, schedule.num_stages);
  return LayerSequence::build(
      ranges[stage], [&](int64_t layer) { return std::make_shared<Block>(s.width, layer); });
}

// The schedule's own idle share: every rank runs its list with forwards taking tf, backwards
// tb and messages free, starting a compute once its input exists; mean over ranks of
// (step - busy) / step, the step ending when the last rank finishes.
struct RankResult {
  double step_s = 0, compute_s = 0, recv_wait_s = 0;
  int peak_in_flight = 0;
  int64_t peak_bytes = 0;
};

// Runs `s.steps` timed steps of `schedule` on every rank; returns each rank's averages.
std::vector<RankResult> run(const Settings& s, const Schedule& schedule) {
  const int p = s.ranks;
  const Tensor inputs =
      ops::uniform({s.rows_per_microbatch * s.microbatches, s.width}, 1, -1.0, 1.0);
  const Tensor targets =
      ops::uniform({s.rows_per_microbatch * s.microbatches, s.width}, 2, -1.0, 1.0);
  auto store = std::make_shared<comm::InMemoryStore>();
  std::vector<RankResult> results(p);
  std::mutex mutex;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < p; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto pg = comm::ProcessGroupGloo::create(
            store, rank, p, {.name = "pp", .timeout = std::chrono::seconds(s.timeout_s)},
            comm::GlooOptions::loopback());
        std::vector<std::shared_ptr<PipelineStage>> stages;
        for (int stage : schedule.stages_of_rank(rank))
          stages.push_back(std::make_shared<PipelineStage>(
              make_stage_module(s, schedule, stage), stage, schedule.num_stages, pg,
              StageOptions{.placement = schedule.placement}));
        PipelineExecutor executor(schedule, stages, [](const Tensor& out, const Tensor& target) {
          const Tensor diff = sub(out, target);
          return mean(mul(diff, diff));
        });
        RankResult& result = results[rank];
        for (int step = 0; step <= s.steps; ++step) {
          for (const auto& stage : stages) stage->module().zero_grad();
          pg->barrier()->wait();
          executor.step(inputs, targets);
          if (step == 0) continue;  // warm-up: connections, first allocations
          const StepStats& stats = executor.last_stats();
          result.step_s += stats.step_seconds / s.steps;
          result.compute_s += stats.compute_seconds / s.steps;
          result.recv_wait_s += stats.recv_wait_seconds / s.steps;
          result.peak_in_flight =
              std::max(result.peak_in_flight, stats.peak_microbatches_in_flight);
          result.peak_bytes = std::max(result.peak_bytes, stats.peak_activation_bytes);
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back(fmt::format("rank {}: {}", rank, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) fmt::print(stderr, "pipeline_bench: {}\n", e);
  if (!errors.empty()) throw std::runtime_error("a rank failed");
  return results;
}

std::string per_rank(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += fmt::format("{}{}", out.empty() ? "" : " ", v);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app{"pipeline_bench: bubble fraction and activation memory of pipeline schedules"};
  app.add_option("--ranks", s.ranks, "pipeline ranks p")->check(CLI::Range(2, 16));
  app.add_option("--microbatches", s.microbatches, "microbatches m")->check(CLI::Range(1, 256));
  app.add_option("--stages-per-rank", s.stages_per_rank, "interleaved: stages per rank v")
      ->check(CLI::Range(2, 8));
  app.add_option("--compute", s.compute, "sleep (fixed times) or mlp (Linear+GELU layers)")
      ->check(CLI::IsMember({"sleep", "mlp"}));
  app.add_option("--forward-ms", s.forward_ms, "sleep: forward time per rank and microbatch");
  app.add_option("--backward-ms", s.backward_ms, "sleep: backward time per rank and microbatch");
  app.add_option("--weight-ms", s.weight_ms,
                 "sleep: the backward's weight part (W of zero-bubble schedules), within it");
  app.add_option("--width", s.width, "activation width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--rows", s.rows_per_microbatch, "rows per microbatch")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--layers-per-rank", s.layers_per_rank, "mlp: layers per rank")
      ->check(CLI::Range(1, 256));
  app.add_option("--steps", s.steps, "timed steps per schedule")->check(CLI::Range(1, 1000));
  bool timelines = false;
  app.add_flag("--timeline", timelines,
               "print each schedule's per-rank timeline (F = I = W = 1, B = 2) before its run");
  CLI11_PARSE(app, argc, argv);
  s.layers_per_rank = std::max(s.layers_per_rank, s.stages_per_rank);

  const int p = s.ranks, m = s.microbatches, v = s.stages_per_rank;
  fmt::print(
      "pipeline_bench: p = {} ranks (threads, ProcessGroupGloo over loopback), m = {} "
      "microbatches, "
      "interleaved v = {}; compute {}",
      p, m, v, s.compute);
  if (s.compute == "sleep")
    fmt::print(" (forward {} ms + backward {} ms per rank and microbatch)", s.forward_ms,
               s.backward_ms);
  fmt::print(
      "; {} rows x {} per microbatch; mean of {} steps after 1 warm-up; {} hardware threads\n\n",
      s.rows_per_microbatch, s.width, s.steps, std::thread::hardware_concurrency());
  fmt::print("{:<20} {:>8} {:>7} {:>8} {:>7} {:>8} {:>8} {:>8} {:>10} {:>10} {:>9}\n", "schedule",
             "step ms", "idle", "in recv", "sim", "formula", "b/ideal", "formula", "in flight",
             "(sched)", "peak KiB");
  struct Entry {
    Schedule schedule;
    double idle_formula, ratio_formula;
  };
  const double pm1 = p - 1;
  std::vector<Entry> entries;
  entries.push_back({gpipe_schedule(p, m), pm1 / (m + pm1), pm1 / m});
  entries.push_back({one_f_one_b_schedule(p, m), pm1 / (m + pm1), pm1 / m});
  // ZB-H1's (Qi et al.): bubble (p-1)(F+B-W) against 1F1B's (p-1)(F+B+W) (B the input part).
  {
    const double f = s.forward_ms, b = s.backward_ms - s.weight_ms, w = s.weight_ms;
    const double bubble = pm1 * (f + b - w), work = m * (f + b + w);
    entries.push_back({zb_h1_schedule(p, m), bubble / (work + bubble), bubble / work});
  }
  if (m % p == 0) {
    entries.push_back(
        {interleaved_one_f_one_b_schedule(p, m, v), pm1 / (v * m + pm1), pm1 / (v * m)});
  } else {
    fmt::print("(interleaved skipped: m = {} is not a multiple of p = {})\n", m, p);
  }
  // The V schedules: 2p stages, each half a rank's layers (chunk times half the rank's).
  {
    const double f = s.forward_ms / 2, b = s.backward_ms / 2, w = s.weight_ms / 2;
    const double work = 2 * m * (f + b);
    const double zbv_bubble = pm1 * f;
    entries.push_back({zbv_schedule(p, m), zbv_bubble / (work + zbv_bubble), zbv_bubble / work});
    if (m >= 2 * p) {
      const double bubble = pm1 * ((f + b) + b - 3 * w);
      entries.push_back({dualpipev_schedule(p, m), bubble / (work + bubble), bubble / work});
    } else {
      fmt::print("(dualpipev skipped: m = {} is under 2p = {})\n", m, 2 * p);
    }
  }
  for (const Entry& entry : entries) {
    if (timelines) fmt::print("{}:\n{}", entry.schedule.name, timeline_str(entry.schedule));
    const std::vector<RankResult> results = run(s, entry.schedule);
    double step = 0, idle = 0, in_recv = 0;
    int in_flight = 0;
    int64_t bytes = 0;
    std::vector<int> predicted;
    for (int rank = 0; rank < p; ++rank) {
      const RankResult& r = results[rank];
      step = std::max(step, r.step_s);
      idle += (1 - r.compute_s / r.step_s) / p;
      in_recv += r.recv_wait_s / r.step_s / p;
      in_flight = std::max(in_flight, r.peak_in_flight);
      bytes = std::max(bytes, r.peak_bytes);
      predicted.push_back(peak_microbatches_in_flight(entry.schedule, rank));
    }
    const int stages_per_rank = entry.schedule.num_stages / p;
    const std::string sim =
        s.compute == "sleep"
            ? fmt::format("{:.1f}%",
                          100 * simulated_idle_share(entry.schedule, s.forward_ms / stages_per_rank,
                                                     s.backward_ms / stages_per_rank,
                                                     s.weight_ms / stages_per_rank))
            : "-";
    const std::string name =
        fmt::format("{}{}", entry.schedule.name,
                    stages_per_rank > 1 ? fmt::format(" v={}", stages_per_rank) : "");
    fmt::print(
        "{:<20} {:>8.1f} {:>6.1f}% {:>7.1f}% {:>7} {:>7.1f}% {:>8.3f} {:>8.3f} {:>10} {:>10} "
        "{:>9.1f}\n",
        name, step * 1e3, idle * 100, in_recv * 100, sim, entry.idle_formula * 100,
        idle / (1 - idle), entry.ratio_formula, in_flight, per_rank(predicted), bytes / 1024.0);
    std::fflush(stdout);
  }
  fmt::print(
      "\nidle: mean over ranks of 1 - (time in forward/backward) / (step time); in recv: the part "
      "of it blocked in\n"
      "receives; sim: the schedule's own idle share with these compute times and free messages; "
      "formula:\n"
      "(p-1)/(m+p-1), interleaved (p-1)/(v m+p-1), the split schedules' from their bubbles (see "
      "the header).\n"
      "b/ideal: idle / (1 - idle) beside Megatron's (p-1)/m, interleaved (p-1)/(v m), the others' "
      "bubble / work. in flight: most microbatches whose activations one rank held (max "
      "over ranks;\n"
      "(sched): per rank, as the schedule predicts). peak KiB: those microbatches' stage-boundary "
      "tensors.\n");
  return 0;
}
