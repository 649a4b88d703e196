// The one way CPU kernels split work over threads: contiguous chunks of an index range, one per
// thread, on the GEMM's thread count (kernel_threads(), gemm.h). Small ranges stay on the calling
// thread: a parallel region costs a few microseconds.
#pragma once

#include <cstdint>
#include <functional>

namespace loom::cpu {

// Below this many elements one thread does it all.
inline constexpr int64_t kParallelGrain = int64_t{1} << 15;

// Runs body(begin, end) over [0, n) in at most kernel_threads() contiguous chunks (fewer when n /
// grain is smaller), every chunk boundary a multiple of `align` (so a vectorized body computes
// each element with the same instructions whatever the thread count). An exception thrown by a
// chunk is rethrown on the calling thread after every chunk finished (the first one, if several).
void parallel_for(int64_t n, int64_t grain, int64_t align,
                  const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace loom::cpu
