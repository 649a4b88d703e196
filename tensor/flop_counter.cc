#include "tensor/flop_counter.h"

#include "tensor/tensor.h"

namespace loom {

namespace {
thread_local FlopCounter* innermost = nullptr;
thread_local bool recomputing = false;
}  // namespace

FlopCounter::FlopCounter() : outer_(innermost) { innermost = this; }

FlopCounter::~FlopCounter() { innermost = outer_; }

void FlopCounter::record(int64_t flops) {
  for (FlopCounter* c = innermost; c != nullptr; c = c->outer_) {
    c->total_ += flops;
    if (recomputing) c->recomputed_ += flops;
  }
}

void FlopCounter::record_in_place(const Tensor& written, int passes) {
  const int64_t bytes =
      passes * written.numel() * static_cast<int64_t>(element_size(written.dtype()));
  for (FlopCounter* c = innermost; c != nullptr; c = c->outer_) c->in_place_bytes_ += bytes;
}

FlopCounter::Paused::Paused() : innermost_(innermost) { innermost = nullptr; }

FlopCounter::Paused::~Paused() { innermost = innermost_; }

FlopCounter::RecomputeScope::RecomputeScope() : previous_(recomputing) { recomputing = true; }

FlopCounter::RecomputeScope::~RecomputeScope() { recomputing = previous_; }

}  // namespace loom
