// Any registered family's model laid out over a (pp, dp_replicate, dp_shard, cp, tp) mesh: the one
// composition every job, test and example uses (torchtitan's parallelize + pipeline functions),
// for pp = 1 and pp > 1 alike, driven by the family's parts (models::ModelArgs::spec).
//
// build_parallel_model applies, in this order:
//   pp > 1:  the pipeline split first (this rank's stages, each holding its blocks under the
//            whole model's names), then per stage the steps below;
//   pp = 1:  the whole model as the one stage;
//   1. the model moves to the mesh's device;
//   2. tensor parallelism over tp: the family's plan, with sequence parallelism unless off;
//   3. data parallelism (parallel/data_parallel.h): DDP over dp_replicate, or FSDP per block
//      and root over dp_shard (HSDP with both), with mixed precision (bf16 compute over f32
//      master weights; gradient reductions stay f32).
// The result is a ParallelModel: one interface over the two ways a step runs (gradient
// accumulation over micro-batches, or a pipeline schedule over microbatches), so the training
// loop (train/trainer.h) never asks which.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "models/family.h"
#include "models/hf/checkpoint.h"
#include "nn/module.h"
#include "nn/moe/moe.h"
#include "train/parallel_config.h"

namespace loom::train {

// A model on its mesh, as the training loop sees it. Every method is collective over the mesh
// (every rank calls it, in the same order).
class ParallelModel {
 public:
  virtual ~ParallelModel() = default;
  virtual void zero_grad() = 0;
  // Forward and backward of this dp rank's batch (B, T): gradient accumulation over grad_accum
  // micro-batches (data parallelism synchronizing on the last only), or the pipeline schedule
  // over its microbatches. Returns this dp rank's mean loss (the same on every rank of its pp and
  // tp groups). The batch is taken to be share data_parallel_rank of data_parallel_size equal
  // shares of the global batch (as local_batch cuts it), so dropout draws those rows of one
  // rank's masks (nn/batch_part.h; an enclosing nn::BatchPart places the global batch itself).
  virtual double forward_backward(const Tensor& inputs, const Tensor& targets) = 0;
  // Validation: this dp rank's mean loss on (B, T), forward only (no autograd, no gradients),
  // in the training step's micro-batches (grad_accum, or the pipeline's microbatches) so it
  // never holds more activations than a training micro-batch. The same on every rank of its pp
  // and tp groups.
  virtual double evaluate(const Tensor& inputs, const Tensor& targets) = 0;
  // Clips the global gradient norm (over every dim of the mesh, a tied parameter counted once);
  // returns it before clipping.
  virtual double clip_grad_norm(double max_norm) = 0;
  // This rank's parameters, under the whole model's names.
  virtual std::vector<std::pair<std::string, Tensor>> named_parameters() const = 0;
  // This rank's modules, under the whole model's names (its stages' with a pipeline).
  virtual std::vector<std::pair<std::string, nn::Module*>> named_modules() const = 0;
  // Logits (B, T, V) of ids (B, T) as a plain tensor on every rank.
  virtual Tensor logits(const Tensor& ids) = 0;
  // A Hugging Face checkpoint (models/hf/checkpoint.h): every rank loads the boxes it holds,
  // reading only their bytes where the family states its file layout; returns what it read.
  // Throws naming the family when it has no Hugging Face format.
  virtual models::hf::LoadStats load_hf(const std::string& path) = 0;
  // Every rank takes part (gathers); ranks with `write` write the whole model and config.json.
  virtual void save_hf(const std::string& path, bool write) = 0;
  // The whole model's routed experts per MoE layer (models::ModelArgs::num_experts; 0: dense),
  // the same on every rank, whether or not this rank's stages hold a MoE layer.
  virtual int64_t num_experts() const = 0;
};

// This rank's MoE layers (none for a dense model or a stage without them).
std::vector<nn::MoE*> moe_layers(const ParallelModel& model);

// torch's model.eval() for a scope: every module of `model` in evaluation mode (no dropout masks,
// no router load counted), each put back as it was when the scope ends, however it ends.
class EvalMode {
 public:
  explicit EvalMode(const ParallelModel& model);
  ~EvalMode();
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  std::vector<std::pair<nn::Module*, bool>> modes_;
};

// A model of `args` initialized from `seed` (identical on every layout), laid out on `mesh`
// (ParallelDims::build_mesh's) by `parallel`, on the mesh's device (its groups': the CPU for
// Gloo, this rank's GPU for NCCL).
// Throws naming the family unless cp is 1 or the family takes context parallelism
// (models::ModelArgs::supports_context_parallel): the job's checks and the plan call it too.
void check_context_parallel(const models::ModelArgs& args, int64_t cp);
// Throws naming --ep and the experts unless ep is 1, or the model has MoE layers whose experts ep
// divides: the job's checks and the plan call it too.
void check_expert_parallel(const models::ModelArgs& args, int64_t ep);

std::unique_ptr<ParallelModel> build_parallel_model(const models::ModelArgs& args, uint64_t seed,
                                                    std::shared_ptr<const DeviceMesh> mesh,
                                                    const ParallelConfig& parallel);

}  // namespace loom::train
