// A model, or one pipeline stage, laid out for this rank — what a one-stage job
// (train/parallel_model.h) and PipelineModel each build:
//   1. built by the family's constructor: on the meta device (nn/meta_init.h) by default, so no
//      rank ever holds the whole model; eagerly on the meshes' device otherwise;
//   2. its blocks marked for activation checkpointing (parallel/activation_checkpoint.h);
//   3. the tensor-parallel plan applied (tp > 1);
//   4. data parallelism (parallel/data_parallel.h): FSDP shards, then a meta-built model's
//      parameters get bytes on the meshes' device and their values (init_weights), then DDP
//      checks its replicas and mixed precision wraps the module.
// Either way the values are the same, bit for bit: each is a function of the seed and the
// element's global index.
//
// Collective contract: what DataParallel's construction issues (DDP's replica check and
// broadcast); a meta build's layout steps communicate nothing.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "mesh/device_mesh.h"
#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/data_parallel.h"
#include "parallel/meshes.h"

namespace loom::parallel {

// What a model family gives for one stage.
struct StageFactory {
  // The stage, built on the default device (its parameters' values a function of the seed).
  std::function<std::shared_ptr<nn::Module>()> make;
  // Its transformer blocks in order: FSDP's units and activation checkpointing's candidates.
  std::function<std::vector<DataParallel::Block>(nn::Module& stage)> blocks;
  // Its tensor-parallel plan on the 1-D tp mesh (called when tp > 1).
  std::function<void(nn::Module& stage, std::shared_ptr<const DeviceMesh> tp_mesh)> parallelize;
};

struct StageLayout {
  ActivationCheckpointing activation_checkpoint;
  int64_t first_block = 0;  // the stage's first block's index in the whole model
  std::optional<nn::MixedPrecisionPolicy> mixed_precision;
  // Build on the meta device and materialize only this rank's shards. Off: every rank builds
  // the whole stage first (what Loom did before; the same values).
  bool meta_init = true;
};

struct BuiltStage {
  std::shared_ptr<nn::Module> module;
  std::shared_ptr<DataParallel> data_parallel;
};

BuiltStage build_stage(const StageFactory& factory, const ParallelMeshes& meshes,
                       const StageLayout& layout);

}  // namespace loom::parallel
