// A layered model (a GPT, a Llama, a user's own) trained with pipeline parallelism composed with
// tensor and data parallelism over the job's meshes (parallel/meshes.h: pp, tp and the
// data-parallel ones, any of size 1): this rank's pipeline stages (modules holding only their own
// blocks and parameters, under the whole model's names), each parallelized over tp and made data
// parallel (parallel/data_parallel.h: DDP over dp_replicate, or FSDP / HSDP), driven by a
// validated schedule (torchtitan's pipeline_llama, for any model a PipelineModelSpec describes).
//
// What is model-specific comes in the spec: how to build a stage of a StageRange, its tensor
// parallel plan, its transformer blocks (FSDP's units), its loss, its parameter names. What is
// the same for every model is here: the split, the schedule, per-stage data parallelism, the
// gradient norm over every stage, inference through the stages, and the whole model gathered on
// one rank for a checkpoint.
//
// Collective contract: construction communicates nothing. step(), clip_grad_norm(), logits()
// and gather_whole() are collective over the whole mesh (every rank calls them, in the same
// order): the schedule's sends and receives over pp, the data-parallel reductions over the dp
// meshes, the tp plan's collectives, and the gathers of gather_whole().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/build_stage.h"
#include "parallel/data_parallel.h"
#include "parallel/meshes.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/stage_range.h"

namespace loom::pipeline {

class PipelineModel;

struct PipelineModelSpec {
  std::string name;  // "GPTPipeline": in errors
  int64_t n_layers = 0;
  int64_t hidden_size = 0;  // what crosses a stage boundary: (B, T, hidden_size)
  int64_t vocab_size = 0;   // the last stage's logits: (B, T, vocab_size)
  // A stage holding `range`, on the CPU, initialized as the whole model initializes those
  // parameters (each value a function of the seed and the parameter's name only).
  std::function<std::shared_ptr<nn::Module>(const StageRange& range)> make_stage;
  // The tensor-parallel plan of a stage over the 1-D tp mesh (called when tp > 1).
  std::function<void(nn::Module& stage, std::shared_ptr<const DeviceMesh> tp_mesh)> parallelize;
  // A stage's transformer blocks in order ("layers.3"): FSDP's units.
  std::function<std::vector<parallel::DataParallel::Block>(nn::Module& stage)> blocks;
  // The mean loss of the last stage's logits (B, T, V) against targets (B, T).
  std::function<Tensor(const Tensor& logits, const Tensor& targets)> loss;
  // The parameter names of a stage holding `range`, in its named_parameters() order, without
  // allocating its values (gather_whole() receives remote stages' parameters by name).
  std::function<std::vector<std::string>(const StageRange& range)> parameter_names;
  // Optional: the buffers of a stage holding `range` that are part of the model (a mixture of
  // experts' routing bias), which gather_whole() carries after the parameters; unset: none.
  std::function<std::vector<std::string>(const StageRange& range)> buffer_names;

  // Optional, for parameters two stages share (a tied embedding and head):
  // after_step runs after every step's schedule (e.g. summing the copies' gradients between
  // their stages); not_counted lists this rank's copies the gradient norm leaves out (another
  // stage's copy counts the same gradient).
  std::function<void(PipelineModel& model)> after_step;
  std::function<std::vector<Tensor>(const PipelineModel& model)> not_counted;
};

// A pipeline's schedule: what a job's [parallel] section sets (train::ParallelConfig) and
// what PipelineModel runs.
struct ScheduleOptions {
  std::string schedule = "1f1b";  // gpipe | 1f1b | zb-h1 | interleaved | zbv | dualpipev
  int microbatches = 0;           // per step; 0: pp x stages per rank (every stage busy once full)
  int virtual_stages = 1;         // stages per rank (interleaved; zbv and dualpipev place 2 in a V)
  std::vector<int64_t> layers_per_stage;  // explicit split; empty: even

