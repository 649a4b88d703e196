// A reference-counted byte buffer on one device. Tensors that are views of each other share
// one Storage; the buffer is freed when the last of them goes.
#pragma once

#include <cstddef>
#include <memory>

#include "tensor/device.h"

namespace loom {

class Storage {
 public:
  // Allocates `bytes` on `device` (64-byte aligned on CPU; on CUDA from the device's caching
  // allocator, tensor/cuda/caching_allocator.h, so no cudaMalloc per tensor). Contents are
  // uninitialized.
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, size_t bytes, Device device) : data_(data), bytes_(bytes), device_(device) {}
  void* data_;
  size_t bytes_;
  Device device_;
};

}  // namespace loom
