// `loom plan`: a job checked and sized before launch (no real process group; the model exists only
// on the meta device). torchtitan, Megatron and DeepSpeed users ask "will this fit, and what will
// it send?" before a launch; this answers from the job's own code.
//
// What it does:
//   - validates the layout as the job does, with the job's own messages: the degrees against
//     the world, the batch against dp x grad_accum and the microbatches, the schedule, the
//     sequence under sequence parallelism (ParallelConfig::validate), the model's sizes, heads
//     over tp, layers per pipeline stage; a vocabulary that tp does not divide is reported as the
//     uneven split that will happen;
//   - model states of every rank from shapes alone, for families that list their parameters
//     (models::ModelArgs::planned_parameters: its stages' parameters, their tensor-parallel
//     shard, and with FSDP its dp_shard chunk as fully_shard lays it out; f32 parameters,
//     gradients and AdamW's moments), ranks with the same numbers as one row;
//   - traces a training step of the job on the meta device (train/step_trace.h): what each rank
//     holds between steps and at its peak (activations, communication buffers, mixed precision's
//     copies included), its collectives per process group and kind (calls and bytes), and its
//     matrix-product FLOPs. Any check the job's code makes fails the trace with the job's message.
//   - with PlanOptions::machine, the step time, tokens/s and MFU (train/step_time_model.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/family.h"
#include "train/parallel_model.h"
#include "train/step_time_model.h"
#include "train/step_trace.h"

namespace loom::train {

// One rank's model states.
struct RankModelStates {
  int rank = 0;
  std::vector<int64_t> coordinate;  // on the mesh (ParallelDims::names() order)
  std::vector<int> stages;          // pipeline stages it runs (one without a pipeline: 0)
  int64_t parameters = 0;           // parameter elements it holds (its shards)
  // f32 master weights, their gradients (the same placements) and AdamW's two moments.
  int64_t parameter_bytes() const { return 4 * parameters; }
  int64_t gradient_bytes() const { return 4 * parameters; }
  int64_t optimizer_bytes() const { return 8 * parameters; }
  int64_t total_bytes() const { return parameter_bytes() + gradient_bytes() + optimizer_bytes(); }
};

// Ranks whose model states are the same (stages and parameters): one printed row. The numbers
// are any of its ranks', e.g. plan.rank(role.ranks.front()).
struct RankRole {
  std::vector<int> ranks;
};

// Traced ranks with the same figures: one printed row.
struct TracedRole {
  std::vector<int> ranks;  // traced ranks
};

// The pipeline's schedule as the job runs it (pp > 1): its own timeline's idle share and what
// each pp rank holds at its peak.
struct PipelinePlan {
  std::string schedule;   // the Schedule's name ("ZBV")
  std::string placement;  // placement_rule: which rank holds which stage
  int num_stages = 0;
  int microbatches = 0;
  // simulated_idle_share with F : B : W = 1 : 2 : 1 (the step-time model's), free messages.
  double idle_share = 0;
  // Per pp rank: its stages and the most stage-microbatches whose activations it holds at once
  // (peak_microbatches_in_flight; a V's stages are half as deep as one stage per rank).
  std::vector<std::vector<int>> stages;
  std::vector<int> peak_microbatches;
};

struct PlanOptions {
  bool trace = true;          // trace a step on the meta device (seconds at any size)
  int max_traced_ranks = 32;  // larger worlds trace representative pipeline lines only
  // The rates the step time is predicted with (train/step_time_model.h); none: no prediction.
  std::optional<MachineModel> machine;
  // The job's device: the trace allocates as its kernels do (tensor/device.h, meta_target).
  Device target = Device::cuda();
  // --val-data: how much validation the job runs (0 batches: none), traced and timed too.
  struct Validation {
    int64_t batches = 0;  // per validation
    int64_t every = 0;    // steps between validations (0: after the last only)
    int64_t steps = 0;    // the job's steps
  } validation;
  // --replicas: the job is replica `replica` of `count` replica jobs, each training its share of
  // the global batch and averaging gradients over the replicas every step (traced with every
  // replica a member); `replay` (--replica-replay): one job running every replica's share.
  struct Replicas {
    int count = 1;
    int replica = 0;
    bool replay = false;
  } replicas;
};

struct JobPlan {
  std::string model_summary;  // models::ModelArgs::summary()
  int64_t world_size = 1;
  ParallelConfig parallel;
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  int num_stages = 1;              // pipeline stages (pp x virtual stages)
  std::vector<std::string> notes;  // what the job will do that a user may not expect
  // Every rank, in rank order, and the distinct rows (empty when the family does not list its
  // parameters: see traced).
  std::vector<RankModelStates> ranks;
  std::vector<RankRole> roles;
  std::optional<PipelinePlan> pipeline;
  // With options.trace: the traced ranks (ascending) and their distinct rows.
  std::vector<TracedRank> traced;
  std::vector<TracedRole> traced_roles;
  // With a trace and options.machine: the predicted step, and the machine's figures.
  std::optional<StepTimeEstimate> time;
  std::optional<MachineModel> machine;
  Device target = Device::cuda();  // whose kernels' allocations the trace followed
  PlanOptions::Validation validation;

  const RankModelStates& rank(int r) const { return ranks.at(static_cast<size_t>(r)); }
};

// Validates and sizes the job of any family: `parallel.dims` resolved (no dp_shard -1), a global
// batch of `global_batch` sequences of `seq_len` tokens. Throws loom::Error naming the field and
// values as the job itself would (before any rank starts).
JobPlan plan_job(const models::ModelArgs& model, const ParallelConfig& parallel,
                 int64_t global_batch, int64_t seq_len, const PlanOptions& options = {});

// The plan as text (markdown tables): the layout, the notes, model states per role, the
// pipeline's schedule (idle share, peak microbatches and traced activation peak per pp rank), and
// the traced memory, FLOPs and communication per role.
std::string format_job_plan(const JobPlan& plan);

}  // namespace loom::train
