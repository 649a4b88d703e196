#include "tensor/memory_stats.h"

namespace loom {

MemoryStats MemoryTracker::stats() const {
  return {current_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed),
          allocations_.load(std::memory_order_relaxed),
          allocated_bytes_.load(std::memory_order_relaxed)};
}

void MemoryTracker::reset_peak() {
  peak_.store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void MemoryTracker::charge(int64_t bytes) {
  allocations_.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  const int64_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::credit(int64_t bytes) { current_.fetch_sub(bytes, std::memory_order_relaxed); }

namespace {
thread_local MemoryTracker* tracker_of_thread = nullptr;
}

MemoryTracker& process_memory_tracker() {
  static MemoryTracker* tracker = new MemoryTracker();  // never destroyed: storage may outlive main
  return *tracker;
}

MemoryTracker& current_memory_tracker() {
  return tracker_of_thread != nullptr ? *tracker_of_thread : process_memory_tracker();
}

ScopedMemoryTracker::ScopedMemoryTracker(MemoryTracker& tracker) : previous_(tracker_of_thread) {
  tracker_of_thread = &tracker;
}

ScopedMemoryTracker::~ScopedMemoryTracker() { tracker_of_thread = previous_; }

namespace {
thread_local MemoryTracker* meta_placeholder_tracker = nullptr;
}

ScopedMetaPlaceholderTracker::ScopedMetaPlaceholderTracker(MemoryTracker& tracker)
    : previous_(meta_placeholder_tracker) {
  meta_placeholder_tracker = &tracker;
}

ScopedMetaPlaceholderTracker::~ScopedMetaPlaceholderTracker() {
  meta_placeholder_tracker = previous_;
}

bool meta_placeholders_active() { return meta_placeholder_tracker != nullptr; }

MemoryTracker& memory_tracker_for(Device device) {
  if (device.is_meta() && meta_placeholder_tracker != nullptr) return *meta_placeholder_tracker;
  return current_memory_tracker();
}

}  // namespace loom
