// clip_grad_norm_: scales gradients so their global L2 norm is at most max_norm
// (torch.nn.utils.clip_grad_norm_), across DTensor shards.
//
// The squared norm of a sharded gradient is the sum over its shards, so each rank adds up its
// local shards' squares and the mesh group adds them across ranks — one all-reduce per mesh for
// all DTensor gradients together — while replicated and plain gradients count once. Collective
// when any gradient is a DTensor: every rank of its mesh calls it.
#pragma once

#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::optim {

struct ClipOptions {
  // Groups whose ranks hold *different* parameters (pipeline stages over `pp`): the squared
  // norm is summed over each, after the DTensor shards are. Every rank of them must call.
  std::vector<std::shared_ptr<comm::ProcessGroup>> sum_over;
  // Parameters whose gradients are scaled but not counted: a copy of a parameter another rank
  // counts (the last pipeline stage's copy of a tied embedding).
  std::vector<Tensor> not_counted;
};

// Returns the total norm before clipping. Parameters without a gradient are skipped.
double clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       const ClipOptions& options = {});

}  // namespace loom::optim
