// Loss parallel (torch.distributed.tensor.parallel.loss_parallel): mean cross entropy of logits
// sharded by vocabulary without gathering them. Each rank runs the cross entropy kernel on its
// vocabulary range (ops::ClassShard: its rows' logsumexp and its part of the target term); three
// per-row all-reduces combine them (the DTensor cross_entropy strategy, dtensor/sharding/nn.cc).
// This is where plain targets meet DTensor logits: they are replicated on the logits' mesh.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace loom::tp {

// logits (N, V) a DTensor (any placements; Shard(1) is the no-gather path), targets (N,) plain
// int64 class ids, the same on every rank. Returns the mean loss over targets != ignore_index
// as a plain scalar, differentiable (the gradient reaches the logits with their placements).
Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                   int64_t ignore_index = -100);

}  // namespace loom::tp
