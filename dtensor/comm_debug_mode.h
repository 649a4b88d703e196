// CommDebugMode: counts the collectives issued inside a scope, by kind and bytes (like
// torch.distributed.tensor.debug.CommDebugMode). Counts only operations issued from the thread
// that opened the scope, so rank threads in one process each see their own.
//
//   CommDebugMode comm;
//   Tensor y = redistribute(x, {Replicate()});
//   EXPECT_EQ(comm.count(comm::CollectiveKind::kAllGather), 1);
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "comm/process_group.h"

namespace loom {

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  int64_t count(comm::CollectiveKind kind) const;
  int64_t bytes(comm::CollectiveKind kind) const;
  int64_t total_count() const;
  // "all_gather: 2 (96 B), all_reduce: 1 (32 B)"; "none" when empty.
  std::string summary() const;
  // The same counts per process group, by the group's name ("mesh/tp", "default", ...).
  std::map<std::string, comm::CollectiveCounters> by_group() const;

 private:
  mutable std::mutex mutex_;
  std::thread::id thread_;
  std::array<int64_t, comm::kNumCollectiveKinds> counts_{};
  std::array<int64_t, comm::kNumCollectiveKinds> bytes_{};
  std::map<std::string, comm::CollectiveCounters> groups_;
  int observer_id_;
};

}  // namespace loom
