#include "tensor/storage.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "base/error.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/memory_stats.h"

namespace loom {

namespace {
constexpr size_t kCpuAlignment = 64;  // one cache line / one AVX-512 vector
}

// CPU buffers come from malloc, aligned by hand: glibc's aligned_alloc bypasses its per-thread
// cache and splits chunks, which made a small tensor's buffer the dearest part of creating it.
// The block's own address is kept just below the aligned data for free_bytes.
void* Storage::allocate_bytes(size_t bytes, Device device) {
  // Meta storage has no buffer, except small ones: zeroed host bytes (tensor/device.h).
  if (device.is_meta() && bytes > kMetaDataBytes) return nullptr;
  if (device.is_cpu() || device.is_meta()) {
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* block = std::malloc(rounded + kCpuAlignment);
    LOOM_CHECK(block != nullptr, "Storage: failed to allocate {} bytes on cpu", bytes);
    // malloc aligns to 16, so the data starts 16 to 64 bytes into the block: it fits.
    const auto base = reinterpret_cast<uintptr_t>(block) + sizeof(void*);
    auto* data =
        reinterpret_cast<void**>((base + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment);
    data[-1] = block;
    if (device.is_meta()) std::memset(data, 0, bytes);
    return data;
  }
  return bytes == 0 ? nullptr : cuda::cached_malloc(bytes, device.index);
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  MemoryTracker& tracker = memory_tracker_for(device);
  // One block for the Storage and its reference counts.
  auto storage =
      std::make_shared<Storage>(Key{}, allocate_bytes(bytes, device), bytes, device, &tracker);
  tracker.charge(static_cast<int64_t>(bytes));
  return storage;
}

void Storage::free_bytes() {
  tracker_->credit(static_cast<int64_t>(bytes_));
  if (device_.is_cpu() || device_.is_meta()) {
    if (data_ != nullptr) std::free(static_cast<void**>(data_)[-1]);
  } else {
    cuda::cached_free(data_, device_.index);  // back to the device's pool; never throws
  }
  data_ = nullptr;
}

Storage::~Storage() {
  if (!released_) free_bytes();
}

void Storage::release() {
  if (released_) return;
  free_bytes();
  released_ = true;
}

void Storage::refill() {
  if (!released_) return;
  data_ = allocate_bytes(bytes_, device_);
  tracker_->charge(static_cast<int64_t>(bytes_));
  released_ = false;
}

void Storage::materialize(Device device) {
  LOOM_CHECK(device_.is_meta() && !released_,
             "Storage::materialize: only a held meta storage gets bytes on a device; this one is "
             "{} on {}",
             released_ ? "released" : "held", device_.str());
  free_bytes();  // the placeholder's (at most kMetaDataBytes of host bytes) and its count
  data_ = allocate_bytes(bytes_, device);
  device_ = device;
  tracker_ = &current_memory_tracker();
  tracker_->charge(static_cast<int64_t>(bytes_));
}

void Storage::adopt(Storage& other) {
  LOOM_INTERNAL_ASSERT(
      released_ && !other.released_ && other.bytes_ == bytes_ && other.device_ == device_,
      "Storage::adopt: needs a released storage and a held one of the same size "
      "and device, got {} bytes ({}) and {} bytes ({})",
      bytes_, released_ ? "released" : "held", other.bytes_, other.released_ ? "released" : "held");
  data_ = other.data_;
  tracker_ = other.tracker_;
  released_ = false;
  other.data_ = nullptr;
  other.released_ = true;
}

}  // namespace loom
