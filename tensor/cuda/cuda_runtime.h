// loom::cuda: thin, checked wrappers over the CUDA runtime for the tensor layer.
//
// Every failure throws loom::Error naming the CUDA call, the error's name and text, and the
// device, e.g.
//   CUDA call cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) failed on cuda:0:
//   cudaErrorInvalidValue (invalid argument) [tensor/cuda/cuda_runtime.cc:97]
//
// A process without a GPU or without a driver is a normal state, not an error: device_count()
// returns 0 and available() is false, with unavailable_reason() saying why. Tests use that to
// GTEST_SKIP(), so the suite passes on CPU-only machines.
//
// device_malloc/device_free are plain cudaMalloc/cudaFree: tensors allocate through the caching
// allocator (caching_allocator.h) instead; copies are ordered on the compute stream (stream.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "base/error.h"

namespace loom::cuda {

// Why a CPU-only build (--config=cpu) has no CUDA device; the kernel stubs throw it too.
inline constexpr const char* kCpuOnlyBuild =
    "Loom was built CPU-only (--config=cpu, i.e. --define=loom_cuda=false): its CUDA kernels were "
    "not compiled; rebuild without that flag to use GPUs";

// False in a CPU-only build: then device_count() is 0 and unavailable_reason() is kCpuOnlyBuild,
// so every GPU entry point (a CUDA tensor, an NCCL group, --device cuda) fails naming the flag.
bool kernels_built();

// Number of CUDA devices this process can see (after CUDA_VISIBLE_DEVICES). 0, not an error,
// when there is no device (cudaErrorNoDevice) or no usable driver (cudaErrorInsufficientDriver,
// cudaErrorStubLibrary, cudaErrorSystemDriverMismatch). Any other failure of cudaGetDeviceCount
// throws loom::Error. The answer is probed once per process.
int device_count();

// True when device_count() > 0. Never throws: an unexpected probe failure is "unavailable", with
// the failure in unavailable_reason().
bool available();

// Why available() is false, e.g. "no CUDA device: cudaGetDeviceCount returned cudaErrorNoDevice
// (no CUDA-capable device is detected)"; empty when CUDA is available.
std::string unavailable_reason();

// Throws loom::Error unless `device` names a device of this process ("{what}: there is no CUDA
// device cuda:3; this process sees 1 CUDA device"), with unavailable_reason() when it sees none.
void check_device(int device, const char* what);

// cudaMalloc on `device` (0 <= device < device_count()). Throws loom::Error naming the size and
// the device when the device does not exist or the allocation fails. 0 bytes returns nullptr.
// The calling thread's current device is left as it was.
void* device_malloc(std::size_t bytes, int device);

// cudaFree of a pointer from device_malloc(…, device); nullptr is a no-op. Throws on failure, so
// a destructor calling it should catch.
void device_free(void* ptr, int device);

// Copies of `bytes` bytes on the device's compute stream (stream.h), ordered after the kernels
// queued there. device_to_host returns when the data is on the host; host_to_device returns when
// the source may be reused; device_to_device returns at once. `device` holds the device-side
// pointer(s) (both of them for device_to_device). Throw loom::Error naming the call and device.
// device_to_host, having waited for the device, also reports a kernel's failed check
// (device_checks.h), as synchronize() does.
void copy_host_to_device(void* device_dst, const void* host_src, std::size_t bytes, int device);
void copy_device_to_host(void* host_dst, const void* device_src, std::size_t bytes, int device);
void copy_device_to_device(void* device_dst, const void* device_src, std::size_t bytes, int device);

// Makes `device` current for the calling thread for one scope and restores the previous device.
// Throws loom::Error when the device does not exist.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

namespace detail {
// Throws loom::Error for a failed CUDA call: `call` is its source text, `device` the device it
// ran on (-1: ask cudaGetDevice). Also clears the runtime's last-error slot, so a later
// LOOM_CUDA_CHECK(cudaGetLastError()) does not report this failure a second time.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, int device,
                                   const char* file, int line);
}  // namespace detail

}  // namespace loom::cuda

// Evaluates `expr` (a CUDA runtime call returning cudaError_t) once; on anything but cudaSuccess
// throws loom::Error naming the call, the error name and text, and the current device.
#define LOOM_CUDA_CHECK(expr)                                                                   \
  do {                                                                                          \
    const cudaError_t loom_cuda_status_ = (expr);                                               \
    if (loom_cuda_status_ != cudaSuccess) [[unlikely]] {                                        \
      ::loom::cuda::detail::throw_cuda_error(loom_cuda_status_, #expr, -1, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)

// Same, for a call made on a known device (reported as cuda:<device>).
#define LOOM_CUDA_CHECK_ON(expr, device)                                                   \
  do {                                                                                     \
    const cudaError_t loom_cuda_status_ = (expr);                                          \
    if (loom_cuda_status_ != cudaSuccess) [[unlikely]] {                                   \
      ::loom::cuda::detail::throw_cuda_error(loom_cuda_status_, #expr, (device), __FILE__, \
                                             __LINE__);                                    \
    }                                                                                      \
  } while (0)
