// How many bytes of tensor storage are held, and the most ever held: per training rank, per
// benchmark, per planned rank (torch.cuda.memory_allocated / max_memory_allocated, for every
// device and for rank threads sharing one process).
//
//   MemoryTracker rank_memory;
//   {
//     ScopedMemoryTracker scope(rank_memory);   // storage allocated on this thread counts here
//     trainer.step(inputs, targets);
//   }
//   rank_memory.stats().peak_bytes;
//
// Counted: every Storage's requested bytes (tensor/storage.h), on CPU, CUDA and meta alike, from
// its allocation (or refill) to its free (or release), whichever thread frees it. Not counted:
// kernel scratch that does not go through Storage (oneDNN's and cuBLASLt's workspaces, Gloo's and
// NCCL's internal buffers), allocator rounding and fragmentation.
#pragma once

#include <atomic>
#include <cstdint>

#include "tensor/device.h"

namespace loom {

struct MemoryStats {
  int64_t current_bytes = 0;    // held now
  int64_t peak_bytes = 0;       // the most held at once since construction or reset_peak()
  int64_t allocations = 0;      // storage allocations so far
  int64_t allocated_bytes = 0;  // their bytes, summed (what ops wrote: the step-time model's
                                // memory traffic)
};

class MemoryTracker {
 public:
  MemoryTracker() = default;
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  MemoryStats stats() const;
  // The peak restarts from what is held now (torch.cuda.reset_peak_memory_stats).
  void reset_peak();

  void charge(int64_t bytes);
  void credit(int64_t bytes);

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> allocated_bytes_{0};
};

// The tracker new storage on this thread is charged to: the innermost ScopedMemoryTracker's,
// else the process's.
MemoryTracker& current_memory_tracker();
MemoryTracker& process_memory_tracker();

// Makes `tracker` this thread's current tracker for the scope. The tracker must outlive every
// storage allocated under it.
class ScopedMemoryTracker {
 public:
  explicit ScopedMemoryTracker(MemoryTracker& tracker);
  ~ScopedMemoryTracker();
  ScopedMemoryTracker(const ScopedMemoryTracker&) = delete;
  ScopedMemoryTracker& operator=(const ScopedMemoryTracker&) = delete;

 private:
  MemoryTracker* previous_;
};

// While alive, storage allocated on the meta device on this thread is charged to `tracker`
// rather than the current one; other devices' storage is unaffected. nn/meta_init.h counts a
// model's meta placeholders apart this way, while what is real (host tables a model computes)
// still counts as the thread's memory.
class ScopedMetaPlaceholderTracker {
 public:
  explicit ScopedMetaPlaceholderTracker(MemoryTracker& tracker);
  ~ScopedMetaPlaceholderTracker();
  ScopedMetaPlaceholderTracker(const ScopedMetaPlaceholderTracker&) = delete;
  ScopedMetaPlaceholderTracker& operator=(const ScopedMetaPlaceholderTracker&) = delete;

 private:
  MemoryTracker* previous_;
};

// The tracker new storage on `device` is charged to on this thread.
MemoryTracker& memory_tracker_for(Device device);
// Whether meta storage made on this thread now is a placeholder (a ScopedMetaPlaceholderTracker is
// alive: nn/meta_init.h's build), rather than a traced stand-in for real memory (loom plan).
bool meta_placeholders_active();

}  // namespace loom
