// PipelineExecutor: runs a validated schedule for one training step on this pp rank
// (torch.distributed.pipelining's PipelineScheduleMulti / _PipelineScheduleRuntime).
//
//   std::vector<std::shared_ptr<PipelineStage>> stages = ...;   // the stages this rank holds
//   PipelineExecutor executor(one_f_one_b_schedule(pp, 8), stages, loss_fn);
//   model_zero_grad();                                          // gradients accumulate
//   double loss = executor.step(inputs, targets);               // same value on every pp rank
//   optimizer.step();
//
// step(inputs, targets):
//   - splits the batch into the schedule's m microbatches along dim 0 (the batch size must be
//     divisible by m). Only the rank holding stage 0 reads `inputs`, only the rank holding the
//     last stage reads `targets`; other ranks may pass undefined tensors.
//   - runs this rank's actions in order. Each microbatch's loss, loss_fn(last stage output,
//     targets of the microbatch), must be a scalar; backward starts from loss / m, so the
//     accumulated gradients equal one backward of the mean of the microbatch losses — for a
//     mean loss, the gradient of the whole batch's mean loss.
//   - gradients accumulate into the parameters' .grad across microbatches (and across steps:
//     zero them before a step, as with torch).
//   - returns the mean of the microbatch losses. It is computed on the last stage's rank and
//     broadcast over the pp group (bit-exact), so every pp rank returns the same value.
//
// Collective contract: every rank of the pp group calls step() with the same schedule, in the
// same order relative to other collectives on that group. A failure names the rank, the action
// and, for communication, the peer stage and rank; after a failure the pp group is unusable
// (its Gloo group is poisoned) and the job should stop.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage.h"

namespace loom::pipeline {

using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

// What one step did on this rank.
struct StepStats {
  double step_seconds = 0;
  // Time in forwards and backwards (the stage modules and the loss), not counting waits for
  // their inputs. The rest of the step is the rank's idle time (the bubble): bubble fraction
  // = 1 - compute_seconds / step_seconds.
  double compute_seconds = 0;
  // The part of the idle time spent blocked waiting for activations and gradients from other
  // ranks (sends do not block); the rest is mostly the wait for the last stage at the step's
  // end (the loss broadcast).
  double recv_wait_seconds = 0;
  // Most microbatches whose forward had run and backward had not, over this rank's stages.
  int peak_microbatches_in_flight = 0;
  // Most bytes of stage boundary tensors (each stage's input and output) held for backward at
  // once. The autograd graph's own saved tensors grow in the same proportion.
  int64_t peak_activation_bytes = 0;
};

class PipelineExecutor {
 public:
  // Validates the schedule (validate_schedule; on a GPU pp group with rendezvous sends, as NCCL's
  // sends wait for the receiver) and that `stages` are exactly the stages the schedule places on
  // this pp rank, all on one pp group of schedule.num_ranks ranks.
  PipelineExecutor(Schedule schedule, std::vector<std::shared_ptr<PipelineStage>> stages,
                   LossFn loss_fn);

  // One run of the schedule. With gradient accumulation over several runs per optimizer step,
  // all but the last pass sync_gradients = false (data parallelism reduces on the last run's
  // last microbatch only) and every run loss_scale = 1 / runs (the step's loss is their mean).
  struct StepOptions {
    bool sync_gradients = true;
    double loss_scale = 1.0;
  };
  double step(const Tensor& inputs, const Tensor& targets, StepOptions options);
  double step(const Tensor& inputs, const Tensor& targets) { return step(inputs, targets, {}); }

  const Schedule& schedule() const { return schedule_; }
  const StepStats& last_stats() const { return stats_; }

 private:
  void run_action(const Action& action, const std::vector<Tensor>& inputs,
                  const std::vector<Tensor>& targets);
  double loss_scale_ = 1.0;  // this run's share of the step's loss
  PipelineStage& stage(int index) const;
  bool is_local(int stage) const { return schedule_.rank_of_stage(stage) == pp_rank_; }
  std::vector<Tensor> split(const Tensor& batch, const char* what) const;
  // "stage 0 on rank 0" for a communication action's (or a waiting compute's) peer, or "".
  std::string peer_note(const Action& action) const;
  double broadcast_mean_loss();
  // This step's receive waits so far, over this rank's stages.
  double recv_wait_seconds() const;
  void track_memory();

  Schedule schedule_;
  std::vector<std::shared_ptr<PipelineStage>> stages_;  // ascending stage index
  LossFn loss_fn_;
  int pp_rank_;
  std::vector<Tensor> scaled_losses_;  // per microbatch, on the last stage's rank
  std::vector<Tensor> losses_;         // per microbatch, detached, on the last stage's rank
  StepStats stats_;
};

}  // namespace loom::pipeline
