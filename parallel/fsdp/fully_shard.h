// Fully sharded data parallelism: FSDP2's fully_shard, on DTensor.
//
//   for (auto& block : model.blocks) fsdp::fully_shard(*block, dp_shard_mesh);
//   fsdp::fully_shard(model, dp_shard_mesh);   // the root: the parameters left (embeddings, ...)
//
// A unit is the module fully_shard was applied to, holding its parameters that no unit applied
// earlier (a submodule) already holds. Between steps each of those parameters is a DTensor
// Shard(0) on the 1-D `mesh` (uneven first dims as torch.chunk: the last ranks may hold fewer
// rows, or none), a leaf requiring grad. On a 2-D mesh (dp_replicate, dp_shard) it is
// (Replicate, Shard(0)): HSDP, sharded within dp_shard and replicated across dp_replicate. The
// optimizer, gradient clipping and checkpoints see only shards, so AdamW's moments are sharded too
// (ZeRO-3).
//
// Collective contract, per call of the unit's forward (every rank of `mesh` calls it, in the
// same order):
//   - before forward: one all_gather_into_tensor of the unit's flat buffer (every parameter's
//     chunk, padded to the largest rank's); the module computes with whole, plain parameters;
//   - after forward: the module's slots hold the shards again (state_dict, optimizers and
//     clipping never see whole parameters); with reshard_after_forward (the default) the whole
//     parameters' memory is released, and when backward reaches the unit (a hook on its
//     output's gradient) one more all_gather_into_tensor fills it again;
//   - in backward, once every whole parameter of the call has its gradient: one
//     reduce_scatter_tensor (average over dp_shard) of the flat gradient buffer, with HSDP one
//     all_reduce (average over dp_replicate) of the reduced shard, and the shards are added into
//     the sharded parameters' .grad (DTensors laid out as the parameters). A
//     parameter the forward did not use contributes zeros, so every rank reduces alike.
// Without reshard_after_forward the whole parameters stay in memory until backward has used
// them (autograd keeps what it saved): no second all-gather, more memory.
// Timing (parallel/fsdp/unit.h): the units inside a root are prefetched in the last pass's
// forward order — unit i+1's all-gather is issued when unit i's forward starts, unit i-1's when
// unit i's backward starts — and reduce-scatters are asynchronous, finished (HSDP's all-reduce
// included) when backward ends, so backward() returns with every sharded .grad in place. The
// collectives and their order are the same on every rank; only when they are issued changes.
//
// Tensor parallelism composes (FSDP2 + TP as torchtitan applies it: TP first, then fully_shard on
// the dp mesh): a parameter that is a DTensor on a slice of the same root mesh (mesh["tp"]) is
// sharded by its local TP shard's rows. Its sharded form lives on the (tp, [dp_replicate,]
// dp_shard) mesh with placements (its TP placement, [Replicate,] Shard(0)) — placements apply in
// mesh-dim order, so that is exactly the TP shard split again over dp_shard (torch's
// _StridedShard in plain placements) — and the unit computes with the gathered TP shard, as a
// DTensor with the parameter's TP layout again.
//
// Errors name the unit and the parameter: a parameter that another unit already holds through a
// different module, a mesh that is neither 1-D nor 2-D, fully_shard on a unit twice, parameters of
// a unit on different devices or dtypes (one flat buffer each), a 0-dim parameter, and a DTensor
// parameter that is Partial or on a mesh that is not a slice of the FSDP mesh's root.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "mesh/device_mesh.h"
#include "nn/module.h"

namespace loom::fsdp {

// FSDP2's MixedPrecisionPolicy: the sharded master parameters stay in their dtype (f32); the
// whole parameters a unit computes with, and the all-gather, are param_dtype; gradients are
// reduce-scattered in reduce_dtype (default: param_dtype) and added to the masters' gradients in
// the masters' dtype. A unit casts its floating-point input to param_dtype (cast_forward_inputs).
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;   // none: the parameters' own dtype
  std::optional<DType> reduce_dtype;  // none: param_dtype
  std::optional<DType> output_dtype;  // none: the unit's output as computed
  bool cast_forward_inputs = true;
};

struct FSDPOptions {
  // FSDP2's reshard_after_forward: free the whole parameters after forward and gather them
  // again for backward (ZeRO-3), or keep them until backward (ZeRO-2's memory, one all-gather).
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  // Issue the next unit's all-gather before this unit computes, in forward and (reverse order)
  // in backward (FSDP1's forward_prefetch / backward_prefetch; FSDP2 always does). Off: each unit
  // gathers when it runs (less memory in flight, no overlap; for A/B measurements).
  bool prefetch = true;
  // Parameters the unit leaves alone (torch FSDP's ignored_params): neither sharded nor reduced
  // here; whoever placed them reduces their gradients (expert parallelism's experts).
  std::vector<Tensor> ignored_params;
  // The reduced gradients times this (torch's gradient_divide_factor, inverted): e.g. 1 / ep for
  // expert-parallel experts, whose gradients already sum ep ranks' tokens before FSDP averages
  // them over the ranks holding the same experts.
  double gradient_scale = 1.0;
};

// Shards `module`'s parameters (those no earlier unit holds) over the 1-D `mesh` and installs
// the hooks above. `name` names the unit in errors (default: the module's type name).
void fully_shard(nn::Module& module, std::shared_ptr<const DeviceMesh> mesh,
                 FSDPOptions options = {}, std::string name = "");

// FSDP2's set_requires_gradient_sync, for gradient accumulation and pipeline microbatches: with
// `sync` false, the backward of every unit in `module`'s tree (itself included) keeps its whole
// gradients instead of reduce-scattering them; the next backward with sync true reduces their
// sum with its own, so a step issues one reduce-scatter per unit whatever the microbatches (at
// the memory of one unsharded gradient per unit meanwhile). Throws when no unit is in the tree.
void set_requires_gradient_sync(nn::Module& module, bool sync);

// Whether fully_shard was applied to `module` itself.
bool is_fully_sharded(const nn::Module& module);

}  // namespace loom::fsdp
