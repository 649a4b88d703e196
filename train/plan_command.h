// `./loom plan`: the job's plan as text (train/job_plan.h), on the machine the job's [plan]
// settings describe or this one's calibration; and `./loom plan --calibrate`.
#pragma once

#include <optional>
#include <string>

#include "train/job_config.h"
#include "train/step_time_model.h"

namespace loom::train {

// The machine the plan predicts on: [plan]'s figures (another machine), else this one's
// calibration shared by the job's `ranks`; nullopt (and why, in `missing`) when there is neither.
// Throws naming the flag for figures that do not go together.
std::optional<MachineModel> plan_machine(const JobConfig& job, int64_t ranks, bool gpu_job,
                                         std::string* missing);

// What `loom plan` prints, and how it exits: 0, or comm::kExitBadInput (2) when a search ranked
// no layout (each broke a rule of the job, or the memory limit): a script sees the failure.
struct PlanReport {
  std::string text;
  int exit_code = 0;
};

// The job checked (train/job_checks.h: every check the job makes before its first step) and its
// step traced: the report `./loom plan` prints. Throws loom::Error with the job's own message.
PlanReport plan_report(const JobConfig& job);

// `loom plan --search` (train/layout_search.h): the layouts of the job's ranks, ranked.
PlanReport search_report(const JobConfig& job);

// Measures this machine (train/step_time_model.h) and stores the figures; returns what to print.
std::string calibrate_and_store();

}  // namespace loom::train
