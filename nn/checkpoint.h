// Activation checkpointing (torch.utils.checkpoint, in its reentrant form): a module marked
// checkpointed keeps only its input in forward, and its backward runs forward again, with grad
// on, then backpropagates through the recomputed graph.
//
//   block.set_checkpointed(true);   // every later grad-recording call of block(x) is checkpointed
//   block.set_checkpoint_policy(CheckpointPolicy::selective_op());   // selective
//
// Selective checkpointing (torchtitan's op mode, Korthikanti et al.'s selective recomputation):
// a policy names the ops whose outputs the forward keeps and the recompute takes those outputs
// back instead of running the ops again (a tensor/dispatch.h DispatchMode records them in
// forward, in call order, and hands them back in the recompute, checking each is the same op on
// the same shapes); everything else is recomputed. selective_op() is torchtitan's: attention's
// output and every other matrix product (the first, third, ...: the products whose inputs are
// cheap to recompute are run again); norms, activations and elementwise ops are recomputed. Any
// predicate over (op, its ordinal among that op's calls in the forward) is a policy.
//
// What the recompute sees is what the forward saw:
//   - the input, kept by the checkpoint's graph node (the only activation it holds);
//   - every parameter slot's tensor at forward time, put back for the recompute and then
//     restored: a mixed-precision forward's bf16 casts (nn/mixed_precision.h), FSDP's gathered
//     whole parameters (refilled by FSDP's pre-backward hook before this node runs), TP's DTensors;
//   - every Dropout's RNG position: a mask is a pure function of (seed, call count, element), so
//     the counts are set back to their forward values for the recompute and forward again after
//     it — the recompute draws the very same masks and later calls the same ones as without
//     checkpointing.
// The module's own forward hooks run once (outside the checkpointed region); its submodules'
// hooks run in the recompute too, so collectives inside (TP's all-gathers and reduce-scatters)
// are issued again, in the same order on every rank. The recomputed graph's parameter gradients
// accumulate as usual, with their hooks (DDP's buckets, FSDP's reduce-scatters); callbacks they
// queue run at the end of the outer backward.
//
// Numerics: the recompute runs the same kernels on the same values, so gradients are bitwise those
// of the plain run.
#pragma once

#include <functional>
#include <string>

#include "nn/module.h"
#include "tensor/op_list.h"

namespace loom::nn {

// Which ops' outputs a checkpointed module keeps from its forward (the others are recomputed).
struct CheckpointPolicy {
  std::string name;  // "full", "selective-op": in messages
  // Whether the forward keeps the output of this call of `op`, the `nth` (from 0) call of that
  // op in the checkpointed forward. Empty: none kept (full recompute).
  std::function<bool(OpId op, int64_t nth)> keep;

  static CheckpointPolicy full();
  // torchtitan's op mode: scaled_dot_product_attention's outputs and those of the even-numbered
  // (0th, 2nd, ...) linear and matmul calls kept; everything else recomputed.
  static CheckpointPolicy selective_op();
  // Every matmul, linear and scaled_dot_product_attention output kept (more memory, no matrix
  // product recomputed).
  static CheckpointPolicy matmuls_and_attention();
};

// module.forward(input) under checkpointing (Module::operator() calls it for a checkpointed
// module when grad mode is on). The recompute also sees the forward's auxiliary-loss scale
// (nn/auxiliary_loss.h).
Tensor checkpointed_forward(Module& module, const Tensor& input);

// Whether this thread is recomputing a checkpointed forward: what a module counts once per step
// (a router's statistics) it does not count again here.
bool in_checkpoint_recompute();

}  // namespace loom::nn
