#include "dtensor/comm_debug_mode.h"

#include <fmt/format.h>

namespace loom {

CommDebugMode::CommDebugMode() : thread_(std::this_thread::get_id()) {
  observer_id_ = comm::ProcessGroup::add_observer(
      [this](comm::CollectiveKind kind, int64_t bytes, const std::string& group) {
        if (std::this_thread::get_id() != thread_) return;
        std::lock_guard<std::mutex> lock(mutex_);
        counts_[static_cast<int>(kind)] += 1;
        bytes_[static_cast<int>(kind)] += bytes;
        comm::CollectiveCounters& of_group = groups_[group];
        of_group.calls[static_cast<int>(kind)] += 1;
        of_group.bytes[static_cast<int>(kind)] += bytes;
      });
}

CommDebugMode::~CommDebugMode() { comm::ProcessGroup::remove_observer(observer_id_); }

int64_t CommDebugMode::count(comm::CollectiveKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_[static_cast<int>(kind)];
}

int64_t CommDebugMode::bytes(comm::CollectiveKind kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_[static_cast<int>(kind)];
}

int64_t CommDebugMode::total_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (int64_t c : counts_) total += c;
  return total;
}

std::map<std::string, comm::CollectiveCounters> CommDebugMode::by_group() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return groups_;
}

std::string CommDebugMode::summary() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (int k = 0; k < comm::kNumCollectiveKinds; ++k) {
    if (counts_[k] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{}: {} ({} B)", comm::collective_name(static_cast<comm::CollectiveKind>(k)),
                       counts_[k], bytes_[k]);
  }
  return out.empty() ? "none" : out;
}

}  // namespace loom