  int stages_per_rank() const { return stages_per_rank_of(schedule, virtual_stages); }
  // The microbatches over `pp` ranks, the default resolved.
  int microbatches_for(int64_t pp) const {
    return microbatches > 0 ? microbatches : static_cast<int>(pp) * stages_per_rank();
  }
};

struct PipelineModelOptions {
  ScheduleOptions schedule;
  // bf16 compute over f32 master weights, per stage (nn/mixed_precision.h); none: all f32.
  std::optional<nn::MixedPrecisionPolicy> mixed_precision;
  // Which blocks recompute their activations in backward (parallel/activation_checkpoint.h).
  parallel::ActivationCheckpointing activation_checkpoint;
  // Build each stage on the meta device and materialize only this rank's shards
  // (parallel/build_stage.h); off: build whole stages eagerly (the same values).
  bool meta_init = true;
};

class PipelineModel {
 public:
  // The stages' parameters live on the mesh's device (DeviceMesh::device(): the CPU over Gloo,
  // this rank's GPU over NCCL); inputs and targets given to step() must be there too.
  PipelineModel(PipelineModelSpec spec, const parallel::ParallelMeshes& meshes,
                PipelineModelOptions options);

  // One step's forward and backward on this dp rank's batch (B, T), split into microbatches;
  // only the first stage's rank reads `inputs`, only the last's `targets`. Returns the mean loss
  // over the batch on every pp rank. Gradients accumulate: zero_grad() first. The spec's
  // after_step runs last.
  double step(const Tensor& inputs, const Tensor& targets);
  // One of several schedule runs of an optimizer step (gradient accumulation): after_step and
  // data parallelism's reductions only when `options.sync_gradients` (the last run).
  double step(const Tensor& inputs, const Tensor& targets, PipelineExecutor::StepOptions options);
  void zero_grad();
  // Global gradient norm over all stages and shards, clipped (the spec's not_counted left out).
  double clip_grad_norm(double max_norm);

  // Inference: the logits (B, T, V) of token ids (B, T), as a plain f32 tensor on every rank. The
  // stages run one after the other (no microbatches, no autograd); every rank calls it with the
  // same ids.
  Tensor logits(const Tensor& ids);
  // Validation: the mean loss of this dp rank's batch (B, T) on every pp rank, forward only (no
  // autograd), over the schedule's microbatches one after the other (a training microbatch's
  // activations at most). Every rank calls it with the same batch.
  double evaluate(const Tensor& inputs, const Tensor& targets);

  // Whether this rank is the mesh's first (coordinate 0 on every dim): where gather_whole()
  // assembles the whole model.
  bool on_first_rank() const;
  // Copies every stage's parameters (gathered over tp, sent over pp), then its buffer_names',
  // into `whole` on the first rank; `whole` is null on every other rank, and every rank of the mesh
  // calls it. A name that an earlier stage also holds (a tied copy) is taken from the earliest
  // stage.
  void gather_whole(nn::Module* whole);

  // This rank's parameters with the whole model's names (its stages', in stage order).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  const std::vector<std::shared_ptr<nn::Module>>& stages() const { return modules_; }
  // The range of each of this rank's stages, in the order of stages().
  std::vector<StageRange> local_ranges() const;
  const std::shared_ptr<const DeviceMesh>& mesh() const { return meshes_.mesh; }
  const parallel::ParallelMeshes& meshes() const { return meshes_; }
  const Schedule& schedule() const { return schedule_; }
  const StepStats& last_stats() const { return executor_->last_stats(); }

 private:
  // The pp group's rank of the rank holding stage `stage`.
  int group_rank_of_stage(int stage) const;
  // The stages over `ids` one after the other (the caller holds no autograd): the last stage's
  // output on the rank holding it, undefined on the others.
  Tensor forward_stages(const Tensor& ids);

  PipelineModelSpec spec_;
  parallel::ParallelMeshes meshes_;
  Schedule schedule_;
  std::vector<StageRange> ranges_;  // every stage's, by stage index
  std::vector<int> local_stages_;   // this rank's stage indices, in order
  std::vector<std::shared_ptr<nn::Module>> modules_;
  std::vector<std::shared_ptr<parallel::DataParallel>> data_parallels_;  // per module
  std::unique_ptr<PipelineExecutor> executor_;
};

}  // namespace loom::pipeline
