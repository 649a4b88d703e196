// The DTensor dispatch handler: sharding propagation + redistribution + the local op.
//
// Installed into tensor/dispatch.h for kDTensorExtensionKind by install_dtensor_dispatch()
// (called by make_dtensor, so any DTensor in existence implies the handler is there). Decisions
// are cached per (op, input shapes and placements, attributes), so a repeated op skips
// strategy evaluation.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dispatch.h"

namespace loom::sharding {

void install_dtensor_dispatch();

// The handler itself (exposed for tests and benchmarks).
std::vector<Tensor> dispatch_dtensor_op(const OpCall& call);

struct PropagationStats {
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
};
PropagationStats propagation_stats();
void clear_propagation_cache();

}  // namespace loom::sharding
