// The CUDA runtime API calls Loom makes, on the CPU (the emulated device's libcudart): device
// memory is host memory, every stream is the host's program order (kernels run when launched,
// copies when issued), events record the host's clock. LOOM_EMULATED_GPUS sets the device count
// (default 1). Only what tensor/, comm/ and the tests call is here; anything else fails to link.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

#include "tools/cuda_emulator/device/emulated_counts.h"
#include "tools/cuda_emulator/device/emulated_limits.h"

namespace {

constexpr std::size_t kTotalBytes = std::size_t{64} << 30;  // what cudaMemGetInfo reports

struct State {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> allocations;
  std::size_t allocated = 0;
};

State& state() {
  static State* s = new State;
  return *s;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

int emulated_devices() {
  const char* value = std::getenv("LOOM_EMULATED_GPUS");
  return value == nullptr ? 1 : std::atoi(value);
}

cudaError_t fail(cudaError_t status) {
  last_error = status;
  return status;
}

struct EmulatedEvent {
  std::chrono::steady_clock::time_point when{};
};

// Streams are tokens: every operation has finished when its call returns.
int stream_token = 0;

}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  *count = emulated_devices();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  if (device < 0 || device >= emulated_devices()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t status = last_error;
  last_error = cudaSuccess;
  return status;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return last_error; }

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
#define LOOM_EMULATED_ERROR(name) \
  case name:                      \
    return #name;
  switch (error) {
    LOOM_EMULATED_ERROR(cudaSuccess)
    LOOM_EMULATED_ERROR(cudaErrorInvalidValue)
    LOOM_EMULATED_ERROR(cudaErrorMemoryAllocation)
    LOOM_EMULATED_ERROR(cudaErrorInitializationError)
    LOOM_EMULATED_ERROR(cudaErrorInvalidDevice)
    LOOM_EMULATED_ERROR(cudaErrorInvalidDevicePointer)
    LOOM_EMULATED_ERROR(cudaErrorInvalidMemcpyDirection)
    LOOM_EMULATED_ERROR(cudaErrorNoDevice)
    LOOM_EMULATED_ERROR(cudaErrorNotReady)
    LOOM_EMULATED_ERROR(cudaErrorIllegalAddress)
    LOOM_EMULATED_ERROR(cudaErrorLaunchFailure)
    LOOM_EMULATED_ERROR(cudaErrorInvalidConfiguration)
    default:
      return "cudaErrorUnknown";
  }
#undef LOOM_EMULATED_ERROR
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    default:
      return "an error of the emulated CUDA device";
  }
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties_v2(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= emulated_devices()) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "Loom CUDA emulator (CPU)", sizeof(prop->name) - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->totalGlobalMem = kTotalBytes;
  prop->sharedMemPerBlock = loom_emu::kSharedMemoryPerBlock;
  prop->sharedMemPerBlockOptin = loom_emu::kSharedMemoryPerBlockOptin;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= emulated_devices()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(loom_emu::kSharedMemoryPerBlockOptin);
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(loom_emu::kSharedMemoryPerBlock);
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue);  // not emulated: say so rather than invent a value
  }
}

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t bytes) {
  void* p = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{256}, std::nothrow);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.allocations[p] = bytes;
  s.allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto it = s.allocations.find(ptr);
    if (it == s.allocations.end()) return fail(cudaErrorInvalidValue);
    s.allocated -= it->second;
    s.allocations.erase(it);
  }
  ::operator delete (ptr, std::align_val_t{256});
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  *total_bytes = kTotalBytes;
  *free_bytes = kTotalBytes - s.allocated;
  return cudaSuccess;
}

// A copy's direction as emulated_counts.h names it.
static const char* copy_name(cudaMemcpyKind kind, bool async) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return async ? "copy host-to-device (async)" : "copy host-to-device";
    case cudaMemcpyDeviceToHost:
      return async ? "copy device-to-host (async)" : "copy device-to-host";
    case cudaMemcpyDeviceToDevice:
      return async ? "copy device-to-device (async)" : "copy device-to-device";
    default:
      return async ? "copy other (async)" : "copy other";
  }
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  loom_emu::count(copy_name(kind, false));
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                      cudaStream_t) {
  loom_emu::count(copy_name(kind, true));
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemset(void* dst, int value, size_t bytes) {
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) {
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = reinterpret_cast<cudaStream_t>(&stream_token);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t) {
  loom_emu::count("sync cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  loom_emu::count("sync cudaDeviceSynchronize");
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  fn(data);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
      (value < 0 || static_cast<size_t>(value) > loom_emu::kSharedMemoryPerBlockOptin))
    return fail(cudaErrorInvalidValue);  // as a GPU refuses more than its opt-in limit
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new EmulatedEvent);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<EmulatedEvent*>(event);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  reinterpret_cast<EmulatedEvent*>(event)->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t) {
  loom_emu::count("sync cudaEventSynchronize");
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t) { return cudaSuccess; }

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto a = reinterpret_cast<EmulatedEvent*>(start)->when;
  const auto b = reinterpret_cast<EmulatedEvent*>(end)->when;
  *ms = std::chrono::duration<float, std::milli>(b - a).count();
  return cudaSuccess;
}

}  // extern "C"
