// `loom plan` checked against the runs it predicts (issue 19): for a grid of layouts of the tiny
// and small GPTs, the step traced on the meta device (train/step_trace.h) beside the same step run
// on Gloo thread ranks of this process, rank by rank:
//   - operations: whether every group's collectives and point-to-point operations (calls and
//     bytes, kind by kind) are the same;
//   - memory: storage held between steps and the peak during the step, predicted vs the
//     allocator's counts (tensor/memory_stats.h), and the larger of the two relative errors;
//   - time: the predicted step (train/step_time_model.h, this machine's `loom plan --calibrate`
//     figures, ranks sharing its cores) vs the slowest rank's measured step.
// Prints one markdown row per layout (the worst rank's figures); docs/loom_plan.md holds a run.
//
//   bazel run //tools/bench:plan_grid_bench [-- --only small --seq-len 128]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/gpt/family.h"
#include "tensor/host_memory.h"
#include "train/step_time_model.h"
#include "train/step_trace.h"

namespace loom {
namespace {

struct Case {
  std::string model;  // tiny | small
  train::ParallelConfig parallel;
};

models::GPTConfig model_of(const std::string& name) {
  models::GPTConfig config = models::GPTConfig::preset(name);
  if (name == "small") config.vocab_size = 50257;
  return config;
}

std::vector<Case> grid() {
  using train::ParallelConfig;
  std::vector<Case> cases;
  for (const std::string model : {"tiny", "small"}) {
    cases.push_back({model, ParallelConfig{.dims = {}}});
    cases.push_back({model, ParallelConfig{.dims = {.tp = 2}}});
    cases.push_back({model, ParallelConfig{.dims = {.dp_replicate = 2}}});
    cases.push_back({model, ParallelConfig{.dims = {.dp_shard = 2}}});
    cases.push_back({model, ParallelConfig{.dims = {.pp = 2}, .pipeline = {.microbatches = 4}}});
    cases.push_back({model, ParallelConfig{.dims = {.dp_replicate = 2, .tp = 2}}});
    cases.push_back({model, ParallelConfig{.dims = {.pp = 2, .tp = 2},
                                           .pipeline = {.schedule = "gpipe", .microbatches = 2}}});
    cases.push_back({model, ParallelConfig{.dims = {.dp_shard = 2, .tp = 2},
                                           .mixed_precision = nn::MixedPrecisionPolicy{}}});
  }
  return cases;
}

double relative_error(int64_t predicted, int64_t measured) {
  return measured == 0 ? 0 : std::abs(static_cast<double>(predicted - measured)) / measured;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  using namespace loom;
  keep_freed_host_memory();
  CLI::App app{"plan_grid_bench: loom plan's predictions against the runs they predict"};
  std::string only;
  int64_t batch = 8, seq_len = 64;
  app.add_option("--only", only, "run the tiny or the small model's layouts only");
  app.add_option("--batch", batch, "global batch (sequences)");
  app.add_option("--seq-len", seq_len, "tokens per sequence");
  CLI11_PARSE(app, argc, argv);
  const auto calibration = train::load_calibration();
  if (!calibration) {
    fmt::print("no calibration at {}: predicted times are left out (run ./loom plan --calibrate)\n",
               train::calibration_path());
  }
  fmt::print(
      "| model | layout | ranks | operations per rank | same operations | held MiB pred / meas | "
      "peak MiB pred / meas | worst memory error | ms pred / meas |\n"
      "|---|---|---:|---:|---|---:|---:|---:|---:|\n");
  for (const auto& [model, parallel] : grid()) {
    if (!only.empty() && model != only) continue;
    const models::GPTConfig config = model_of(model);
    const train::ParallelDims& dims = parallel.dims;
    const train::ModelBuilder build = [&](std::shared_ptr<const DeviceMesh> mesh) {
      return train::build_parallel_model(*models::gpt_args(config), 1, std::move(mesh), parallel);
    };
    const train::StepTraceOptions options{.local_batch = batch / dims.dp(),
                                          .seq_len = seq_len,
                                          .ranks = train::ranks_to_trace(dims, 64),
                                          .target = Device::cpu()};
    try {
      const auto predicted = train::trace_training_step(dims, build, options);
      const auto measured = train::measure_training_step_on_gloo_threads(dims, build, options);
      bool same = true;
      double worst = 0, measured_ms = 0;
      int64_t operations = 0;
      size_t worst_rank = 0;
      for (size_t r = 0; r < measured.size(); ++r) {
        same = same && train::same_collectives(predicted[r], measured[r]);
        const double error =
            std::max(relative_error(predicted[r].held_bytes, measured[r].held_bytes),
                     relative_error(predicted[r].peak_bytes, measured[r].peak_bytes));
        if (error >= worst) worst = error, worst_rank = r;
        measured_ms = std::max(measured_ms, measured[r].step_ms);
        int64_t calls = 0;
        for (const auto& [group, counters] : measured[r].collectives) {
          calls += counters.total_calls();
        }
        operations = std::max(operations, calls);
      }
      std::string predicted_ms = "-";
      if (calibration) {
        const auto machine = train::MachineModel::for_cpu_ranks(*calibration, dims.world_size());
        predicted_ms =
            fmt::format("{:.1f}", train::estimate_step_time(predicted, parallel, batch * seq_len,
                                                            dims.world_size(), machine)
                                      .step_ms);
      }
      const auto& p = predicted[worst_rank];
      const auto& m = measured[worst_rank];
      fmt::print(
          "| {} | {}{} | {} | {} | {} | {:.2f} / {:.2f} | {:.2f} / {:.2f} | {:.1f} % | {} / "
          "{:.1f} |\n",
          model, dims.str(), parallel.mixed_precision ? " bf16" : "", dims.world_size(), operations,
          same ? "yes" : "NO", p.held_bytes / 1048576.0, m.held_bytes / 1048576.0,
          p.peak_bytes / 1048576.0, m.peak_bytes / 1048576.0, 100 * worst, predicted_ms,
          measured_ms);
    } catch (const Error& e) {
      fmt::print("| {} | {} | {} | failed: {} |\n", model, dims.str(), dims.world_size(), e.what());
    }
    std::fflush(stdout);
  }
  return 0;
}
