// A reference-counted byte buffer on one device. Tensors that are views of each other share
// one Storage; the buffer is freed when the last of them goes.
#pragma once

#include <cstddef>
#include <memory>

#include "tensor/device.h"

namespace loom {

class MemoryTracker;

// Meta storage of at most this many bytes keeps real, zeroed host bytes (tensor/device.h).
inline constexpr size_t kMetaDataBytes = 256;

class Storage {
 public:
  // Allocates `bytes` on `device` (64-byte aligned on CPU; on CUDA from the device's caching
  // allocator, tensor/cuda/caching_allocator.h, so no cudaMalloc per tensor; on meta nothing,
  // or zeroed host bytes up to kMetaDataBytes). Contents are uninitialized. The bytes are counted
  // by the allocating thread's MemoryTracker (tensor/memory_stats.h) until they are freed, on
  // whichever thread that happens.
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // Frees the buffer but keeps the Storage, and every tensor viewing it, in place; refill()
  // allocates it again (contents uninitialized). What FSDP does between a unit's forward and its
  // backward (torch's storage().resize_(0)): autograd keeps the tensors, the memory goes.
  // Reading a released storage's data is a bug of the caller; released() tells.
  void release();
  void refill();
  // Gives a meta storage bytes on `device` (contents uninitialized), in place: every tensor
  // viewing it (a module's slot, FSDP's shard, a DTensor and its local shard) is on `device`
  // from now on — torch's module.to_empty(), without replacing any tensor. The bytes are counted
  // by the calling thread's tracker from now on, no longer by the placeholder's.
  void materialize(Device device);
  // Refills a released storage with `other`'s bytes (same size and device), leaving `other`
  // released: a result computed elsewhere moves in without a copy.
  void adopt(Storage& other);
  bool released() const { return released_; }

 private:
  // Only allocate() constructs (make_shared needs a public constructor; the key keeps it ours).
  struct Key {};

 public:
  Storage(Key, void* data, size_t bytes, Device device, MemoryTracker* tracker)
      : data_(data), bytes_(bytes), device_(device), tracker_(tracker) {}

 private:
  static void* allocate_bytes(size_t bytes, Device device);
  void free_bytes();
  void* data_;
  bool released_ = false;
  size_t bytes_;
  Device device_;
  MemoryTracker* tracker_;  // charged while the bytes are held; trackers outlive their storage
};

}  // namespace loom
