#include "tensor/cuda/stream.h"

#include <memory>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/device_checks.h"

namespace loom::cuda {
namespace {

// Streams by device. Never destroyed: the CUDA runtime may be torn down before static
// destructors run, and a process's streams go with its context anyway.
struct Streams {
  std::mutex mutex;
  std::vector<cudaStream_t> by_device;
};

Streams& streams() {
  static Streams* instance = new Streams;
  return *instance;
}

}  // namespace

cudaStream_t compute_stream(int device) {
  check_device(device, "compute_stream");
  Streams& s = streams();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (static_cast<size_t>(device) >= s.by_device.size()) s.by_device.resize(device + 1, nullptr);
  if (s.by_device[device] == nullptr) {
    DeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    // Blocking on purpose (see stream.h): ordered with the legacy default stream NCCL uses.
    LOOM_CUDA_CHECK_ON(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), device);
    s.by_device[device] = stream;
  }
  return s.by_device[device];
}

cudaStream_t current_stream() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return compute_stream(device);
}

void synchronize(int device) {
  {
    DeviceGuard guard(device);
    LOOM_CUDA_CHECK_ON(cudaStreamSynchronize(compute_stream(device)), device);
  }
  raise_failed_device_checks(device);
}

Event::Event(int device, bool timing) : device_(device) {
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK_ON(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
      device);
}

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) {
  DeviceGuard guard(device_);
  LOOM_CUDA_CHECK_ON(cudaEventRecord(event_, stream != nullptr ? stream : compute_stream(device_)),
                     device_);
}

void Event::wait(cudaStream_t stream) const {
  LOOM_CUDA_CHECK_ON(cudaStreamWaitEvent(stream, event_, 0), device_);
}

void Event::synchronize() const { LOOM_CUDA_CHECK_ON(cudaEventSynchronize(event_), device_); }

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  LOOM_CUDA_CHECK_ON(status, device_);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  LOOM_CUDA_CHECK_ON(cudaEventElapsedTime(&ms, start.event_, event_), device_);
  return ms;
}

}  // namespace loom::cuda
