// Data parallelism for a model (a whole model or one pipeline stage) over the job's data-parallel
// meshes, as torchtitan's parallelize chooses it:
//   - dp_shard 1, dp_replicate > 1: DDP over dp_replicate (parallel/ddp);
//   - dp_shard > 1: FSDP2's fully_shard per transformer block (the blocks the caller names),
//     then the module itself (the embeddings, the final norm, the head), over the fsdp mesh:
//     dp_shard, or HSDP over (dp_replicate, dp_shard) when dp_replicate > 1 too (parallel/fsdp).
//     The last block and the root keep their parameters gathered after forward (their backward
//     follows at once); every other block reshards.
//   - both 1: nothing.
// Expert parallelism's experts (DTensors on meshes.ep, parallel/ep) hold the gradient of every ep
// rank's tokens: FSDP shards each MoE's experts over the ranks holding the same ones
// (meshes.ep_fsdp: ep_shard, HSDP with dp_replicate) and scales their mean by 1 / ep; when no
// other rank holds them (ep = dp_shard x cp) they stay whole, left out of FSDP, and the last
// backward of a step sums them over dp_replicate and divides by the data-parallel degree.
// Mixed precision comes with it: bf16 compute over f32 masters is nn::apply_mixed_precision
// under DDP, and the FSDP units' own policy (bf16 all-gathers, f32 reduce-scatters) under FSDP.
//
// Gradient accumulation (micro-batches, pipeline microbatches): run every backward through
// backward(last, run); only the last synchronizes (DDP's no_sync, FSDP's
// set_requires_gradient_sync(false)), so a step reduces each gradient once.
//
// Collective contract: construction communicates nothing (FSDP shards what every rank holds);
// the collectives are DDP's or FSDP's, in forward and backward, on every rank of the dp meshes.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/mixed_precision.h"
#include "nn/module.h"
#include "parallel/meshes.h"

namespace loom::ddp {
class DistributedDataParallel;
}

namespace loom::parallel {

class DataParallel {
 public:
  // A transformer block: FSDP's unit, and its name in errors.
  struct Block {
    std::string name;
    nn::Module* module;
  };
  // Call after the TP plan. `module` is on the meshes' device, or on the meta device when
  // `materialize` is given; `blocks` are its transformer blocks in order. `materialize` runs once
  // each rank's parameters have the layout it keeps (after FSDP's sharding, before DDP's replica
  // check): a meta-built module gets its bytes and values there (parallel/build_stage.h).
  DataParallel(std::shared_ptr<nn::Module> module, std::vector<Block> blocks,
               const ParallelMeshes& meshes,
               const std::optional<nn::MixedPrecisionPolicy>& mixed_precision,
               const std::function<void()>& materialize = {});
  ~DataParallel();

  void zero_grad();
  // Runs `run` (one backward); the gradients are reduced across dp only when `last`.
  void backward(bool last, const std::function<void()>& run);
  // "none", "ddp (dp_replicate=2)", "fsdp (dp_shard=2)", "hsdp (dp_replicate=2, dp_shard=2)".
  const std::string& kind() const { return kind_; }
  bool fully_sharded() const { return fully_sharded_; }

 private:
  std::shared_ptr<nn::Module> module_;
  void reduce_expert_gradients();

  std::shared_ptr<ddp::DistributedDataParallel> ddp_;
  std::vector<Tensor> expert_params_;
  std::vector<std::shared_ptr<comm::ProcessGroup>> expert_groups_;  // holding the same experts
  double expert_scale_ = 1;                                         // 1 / the data-parallel degree
  bool fully_sharded_ = false;
  std::string kind_ = "none";
};

}  // namespace loom::parallel
