// The redistribute executor: runs a plan (redistribute_plan.h) on a local shard, one small
// transition function per step kind (dtensor/transitions/). No autograd here: dtensor.cc wraps
// it into a differentiable op.
#pragma once

#include "dtensor/redistribute_plan.h"
#include "dtensor/spec.h"
#include "tensor/tensor.h"

namespace loom {

// The new local shard for `spec` redistributed to `target` (normalized placements).
Tensor redistribute_local(const Tensor& local, const DTensorSpec& spec, const Placements& target);

}  // namespace loom
