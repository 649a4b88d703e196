// A GPT over the job's meshes (parallel/meshes.h: pipeline stages over pp, each stage's tensor
// parallelism over tp with the GPT plan, data parallelism over the dp meshes): GPT's parts for
// pipeline::PipelineModel (gpt_pipeline_spec), and GPTPipeline, the same with the stages typed.
//
//   GPTPipeline model(config, seed, meshes, {.schedule = "1f1b", .microbatches = 8});
//   model.zero_grad();
//   double loss = model.step(inputs, targets);   // this dp rank's batch; same on every pp rank
//   model.clip_grad_norm(1.0);
//   optimizer.step();                             // over model.parameters()
//
// step() runs the schedule (DDP or FSDP reduces each stage's gradients during its last
// microbatch's backward, the others run without gradient sync: one reduction per step), then sums
// the tied embedding's gradient between the first stage (wte) and the last (its copy for the head),
// as Megatron-LM does, so the two copies take identical optimizer steps and stay equal — and the
// whole equals one rank's model. The machinery every model shares (split, schedule, per-stage
// tp and data parallelism, inference, gathering the whole) is parallel/pipeline/pipeline_model.h;
// this adds GPT's stages, plan and tied embedding.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt/gpt.h"
#include "models/gpt/plans.h"
#include "nn/mixed_precision.h"
#include "parallel/data_parallel.h"
#include "parallel/meshes.h"
#include "parallel/pipeline/pipeline_model.h"

namespace loom::models {

// A GPT's or a GPT stage's transformer blocks, named "h.{i}" by their index in the whole model:
// FSDP's units.
std::vector<parallel::DataParallel::Block> gpt_blocks(const GPTStage& module);

// GPT's stages, plan, loss and tied embedding, for models::PipelineModel.
pipeline::PipelineModelSpec gpt_pipeline_spec(const GPTConfig& config, uint64_t seed,
                                              const GPTPlanOptions& plan = {});

// A PipelineModel of gpt_pipeline_spec, with the stages typed.
class GPTPipeline {
 public:
  // The stages' parameters live on the mesh's device (DeviceMesh::device(): the CPU over Gloo,
  // this rank's GPU over NCCL); inputs and targets given to step() must be there too.
  GPTPipeline(const GPTConfig& config, uint64_t seed, const parallel::ParallelMeshes& meshes,
              pipeline::ScheduleOptions schedule = {}, GPTPlanOptions plan = {},
              std::optional<nn::MixedPrecisionPolicy> mixed_precision = std::nullopt);

  // One step's forward and backward on this dp rank's batch (B, T) — split into microbatches;
  // only the first stage's rank reads `inputs`, only the last's `targets`. Returns the mean loss
  // over the batch on every pp rank. Gradients accumulate: zero_grad() first.
  double step(const Tensor& inputs, const Tensor& targets) { return model_.step(inputs, targets); }
  void zero_grad() { model_.zero_grad(); }
  // Global gradient norm over all stages and shards (the tied embedding counted once), clipped.
  double clip_grad_norm(double max_norm) { return model_.clip_grad_norm(max_norm); }

  // Inference: the logits (B, T, V) of token ids (B, T), as a plain tensor on every rank. The
  // stages run one after the other (no microbatches, no autograd); every rank of the mesh calls
  // it with the same ids.
  Tensor logits(const Tensor& ids) { return model_.logits(ids); }

  // The whole model, assembled on the mesh's first rank (coordinate 0 on every dim) from every
  // stage's parameters (gathered over tp, sent over pp); null on the other ranks. Every rank of
  // the mesh calls it (checkpoints: save_gpt2_hf of the result).
  std::unique_ptr<GPT> whole_model_on_first_rank();

  // This rank's parameters with the whole model's names (its stages', in stage order; the last
  // stage's copy of the tied embedding is listed as "wte.weight" too).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const {
    return model_.named_parameters();
  }
  std::vector<Tensor> parameters() const { return model_.parameters(); }
  const std::vector<std::shared_ptr<GPTStage>>& stages() const { return modules_; }
  const pipeline::Schedule& schedule() const { return model_.schedule(); }
  const pipeline::StepStats& last_stats() const { return model_.last_stats(); }

 private:
  pipeline::PipelineModel model_;
  std::vector<std::shared_ptr<GPTStage>> modules_;  // model_'s stages, typed
};

}  // namespace loom::models
