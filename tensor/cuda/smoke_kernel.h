// One real CUDA kernel, to prove the nvcc build path end to end (cuda_library, the CUDA runtime
// link, launching from C++). Plain C++ header: callers compiled by g++ include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

// y[i] = fma(a, x[i], y[i]) for 0 <= i < n (one rounding per element, so a host loop using
// std::fma gives bit-identical results), on the current device, asynchronously on `stream`.
// x and y are device pointers of n floats. n == 0 launches nothing; n < 0 throws loom::Error;
// a launch failure throws loom::Error naming the launch and the device.
void axpy_on_device(float a, const float* x, float* y, std::int64_t n, cudaStream_t stream);

}  // namespace loom::cuda
