#include "dtensor/shard_math.h"

#include <algorithm>

#include "base/error.h"

namespace loom {

ShardRange shard_range(int64_t size, int64_t count, int64_t index) {
  LOOM_INTERNAL_ASSERT(count >= 1 && index >= 0 && index < count && size >= 0);
  const int64_t chunk = (size + count - 1) / count;
  const int64_t offset = std::min(size, chunk * index);
  const int64_t end = std::min(size, offset + chunk);
  return {offset, end - offset};
}

}  // namespace loom
