// A GPT laid out over a (pp, dp_replicate, dp_shard, tp) mesh: the composition every GPT job, test
// and example uses (torchtitan's parallelize_llama + pipeline_llama).
//
// build_parallel_gpt applies, in this order:
//   pp > 1:  the pipeline split first (models/gpt/pipeline.h: this rank's stages, each holding
//            its blocks under the whole model's names), then per stage the steps below;
//   1. the model moves to its device;
//   2. tensor parallelism over "tp": the GPT plan (models/gpt/plans.h), with sequence
//      parallelism unless turned off;
//   3. data parallelism (models/data_parallel.h): DDP over "dp_replicate", or FSDP per block
//      and root over "dp_shard" (HSDP with both), with mixed precision (bf16 compute over f32
//      master weights; gradient reductions stay f32).
// The result is a ParallelModel: one interface over the two ways a step runs (gradient
// accumulation over micro-batches, or a pipeline schedule over microbatches), so the training
// loop (train/trainer.h) never asks which.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "models/gpt/config.h"
#include "models/gpt/plans.h"
#include "nn/mixed_precision.h"
#include "train/parallel_dims.h"

namespace loom::train {

struct PipelineConfig {
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int microbatches = 0;           // per step; 0: pp x virtual_stages (every stage busy once full)
  int virtual_stages = 1;         // stages per rank (interleaved)
};

// How a GPT job is parallelized: the degrees, and the options of each layer of the composition.
struct ParallelConfig {
  ParallelDims dims;
  models::GPTPlanOptions tp_plan;  // sequence parallelism on by default (as torchtitan)
  int grad_accum = 1;              // micro-batches per step without a pipeline
  PipelineConfig pipeline;         // with dims.pp > 1
  // bf16 compute over f32 master weights (optimizer, clipping and DDP stay f32); none: all f32.
  std::optional<nn::MixedPrecisionPolicy> mixed_precision;

  // Microbatches per step as the pipeline runs them (the default resolved).
  int microbatches() const;

  // Throws loom::Error naming the field and the values when the layout cannot run a global batch
  // of `global_batch` sequences of `seq_len` tokens on `world_size` ranks: degrees that do not
  // multiply to the world, a batch that does not split over dp x grad_accum or into the
  // microbatches, grad_accum with a pipeline, pipeline options without one, an unknown schedule,
  // a sequence that does not split over tp under sequence parallelism.
  void validate(int64_t world_size, int64_t global_batch, int64_t seq_len) const;
};

// A GPT on its mesh, as the training loop sees it. Every method is collective over the mesh
// (every rank calls it, in the same order).
class ParallelModel {
 public:
  virtual ~ParallelModel() = default;
  virtual void zero_grad() = 0;
  // Forward and backward of this dp rank's batch (B, T): gradient accumulation over grad_accum
  // micro-batches (DDP synchronizing on the last only), or the pipeline schedule over its
  // microbatches. Returns this dp rank's mean loss (the same on every rank of its pp and tp
  // groups).
  virtual double forward_backward(const Tensor& inputs, const Tensor& targets) = 0;
  // Clips the global gradient norm (over every dim of the mesh, the tied embedding counted once);
  // returns it before clipping.
  virtual double clip_grad_norm(double max_norm) = 0;
  // This rank's parameters, under the whole model's names.
  virtual std::vector<std::pair<std::string, Tensor>> named_parameters() const = 0;
  // This rank's modules, under the whole model's names (its stages' with a pipeline).
  virtual std::vector<std::pair<std::string, nn::Module*>> named_modules() const = 0;
  // Logits (B, T, V) of ids (B, T) as a plain tensor on every rank.
  virtual Tensor logits(const Tensor& ids) = 0;
  // Hugging Face GPT-2 safetensors: every rank loads what it holds.
  virtual void load(const std::string& path) = 0;
  // Every rank takes part (gathers); ranks with `write` write the whole model.
  virtual void save(const std::string& path, bool write) = 0;
};

// A GPT of `config` initialized from `seed` (identical on every layout), laid out on `mesh`
// (dims "pp", "dp_replicate", "dp_shard", "tp", as ParallelDims::build_mesh makes it) by
// `parallel`, on the mesh's device (its groups': the CPU for Gloo, this rank's GPU for NCCL).
std::unique_ptr<ParallelModel> build_parallel_gpt(const models::GPTConfig& config, uint64_t seed,
                                                  std::shared_ptr<const DeviceMesh> mesh,
                                                  const ParallelConfig& parallel);

}  // namespace loom::train
