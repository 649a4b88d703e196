// Value types of the communication layer: reduce ops and collective kinds.
#pragma once

#include <cstdint>
#include <string_view>

namespace loom::comm {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin, kProduct };

// Every operation a ProcessGroup runs, for counters, debug fingerprints and error messages.
enum class CollectiveKind : uint8_t {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kBarrier,
};
inline constexpr int kNumCollectiveKinds = 10;

std::string_view reduce_op_name(ReduceOp op);           // "sum", "avg", ...
std::string_view collective_name(CollectiveKind kind);  // "all_reduce", "broadcast", ...

}  // namespace loom::comm
