// Activation checkpointing (torch.utils.checkpoint, in its reentrant form): a module marked
// checkpointed keeps only its input in forward, and its backward runs forward again, with grad
// on, then backpropagates through the recomputed graph.
//
//   block.set_checkpointed(true);   // every later grad-recording call of block(x) is checkpointed
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

#include "nn/module.h"

namespace loom::nn {

// module.forward(input) under checkpointing (Module::operator() calls it for a checkpointed
// module when grad mode is on).
Tensor checkpointed_forward(Module& module, const Tensor& input);

}  // namespace loom::nn
