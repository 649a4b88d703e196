#include "train/job_main.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "base/error.h"
#include "tensor/host_memory.h"
#include "train/job_checks.h"
#include "train/job_command_line.h"
#include "train/job_runner.h"
#include "train/launch.h"
#include "train/plan_command.h"

namespace loom::train {

namespace {

// The command line, checked as the job checks itself before it starts (in the process the user
// started; ranks a launcher started check again as they set up).
CommandLine parse_and_check(int argc, char** argv) {
  CommandLine parsed = parse_command_line(
      argc, argv,
      "Train a model of any registered family with data, tensor and pipeline parallelism, or "
      "plan the job with --plan (./loom train, ./loom plan).");
  if (parsed.help || parsed.calibrate || parsed.plan) return parsed;
  if (!launched_as_rank()) check_job(parsed.job);  // its warnings print once the ranks start
  return parsed;
}

int run_job(const CommandLine& parsed, int argc, char** argv, const std::string& program) {
  if (!launched_as_rank()) {
    const ParallelDims dims = parallel_config(parsed.job).dims;
    if (dims.world_size() > 1) relaunch(parsed.launcher, dims.world_size(), dims.str(), argc, argv);
    become_world_of_one();
  }
  JobRunner runner(parsed.job, init_job_process_group(parsed.job), program);
  runner.run();
  return 0;
}

}  // namespace

int job_main(int argc, char** argv, const std::string& program) {
  keep_freed_host_memory();  // tensor/host_memory.h: why
  CommandLine parsed;
  try {
    parsed = parse_and_check(argc, argv);
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "{}: {}\n", program, error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    fmt::print(stderr, "{}: {}\n", program, error.what());
    return kExitBadInput;
  }
  if (parsed.help) return 0;
  const std::string who = parsed.plan ? fmt::format("{} --plan", program) : program;
  try {
    if (parsed.calibrate) {
      fmt::print("{}\n", calibrate_and_store());
      return 0;
    }
    if (parsed.plan) {
      fmt::print("{}", plan_report(parsed.job));
      return 0;
    }
    return run_job(parsed, argc, argv, program);
  } catch (const std::exception& error) {
    // The messages name the flag, file or library function that failed themselves.
    fmt::print(stderr, "{}: {}\n", who, error.what());
    return kExitFailed;
  } catch (...) {
    fmt::print(stderr, "{}: unexpected error of an unknown type\n", who);
    return kExitFailed;
  }
}

}  // namespace loom::train
