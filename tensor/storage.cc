#include "tensor/storage.h"

#include <cstdlib>
#include <new>

#include "base/error.h"
#include "tensor/cuda/caching_allocator.h"

namespace loom {

namespace {
constexpr size_t kCpuAlignment = 64;  // one cache line / one AVX-512 vector
}

void* Storage::allocate_bytes(size_t bytes, Device device) {
  if (device.is_cpu()) {
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* data = std::aligned_alloc(kCpuAlignment, rounded);
    LOOM_CHECK(data != nullptr, "Storage: failed to allocate {} bytes on cpu", bytes);
    return data;
  }
  return bytes == 0 ? nullptr : cuda::cached_malloc(bytes, device.index);
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  return std::shared_ptr<Storage>(new Storage(allocate_bytes(bytes, device), bytes, device));
}

void Storage::free_bytes() {
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
    cuda::cached_free(data_, device_.index);  // back to the device's pool; never throws
  }
  data_ = nullptr;
}

Storage::~Storage() { free_bytes(); }

void Storage::release() {
  if (released_) return;
  free_bytes();
  released_ = true;
}

void Storage::refill() {
  if (!released_) return;
  data_ = allocate_bytes(bytes_, device_);
  released_ = false;
}

}  // namespace loom
