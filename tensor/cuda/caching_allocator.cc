#include "tensor/cuda/caching_allocator.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"

namespace loom::cuda {
namespace {

// Segments straight from cudaMalloc on one device.
class DeviceRawAllocator final : public RawAllocator {
 public:
  explicit DeviceRawAllocator(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override { return device_malloc(bytes, device_); }
  void free(void* ptr) override { device_free(ptr, device_); }
  std::string name() const override { return fmt::format("cuda:{}", device_); }

 private:
  int device_;
};

struct DevicePool {
  explicit DevicePool(int device) : raw(device), pool(raw) {}
  DeviceRawAllocator raw;
  BlockPool pool;
};

// Pools by device, created on first use. Never destroyed: at process exit the CUDA runtime may
// already be torn down, and freeing then fails (PyTorch leaks its allocator for the same reason).
class Pools {
 public:
  BlockPool& get(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<std::size_t>(device) >= pools_.size()) pools_.resize(device + 1);
    if (!pools_[device]) pools_[device] = std::make_unique<DevicePool>(device);
    return pools_[device]->pool;
  }
  // The pool of `device` if it exists (nullptr otherwise).
  BlockPool* find(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0 || static_cast<std::size_t>(device) >= pools_.size() || !pools_[device]) {
      return nullptr;
    }
    return &pools_[device]->pool;
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pools_.size();
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<DevicePool>> pools_;
};

Pools& pools() {
  static Pools* instance = new Pools;
  return *instance;
}

}  // namespace

bool caching_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("LOOM_CUDA_CACHING_ALLOCATOR");
    return value == nullptr || std::string(value) != "0";
  }();
  return enabled;
}

void* cached_malloc(std::size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  check_device(device, "cached_malloc");
  if (!caching_enabled()) return device_malloc(bytes, device);
  return pools().get(device).allocate(bytes);
}

void cached_free(void* ptr, int device) noexcept {
  if (ptr == nullptr) return;
  try {
    if (!caching_enabled()) {
      device_free(ptr, device);
      return;
    }
    BlockPool* pool = pools().find(device);
    LOOM_CHECK(pool != nullptr, "cached_free: no allocation was ever made on cuda:{}", device);
    pool->free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: %s\n", e.what());
  }
}

AllocatorStats allocator_stats(int device) {
  BlockPool* pool = pools().find(device);
  return pool == nullptr ? AllocatorStats{} : pool->stats();
}

void reset_peak_stats(int device) {
  if (BlockPool* pool = pools().find(device)) pool->reset_peak();
}

std::size_t empty_cache() {
  std::size_t released = 0;
  const std::size_t count = pools().count();
  for (std::size_t device = 0; device < count; ++device) {
    if (BlockPool* pool = pools().find(static_cast<int>(device)))
      released += pool->release_cached();
  }
  return released;
}

}  // namespace loom::cuda
