// `loom plan`: a GPT job checked and sized before launch, from shapes alone (no process group, no
// tensor of the model is made). torchtitan, Megatron and DeepSpeed users ask "will this fit?"
// before a launch; this answers from the same layout the job would build.
//
// What it does today:
//   - validates the layout as the job does, with the job's own messages: the degrees against
//     the world, the batch against dp x grad_accum and the microbatches, the schedule, the
//     sequence under sequence parallelism (ParallelConfig::validate), the model's sizes, heads
//     over tp (parallelize_gpt's check), and layers per pipeline stage (split_layers'); a
//     vocabulary that tp does not divide is reported as the uneven split that will happen;
//   - model states per rank: each rank's parameter elements (its pipeline stages' parameters,
//     their tensor-parallel shard, and with FSDP its dp_shard chunk as fully_shard lays it out),
//     and from them f32 parameter, gradient and AdamW state bytes; ranks with the same numbers
//     are one row ("role").
// Not yet (issue 19's rest): activations per microbatch, communication buffers, collectives per
// mesh dim, the step-time model, mixed precision's bf16 copies, Llama, published presets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt/config.h"
#include "train/parallel_gpt.h"

namespace loom::train {

// One rank's model states.
struct RankModelStates {
  int rank = 0;
  std::vector<int64_t> coordinate;  // on the (pp, dp_replicate, dp_shard, tp) mesh
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

struct JobPlan {
  models::GPTConfig model;
  ParallelConfig parallel;
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  int num_stages = 1;                  // pipeline stages (pp x virtual stages)
  std::vector<std::string> notes;      // what the job will do that a user may not expect
  std::vector<RankModelStates> ranks;  // every rank, in rank order
  std::vector<RankRole> roles;         // distinct rows, by first rank

  const RankModelStates& rank(int r) const { return ranks.at(static_cast<size_t>(r)); }
};

// Validates and sizes the job: `parallel.dims` resolved (no dp_shard -1), a global batch of
// `global_batch` sequences of `seq_len` tokens. Throws loom::Error naming the field and values as
// the job itself would (before any rank starts).
JobPlan plan_gpt_job(const models::GPTConfig& model, const ParallelConfig& parallel,
                     int64_t global_batch, int64_t seq_len);

// The plan as text: the layout, the notes, and a table of model states per role.
std::string format_job_plan(const JobPlan& plan);

}  // namespace loom::train
