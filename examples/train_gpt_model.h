// The model side of train_gpt: one interface over the two ways the job runs a GPT.
//
//   dp x tp (pp = 1): one GPT, the TP plan over "tp", DDP over "dp", gradient accumulation over
//                     micro-batches (no_sync on all but the last).
//   pp > 1:           GPTPipeline (models/gpt/pipeline.h): this rank's stages, each with the TP
//                     plan and DDP, driven by a pipeline schedule over microbatches.
//
// The training loop (train_gpt.cc) sees only this interface, so both layouts share it.
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

namespace loom::examples {

struct ModelLayout {
  int grad_accum = 1;  // without pipelining
  models::GPTPlanOptions tp_plan;
  std::string schedule = "1f1b";  // with pipelining
  int microbatches = 1;
  int virtual_stages = 1;
  // bf16 compute over f32 master weights (optimizer, clipping and DDP stay f32); none: all f32.
  std::optional<nn::MixedPrecisionPolicy> mixed_precision;
  Device device = Device::cpu();  // where parameters live and compute runs
};

class TrainableGPT {
 public:
  virtual ~TrainableGPT() = default;
  virtual void zero_grad() = 0;
  // Forward and backward of this dp rank's batch (B, T); returns its mean loss (the same on
  // every rank of its pp and tp groups).
  virtual double forward_backward(const Tensor& inputs, const Tensor& targets) = 0;
  // Clips the global gradient norm (over every dim of the mesh); returns it before clipping.
  virtual double clip_grad_norm(double max_norm) = 0;
  // This rank's parameters, with the whole model's names.
  virtual std::vector<std::pair<std::string, Tensor>> named_parameters() const = 0;
  // Logits (B, T, V) of ids (B, T) as a plain tensor on every rank; every rank calls it.
  virtual Tensor logits(const Tensor& ids) = 0;
  // Hugging Face GPT-2 safetensors: every rank loads what it holds.
  virtual void load(const std::string& path) = 0;
  // Every rank calls; ranks with `write` write the whole model.
  virtual void save(const std::string& path, bool write) = 0;
};

// A GPT on `mesh` (dims "pp", "dp", "tp"), initialized from `seed`.
std::unique_ptr<TrainableGPT> make_trainable_gpt(const models::GPTConfig& config, uint64_t seed,
                                                 std::shared_ptr<const DeviceMesh> mesh,
                                                 const ModelLayout& layout);

}  // namespace loom::examples
