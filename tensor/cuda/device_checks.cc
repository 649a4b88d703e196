#include "tensor/cuda/device_checks.h"

#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

// One device's slots: kDeviceCheckSlots int64 in device memory (outside the caching allocator,
// kept for the process) and their bookkeeping.
struct DeviceSlots {
  std::mutex mutex;
  PendingChecks checks{kDeviceCheckSlots};
  int64_t* slots = nullptr;
};

// By device, created on first use. Never destroyed, as the streams (stream.cc): the CUDA runtime
// may be torn down before static destructors run.
struct AllDevices {
  std::mutex mutex;
  std::vector<std::unique_ptr<DeviceSlots>> by_device;
};

AllDevices& all_devices() {
  static AllDevices* instance = new AllDevices;
  return *instance;
}

// The device's slots; nullptr when no check was ever begun on it and `create` is false.
DeviceSlots* device_slots(int device, bool create) {
  AllDevices& all = all_devices();
  std::lock_guard<std::mutex> lock(all.mutex);
  if (static_cast<size_t>(device) >= all.by_device.size()) {
    if (!create) return nullptr;
    all.by_device.resize(device + 1);
  }
  std::unique_ptr<DeviceSlots>& entry = all.by_device[device];
  if (!entry && create) {
    auto fresh = std::make_unique<DeviceSlots>();
    fresh->slots =
        static_cast<int64_t*>(device_malloc(kDeviceCheckSlots * sizeof(int64_t), device));
    entry = std::move(fresh);
  }
  return entry.get();
}

}  // namespace

int64_t* begin_device_check(int device, PendingChecks::Describe describe) {
  DeviceSlots* state = device_slots(device, /*create=*/true);
  std::unique_lock<std::mutex> lock(state->mutex);
  if (state->checks.pending() == state->checks.capacity()) {
    // Every slot belongs to a check the host has not read yet: wait for the device, which reads
    // (and frees) them all, reporting a failure among them now.
    lock.unlock();
    synchronize(device);
    lock.lock();
  }
  const std::optional<int> slot = state->checks.begin(std::move(describe));
  LOOM_INTERNAL_ASSERT(slot.has_value(), "no device-check slot free on cuda:{} after synchronizing",
                       device);
  int64_t* first_bad = state->slots + *slot;
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK_ON(cudaMemsetAsync(first_bad, 0x7f, sizeof(int64_t), compute_stream(device)),
                     device);
  return first_bad;
}

void raise_failed_device_checks(int device) {
  DeviceSlots* state = device_slots(device, /*create=*/false);
  if (state == nullptr) return;
  std::optional<PendingChecks::Failure> failure;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->checks.pending() == 0) return;
    std::array<int64_t, kDeviceCheckSlots> values{};
    DeviceGuard guard(device);
    // Plain CUDA calls, not copy_device_to_host: that one reports failed checks itself.
    const cudaStream_t stream = compute_stream(device);
    LOOM_CUDA_CHECK_ON(cudaMemcpyAsync(values.data(), state->slots, sizeof(values),
                                       cudaMemcpyDeviceToHost, stream),
                       device);
    LOOM_CUDA_CHECK_ON(cudaStreamSynchronize(stream), device);
    failure = state->checks.take_failure(values.data());
  }
  if (!failure) return;
  LOOM_FAIL(
      "{} (found on cuda:{} by the kernel that read it, reported at the host's next "
      "wait for the device)",
      failure->describe(failure->position), device);
}

}  // namespace loom::cuda
