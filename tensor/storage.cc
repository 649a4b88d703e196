#include "tensor/storage.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include "base/error.h"
#include "tensor/cuda/caching_allocator.h"

namespace loom {

namespace {
constexpr size_t kCpuAlignment = 64;  // one cache line / one AVX-512 vector
}

// CPU buffers come from malloc, aligned by hand: glibc's aligned_alloc bypasses its per-thread
// cache and splits chunks, which made a small tensor's buffer the dearest part of creating it.
// The block's own address is kept just below the aligned data for free_bytes.
void* Storage::allocate_bytes(size_t bytes, Device device) {
  if (device.is_cpu()) {
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* block = std::malloc(rounded + kCpuAlignment);
    LOOM_CHECK(block != nullptr, "Storage: failed to allocate {} bytes on cpu", bytes);
    // malloc aligns to 16, so the data starts 16 to 64 bytes into the block: it fits.
    const auto base = reinterpret_cast<uintptr_t>(block) + sizeof(void*);
    auto* data =
        reinterpret_cast<void**>((base + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment);
    data[-1] = block;
    return data;
  }
  return bytes == 0 ? nullptr : cuda::cached_malloc(bytes, device.index);
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  // One block for the Storage and its reference counts.
  return std::make_shared<Storage>(Key{}, allocate_bytes(bytes, device), bytes, device);
}

void Storage::free_bytes() {
  if (device_.is_cpu()) {
    if (data_ != nullptr) std::free(static_cast<void**>(data_)[-1]);
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
