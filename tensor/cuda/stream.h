// One compute stream per device: every kernel, cuBLASLt call and host<->device copy of the
// tensor layer is queued on compute_stream(device), so they run in the order the host issued
// them without any synchronization in between (and the caching allocator may hand a freed block
// out again at once: block_pool.h).
//
// The stream is a *blocking* stream (cudaStreamDefault, not cudaStreamNonBlocking): work on the
// legacy default stream waits for it and it waits for the legacy stream. The NCCL backend orders
// each collective after cudaStreamLegacy (comm/nccl/nccl_comm.h: caller_stream()), so that
// ordering also covers every kernel queued here before the collective, without comm/ knowing
// this stream.
//
// One rank drives one device, so "one stream per device" is "one stream per rank" (PyTorch's
// current stream, without the ability to switch it; none of Loom needs a second compute stream).
#pragma once

#include <cuda_runtime_api.h>

namespace loom::cuda {

// The compute stream of `device`, created on first use (thread-safe) and kept for the process.
// Throws loom::Error when the device does not exist.
cudaStream_t compute_stream(int device);
// The compute stream of the calling thread's current device.
cudaStream_t current_stream();
// Blocks the host until everything queued on compute_stream(device) has finished; a kernel's
// asynchronous failure, or a failed device-side check (device_checks.h), surfaces here as
// loom::Error naming the device.
void synchronize(int device);

// A CUDA event on one device: marks a point of a stream, to wait on from another stream or from
// the host, or to time the work between two events (timing = true).
class Event {
 public:
  explicit Event(int device, bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the current end of `stream` (default: the device's compute stream).
  void record(cudaStream_t stream = nullptr);
  // Makes `stream` wait (on the device, not the host) for the work before the recorded point.
  void wait(cudaStream_t stream) const;
  // Blocks the host until the recorded point is reached.
  void synchronize() const;
  // True when the recorded point has been reached (never blocks).
  bool query() const;
  // Milliseconds between `start` and this event; both must be timing events, recorded and
  // reached (call synchronize() first).
  float elapsed_ms_since(const Event& start) const;

  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace loom::cuda
