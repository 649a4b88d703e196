#include "tensor/cuda/cuda_runtime.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

#include "base/error.h"
#include "tensor/cuda/device_checks.h"
#include "tensor/cuda/human_bytes.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

// One cudaGetDeviceCount per process: the runtime's answer does not change after initialization.
struct Probe {
  cudaError_t status = cudaSuccess;
  int count = 0;
};

const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    p.status = cudaGetDeviceCount(&p.count);
    if (p.status != cudaSuccess) {
      (void)cudaGetLastError();  // do not leave the failure for a later cudaGetLastError()
      p.count = 0;
    }
    return p;
  }();
  return result;
}

// Failures that mean "this machine has no usable CUDA", as opposed to a broken call.
bool means_no_cuda(cudaError_t status) {
  return status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver ||
         status == cudaErrorStubLibrary || status == cudaErrorSystemDriverMismatch;
}

// "cudaErrorNoDevice (no CUDA-capable device is detected)"
std::string describe(cudaError_t status) {
  return fmt::format("{} ({})", cudaGetErrorName(status), cudaGetErrorString(status));
}

// CUDA encodes versions as 1000*major + 10*minor: 13000 -> "13.0".
std::string version_string(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? std::string() : fmt::format("; CUDA_VISIBLE_DEVICES=\"{}\"", visible);
}

std::string driver_note() {
  int driver = 0;
  int runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  return fmt::format("; driver: {}, runtime: CUDA {}",
                     driver == 0 ? std::string("none loaded") : "CUDA " + version_string(driver),
                     version_string(runtime));
}

}  // namespace

namespace detail {

void throw_cuda_error(cudaError_t status, const char* call, int device, const char* file,
                      int line) {
  (void)cudaGetLastError();  // clear the (non-sticky) error this call left behind
  std::string where;
  if (device >= 0) {
    where = fmt::format("cuda:{}", device);
  } else {
    int current = -1;
    const cudaError_t get_status = cudaGetDevice(&current);
    if (get_status == cudaSuccess) {
      where = fmt::format("cuda:{}", current);
    } else {
      (void)cudaGetLastError();
      where = fmt::format("an unknown device (cudaGetDevice returned {})",
                          cudaGetErrorName(get_status));
    }
  }
  throw Error(fmt::format("CUDA call {} failed on {}: {} [{}:{}]", call, where, describe(status),
                          file, line));
}

}  // namespace detail

bool kernels_built() {
#ifdef LOOM_CUDA_DISABLED
  return false;
#else
  return true;
#endif
}

int device_count() {
  if (!kernels_built()) return 0;
  const Probe& p = probe();
  if (p.status == cudaSuccess) return p.count;
  if (means_no_cuda(p.status)) return 0;
  LOOM_FAIL("device_count: cudaGetDeviceCount returned {}{}", describe(p.status),
            visible_devices_note());
}

bool available() {
  if (!kernels_built()) return false;
  const Probe& p = probe();
  return p.status == cudaSuccess && p.count > 0;
}

std::string unavailable_reason() {
  if (!kernels_built()) return kCpuOnlyBuild;
  const Probe& p = probe();
  if (p.status == cudaSuccess) {
    if (p.count > 0) return "";
    return fmt::format("no CUDA device: cudaGetDeviceCount found 0 devices{}",
                       visible_devices_note());
  }
  if (p.status == cudaErrorNoDevice) {
    return fmt::format("no CUDA device: cudaGetDeviceCount returned {}{}", describe(p.status),
                       visible_devices_note());
  }
  if (means_no_cuda(p.status)) {
    return fmt::format("no usable CUDA driver: cudaGetDeviceCount returned {}{}",
                       describe(p.status), driver_note());
  }
  return fmt::format("CUDA unavailable: cudaGetDeviceCount returned {}{}{}", describe(p.status),
                     driver_note(), visible_devices_note());
}

void check_device(int device, const char* what) {
  const int count = device_count();
  LOOM_CHECK(device >= 0 && device < count,
             "{}: there is no CUDA device cuda:{}; this process sees {} CUDA device{}{}", what,
             device, count, count == 1 ? "" : "s",
             count == 0 ? " (" + unavailable_reason() + ")" : std::string());
}

DeviceGuard::DeviceGuard(int device) {
  check_device(device, "DeviceGuard");
  LOOM_CUDA_CHECK_ON(cudaGetDevice(&previous_), device);
  if (previous_ != device) {
    LOOM_CUDA_CHECK_ON(cudaSetDevice(device), device);
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) {
    // A destructor must not throw; restoring a device that worked a moment ago does not fail
    // in practice, and if it does the next checked call reports the state.
    (void)cudaSetDevice(previous_);
  }
}

void* device_malloc(std::size_t bytes, int device) {
  check_device(device, "device_malloc");
  if (bytes == 0) return nullptr;
  DeviceGuard guard(device);
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
    (void)cudaGetLastError();
    LOOM_FAIL("device_malloc: cudaMalloc of {} bytes ({}) on cuda:{} failed: {}{}", bytes,
              human_bytes(bytes), device, describe(status),
              have_info ? fmt::format("; the device has {} free of {}", human_bytes(free_bytes),
                                      human_bytes(total_bytes))
                        : std::string());
  }
  return ptr;
}

void device_free(void* ptr, int device) {
  if (ptr == nullptr) return;
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK_ON(cudaFree(ptr), device);
}

// Copies run on the device's compute stream (stream.h), after every kernel queued before them.
void copy_host_to_device(void* device_dst, const void* host_src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  DeviceGuard guard(device);
  // From pageable memory this returns once the source is staged, so the caller may reuse it.
  LOOM_CUDA_CHECK_ON(
      cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, compute_stream(device)),
      device);
}

void copy_device_to_host(void* host_dst, const void* device_src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  {
    DeviceGuard guard(device);
    const cudaStream_t stream = compute_stream(device);
    LOOM_CUDA_CHECK_ON(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream),
                       device);
    LOOM_CUDA_CHECK_ON(cudaStreamSynchronize(stream), device);  // the host reads it next
  }
  // The host waited for the device: a kernel's failed check (device_checks.h) surfaces here.
  raise_failed_device_checks(device);
}

void copy_device_to_device(void* device_dst, const void* device_src, std::size_t bytes,
                           int device) {
  if (bytes == 0) return;
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK_ON(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice,
                                     compute_stream(device)),
                     device);
}

}  // namespace loom::cuda
