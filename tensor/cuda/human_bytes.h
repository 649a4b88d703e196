// Byte counts for people: "512 B", "1.50 MiB". Used by allocation errors and allocator stats,
// where a raw count of bytes is hard to read. Plain C++ (no CUDA), so CPU-only tests use it too.
#pragma once

#include <cstddef>
#include <string>

namespace loom::cuda {

// 512 -> "512 B", 1572864 -> "1.50 MiB", 1152921504606846976 -> "1.00 EiB".
std::string human_bytes(std::size_t bytes);

}  // namespace loom::cuda
