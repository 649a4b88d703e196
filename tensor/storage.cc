#include "tensor/storage.h"

#include <cstdlib>
#include <new>

#include "base/error.h"
#include "tensor/cuda/caching_allocator.h"

namespace loom {

namespace {
constexpr size_t kCpuAlignment = 64;  // one cache line / one AVX-512 vector
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  void* data = nullptr;
  if (device.is_cpu()) {
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    data = std::aligned_alloc(kCpuAlignment, rounded);
    LOOM_CHECK(data != nullptr, "Storage: failed to allocate {} bytes on cpu", bytes);
  } else {
    data = bytes == 0 ? nullptr : cuda::cached_malloc(bytes, device.index);
  }
  return std::shared_ptr<Storage>(new Storage(data, bytes, device));
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    std::free(data_);
  } else {
    cuda::cached_free(data_, device_.index);  // back to the device's pool; never throws
  }
}

}  // namespace loom
