// Uneven-shard arithmetic, in one place (PyTorch's rule, as torch.chunk): a dim of size n split
// over k ranks gives chunks of ceil(n / k); trailing ranks may get smaller or empty chunks.
#pragma once

#include <cstdint>

namespace loom {

struct ShardRange {
  int64_t offset;  // first index of the chunk in the full dim
  int64_t size;    // chunk length (may be 0)
};

// The chunk of a dim of size `size` that coordinate `index` of `count` holds.
ShardRange shard_range(int64_t size, int64_t count, int64_t index);

}  // namespace loom
