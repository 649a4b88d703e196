// The emulated GPU's limits, as an H100's or H200's (sm_90): what its runtime reports and what its
// launches enforce.
#pragma once

#include <cstddef>

namespace loom_emu {

// Dynamic shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin).
inline constexpr std::size_t kSharedMemoryPerBlockOptin = 227 << 10;
// Without opting in (cudaDeviceProp::sharedMemPerBlock).
inline constexpr std::size_t kSharedMemoryPerBlock = 48 << 10;

}  // namespace loom_emu
