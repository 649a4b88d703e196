// How long the host takes to issue one training step, with no kernel run: the job's step on the
// meta device (train/step_trace.h: the job's own model, mixed precision, Trainer, clipping and
// AdamW over fake process groups), timed. A GPU step can be no faster than the host issues it: at
// GPT-2 small's 16 x 1024 tokens a step of an H100 at 45 % MFU is about 30 ms, so Loom's
// dispatch, autograd and allocator bookkeeping must stay well under that (issue 31).
//
// What the figure includes beyond a real GPU step's host work: the meta device's bookkeeping
// (memory tracker, FLOP counter, CommDebugMode). What it leaves out: the CUDA driver's own cost per
// launch (a few µs each; tools/cuda_emulator/launch_counts.sh counts the launches).
//
// It also prints the step's memory traffic (bytes its ops wrote into fresh tensors, and moved in
// place) and the bytes by op above 0.5 % (TracedRank::bytes_by_op): on a GPU the memory-bound
// ops cost about their bytes over the memory bandwidth, so this is where fusions pay.
//
//   bazel run //tools/bench:host_step_bench -- --model small --batch-size 16 --seq-len 1024
//       --mixed-precision bf16 --dp 1 --tp 1 [--repeats 5]
// Any job flag works (`./loom train --help`), the layout's too (the job's default is several
// ranks: give --dp 1 --tp 1 for one); the layout's first traced rank is timed.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <vector>

#include "tensor/host_memory.h"
#include "train/job_checks.h"
#include "train/job_command_line.h"
#include "train/job_model.h"
#include "train/parallel_model.h"
#include "train/step_trace.h"

int main(int argc, char** argv) {
  using namespace loom;
  keep_freed_host_memory();
  try {
    // --repeats is this program's own; every other flag (--help too) is the job's.
    int repeats = 5;
    CLI::App own{"host_step_bench"};
    own.set_help_flag();
    own.allow_extras();
    own.add_option("--repeats", repeats, "timed runs of the step")->check(CLI::Range(1, 10000));
    own.parse(argc, argv);
    std::vector<std::string> rest = own.remaining();
    std::vector<char*> job_argv{argv[0]};
    for (std::string& arg : rest) job_argv.push_back(arg.data());
    const train::CommandLine command =
        train::parse_command_line(static_cast<int>(job_argv.size()), job_argv.data(),
                                  "host_step_bench: the host's time to issue one step");
    if (command.help) return 0;
    const train::JobConfig& job = command.job;
    const train::JobModel model = train::resolve_job_model(job);
    const train::ParallelConfig parallel = train::parallel_config(job);
    const train::ParallelDims& dims = parallel.dims;
    const models::ModelArgs& args = *model.args;
    const train::ModelBuilder build = [&](std::shared_ptr<const DeviceMesh> mesh) {
      return train::build_parallel_model(args, /*seed=*/0, std::move(mesh), parallel);
    };
    const train::StepTraceOptions options{.local_batch = job.batch_size / dims.dp(),
                                          .seq_len = job.seq_len,
                                          .ranks = train::ranks_to_trace(dims, 1),
                                          .target = Device::cuda()};
    fmt::print("{}; layout {}; {} x {} tokens per step; mixed precision {}\n", args.summary(),
               dims.str(), job.batch_size, job.seq_len,
               job.mixed_precision.empty() ? "none" : job.mixed_precision);
    std::vector<double> ms;
    int64_t allocations = 0, allocated_bytes = 0, in_place_bytes = 0, peak = 0;
    for (int r = 0; r < repeats; ++r) {
      const std::vector<train::TracedRank> traced =
          train::trace_training_step(dims, build, options);
      ms.push_back(traced.front().step_ms);
      allocations = traced.front().allocations;
      allocated_bytes = traced.front().allocated_bytes;
      in_place_bytes = traced.front().in_place_bytes;
      peak = traced.front().peak_bytes;
    }
    std::sort(ms.begin(), ms.end());
    fmt::print(
        "host time to issue one step (rank {}, meta device, {} repeats): median {:.2f} ms, range "
        "{:.2f} - {:.2f} ms; {} tensor allocations per step ({:.1f} µs per allocation)\n",
        options.ranks.front(), repeats, ms[ms.size() / 2], ms.front(), ms.back(), allocations,
        1e3 * ms[ms.size() / 2] / std::max<int64_t>(1, allocations));
    fmt::print(
        "the step's ops wrote {:.2f} GB into fresh tensors and moved {:.2f} GB in place; peak "
        "memory {:.2f} GiB\n",
        allocated_bytes / 1e9, in_place_bytes / 1e9, peak / double(1 << 30));
    // Once more, the bytes by op: where the memory-bound part of the step goes.
    train::StepTraceOptions by_op = options;
    by_op.bytes_by_op = true;
    const train::TracedRank traced = train::trace_training_step(dims, build, by_op).front();
    std::vector<std::pair<int64_t, std::string>> ops;
    for (const auto& [op, bytes] : traced.bytes_by_op) ops.emplace_back(bytes, op);
    std::sort(ops.rbegin(), ops.rend());
    fmt::print("\n| op | GB allocated | share |\n|---|---:|---:|\n");
    for (const auto& [bytes, op] : ops) {
      if (bytes * 200 < traced.allocated_bytes) break;  // below 0.5 %
      fmt::print("| {} | {:.2f} | {:.1f} % |\n", op, bytes / 1e9,
                 100.0 * bytes / std::max<int64_t>(1, traced.allocated_bytes));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "host_step_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
