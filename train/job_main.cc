#include "train/job_main.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <optional>
#include <string_view>

#include "base/bazel_run.h"
#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/host_memory.h"
#include "train/job_checks.h"
#include "train/job_command_line.h"
#include "train/job_paths.h"
#include "train/job_runner.h"
#include "train/launch.h"
#include "train/layout_search.h"
#include "train/plan_command.h"

namespace loom::train {

namespace {

// Everything before anything starts: the command line, the job's checks (train/job_checks.h), the
// device, the plan's machine flags; then, for a job not launched, its ranks under loomrun (this
// process becomes them, or the world of one). Throws on bad input, naming it. A rank returns its
// checked job in `checked`.
CommandLine start(int argc, char** argv, std::optional<CheckedJob>& checked) {
  CommandLine parsed = parse_command_line(
      argc, argv,
      "Train a model of any registered family with data, tensor and pipeline parallelism, or "
      "plan the job with --plan (./loom train, ./loom plan).");
  if (parsed.help) return parsed;
  // --search ranks layouts for `loom plan`; a run or a calibration would ignore it silently.
  LOOM_CHECK(!parsed.job.search || (parsed.plan && !parsed.calibrate),
             "--search: it searches the layouts of `loom plan` (--plan --search){}",
             parsed.calibrate ? "; --calibrate measures this machine and exits: run it first, then "
                                "the search"
                              : "; add --plan, or drop --search to train");
  if (parsed.calibrate) return parsed;
  if (parsed.plan) {
    // A search replaces the command line's layout: only its rank count and the rest are checked.
    const bool search = parsed.job.search;
    const CheckedJob checked = check_job(search ? without_layout(parsed.job) : parsed.job);
    std::string missing;
    plan_machine(parsed.job,
                 search ? search_world_size(parsed.job) : checked.parallel.dims.world_size(),
                 parsed.job.device == "cuda", &missing);
    return parsed;
  }
  if (launched_as_rank()) {
    // Each rank checks the job against its launcher's world before it joins the others, so that
    // bad input exits 2 here, under any launcher (loomrun -- prog, torchrun), not 1 from within
    // the job; the runner takes these checks (its warnings print once the ranks start).
    JobConfig job = parsed.job;
    resolve_parallel_degrees(job, launched_world_size());
    CheckedJob rank_checked = check_job(job);
    check_run_environment();
    rank_checked.parallel.validate(launched_world_size(), job.batch_size, job.seq_len);
    checked = std::move(rank_checked);
    return parsed;
  }
  check_job(parsed.job);  // its warnings print once the ranks start
  check_run_environment();
  // A plan may be for GPUs this machine lacks; a run is not.
  LOOM_CHECK(parsed.job.device != "cuda" || cuda::available(), "--device cuda: {}",
             cuda::unavailable_reason());
  // A folder another job holds is an error before any rank starts; the job's rank 0 takes the
  // lock for good (JobRunner), so this one lets it go at once.
  lock_checkpoint_dir(parsed.job, /*create=*/false);
  const ParallelDims dims = parallel_config(parsed.job).dims;
  // Restarts need a launcher to restart the job, even for one rank.
  if (dims.world_size() > 1 || parsed.job.max_restarts > 0) {
    relaunch(parsed.launcher, dims.world_size(), dims.str(), argc, argv, parsed.job.max_restarts);
  }
  become_world_of_one();
  return parsed;
}

}  // namespace

int job_main(int argc, char** argv, const std::string& program) {
  keep_freed_host_memory();  // tensor/host_memory.h: why
  // Errors of `loom plan` say so (the flags are parsed below, perhaps failing).
  bool planning = false;
  for (int i = 1; i < argc; ++i) planning = planning || std::string_view(argv[i]) == "--plan";
  const std::string who = planning ? fmt::format("{} --plan", program) : program;
  CommandLine parsed;
  std::optional<CheckedJob> checked;
  try {
    enter_bazel_working_directory();  // `bazel run //examples:loom_train -- --data x.txt`
    parsed = start(argc, argv, checked);
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "{}: {}\n", who, error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    fmt::print(stderr, "{}: {}\n", who, error.what());
    return kExitBadInput;
  } catch (...) {
    fmt::print(stderr, "{}: unexpected error of an unknown type\n", who);
    return kExitBadInput;
  }
  if (parsed.help) return 0;
  try {
    if (parsed.calibrate) {
      fmt::print("{}\n", calibrate_and_store());
      return 0;
    }
    if (parsed.plan) {
      const PlanReport report = plan_report(parsed.job);
      fmt::print("{}", report.text);
      return report.exit_code;
    }
    JobRunner runner(parsed.job, init_job_process_group(parsed.job), program, std::move(checked));
    runner.run();
    return 0;
  } catch (const std::exception& error) {
    // The messages name the flag, file or library function that failed themselves.
    fmt::print(stderr, "{}: {}\n", who, error.what());
    return comm::exit_status_for(error);  // 3 when another rank's failure ended this one
  } catch (...) {
    fmt::print(stderr, "{}: unexpected error of an unknown type\n", who);
    return kExitFailed;
  }
}

}  // namespace loom::train
