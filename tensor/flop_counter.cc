#include "tensor/flop_counter.h"

namespace loom {

namespace {
thread_local FlopCounter* innermost = nullptr;
}

FlopCounter::FlopCounter() : outer_(innermost) { innermost = this; }

FlopCounter::~FlopCounter() { innermost = outer_; }

void FlopCounter::record(int64_t flops) {
  for (FlopCounter* c = innermost; c != nullptr; c = c->outer_) c->total_ += flops;
}

}  // namespace loom
