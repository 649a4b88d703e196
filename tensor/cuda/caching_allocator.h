// The CUDA caching allocator: every CUDA Storage allocates through it, so ops do not call
// cudaMalloc/cudaFree (both synchronize the device). One BlockPool (block_pool.h: rounding,
// small/large pools, splitting, merging) per device, over cudaMalloc segments.
//
// Set LOOM_CUDA_CACHING_ALLOCATOR=0 to allocate each block with cudaMalloc and free it with
// cudaFree instead (for compute-sanitizer's memcheck, which cannot see overruns inside a
// segment). The setting is read once per process.
#pragma once

#include <cstddef>

#include "tensor/cuda/block_pool.h"

namespace loom::cuda {

// `bytes` on `device` (0 <= device < device_count()); nullptr for 0 bytes without touching
// the device. Throws loom::Error naming the device, the request and the pool's state when the
// device is missing or full (after releasing the cache once).
void* cached_malloc(std::size_t bytes, int device);
// Returns a pointer from cached_malloc(…, device) to its pool; nullptr is a no-op. Never
// throws (Storage's destructor calls it): a failure is reported on stderr.
void cached_free(void* ptr, int device) noexcept;

// The pool's counters for `device` (all zero for a device never allocated on).
AllocatorStats allocator_stats(int device);
// Peak allocated/reserved bytes of `device` restart from the current values.
void reset_peak_stats(int device);
// Returns the cached (unused) segments of every device to CUDA; the bytes released.
std::size_t empty_cache();
// False when LOOM_CUDA_CACHING_ALLOCATOR=0.
bool caching_enabled();

}  // namespace loom::cuda
