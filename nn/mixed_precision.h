// Mixed-precision training: parameters kept in f32 ("master weights", which the optimizer
// updates and DDP reduces), forward and backward computed in a low-precision dtype (bf16).
//
// The design is FSDP2's MixedPrecisionPolicy applied to a whole module tree: a forward-pre hook
// on the root casts every parameter with a differentiable `to(param_dtype)` and swaps the cast
// into the parameter's slot, so every layer (and anything reading a tied weight, like the GPT's
// head) computes in param_dtype; a forward hook swaps the f32 masters back and casts the output
// to output_dtype. Backward runs through the casts, so gradients arrive on the masters in f32
// (the cast's backward converts them): optimizer state, clipping and the DDP all-reduce stay in
// f32, as torchtitan does with reduce_dtype = f32.
//
//   nn::apply_mixed_precision(*model, {.param_dtype = DType::kBFloat16});
//   Tensor logits = (*model)(ids);   // bf16 compute, f32 logits
//
// DTensor parameters (tensor parallelism) cast shard by shard, with no communication.
//
// A forward reuses the casts an earlier forward made while some graph still holds them: the
// microbatches a pipeline keeps in flight share one low-precision copy of the weights (as
// Megatron keeps one) instead of one each until their backward (found by `loom plan`: on GPT-3
// 175B, tp 8, 453 MB per layer and microbatch). A cast is let go once no graph holds it (after
// the step's backward passes), so the next step casts the updated masters. Contract: a graph of
// a grad-recording forward must not be kept across an optimizer step without its backward (the
// next forward would reuse the old weights' cast); evaluate under NoGradGuard, as
// ParallelModel::logits does.
#pragma once

#include "nn/module.h"
#include "tensor/dtype.h"

namespace loom::nn {

struct MixedPrecisionPolicy {
  DType param_dtype = DType::kBFloat16;  // what forward and backward compute in
  DType output_dtype = DType::kFloat32;  // the root's floating-point output (losses in f32)
  // Floating-point inputs of the root are cast to param_dtype (integer ids pass unchanged).
  bool cast_forward_inputs = true;
};

// Registers the hooks on `root` (call it once, after any parallelize_module). Parameters must be
// f32; throws naming the first one that is not.
void apply_mixed_precision(Module& root, MixedPrecisionPolicy policy = {});

}  // namespace loom::nn
