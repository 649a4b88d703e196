// The CUDA build path end to end: runtime wrappers, a kernel compiled by nvcc through
// cuda_library, and the error messages. Tests that need a GPU skip with the reason on machines
// without one; the rest run everywhere.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/smoke_kernel.h"
#include "tensor/tensor.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::cuda {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing::error_of;
using testing::random_floats;

// Frees on scope exit, so a failed assertion does not leak device memory.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t bytes, int device)
      : ptr_(device_malloc(bytes, device)), device_(device) {}
  ~DeviceBuffer() { device_free(ptr_, device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_;
  int device_;
};

// ---- everywhere -------------------------------------------------------------------------------

TEST(CudaRuntimeTest, DeviceCountAgreesWithAvailability) {
  const int count = device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(available(), count > 0);
  if (available()) {
    EXPECT_EQ(unavailable_reason(), "");
  } else if (!kernels_built()) {
    EXPECT_EQ(unavailable_reason(), kCpuOnlyBuild);  // --config=cpu: no probe at all
  } else {
    // Names the probe and what it said, e.g. "no CUDA device: cudaGetDeviceCount returned
    // cudaErrorNoDevice (no CUDA-capable device is detected)".
    EXPECT_THAT(unavailable_reason(), HasSubstr("cudaGetDeviceCount"));
    EXPECT_NE(unavailable_reason().find("no "), std::string::npos) << unavailable_reason();
  }
}

TEST(CudaRuntimeTest, DeviceMallocOnAMissingDeviceNamesTheDeviceAndTheCount) {
  const int missing = device_count();  // one past the last device: 0 on a CPU-only machine
  const std::string message = error_of([&] { device_malloc(1024, missing); });
  EXPECT_THAT(message, AllOf(StartsWith("device_malloc: there is no CUDA device cuda:" +
                                        std::to_string(missing)),
                             HasSubstr("this process sees " + std::to_string(missing))));
  if (!available()) {
    EXPECT_THAT(message, HasSubstr(unavailable_reason()));
  }
}

TEST(CudaRuntimeTest, CheckMacroNamesTheCallTheErrorAndTheDevice) {
  const std::string message = error_of([] { LOOM_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_THAT(message, AllOf(StartsWith("CUDA call cudaErrorInvalidValue failed on "),
                             HasSubstr("cudaErrorInvalidValue (invalid argument)"),
                             HasSubstr("cuda_smoke_test.cc:")));
  const std::string on_device =
      error_of([] { LOOM_CUDA_CHECK_ON(cudaErrorInvalidDevicePointer, 3); });
  EXPECT_THAT(on_device, HasSubstr("failed on cuda:3: cudaErrorInvalidDevicePointer"));
}

TEST(CudaRuntimeTest, NullAndEmptyOperationsAreNoOps) {
  EXPECT_NO_THROW(device_free(nullptr, 0));
  if (!kernels_built()) GTEST_SKIP() << kCpuOnlyBuild;
  EXPECT_NO_THROW(axpy_on_device(2.0f, nullptr, nullptr, 0, nullptr));
}

TEST(CudaSmokeKernelTest, NegativeLengthThrowsBeforeTouchingTheDevice) {
  if (!kernels_built()) GTEST_SKIP() << kCpuOnlyBuild;
  EXPECT_THAT(error_of([] { axpy_on_device(1.0f, nullptr, nullptr, -3, nullptr); }),
              HasSubstr("axpy_on_device: n must be >= 0, got -3"));
}

// In a CPU-only build (--config=cpu) every GPU entry point fails naming the flag: a CUDA tensor,
// and a kernel reached some other way.
TEST(CudaRuntimeTest, CpuOnlyBuildNamesTheFlag) {
  if (kernels_built()) GTEST_SKIP() << "this build has CUDA kernels (built without --config=cpu)";
  EXPECT_THAT(error_of([] { Tensor::empty({4}, kFloat32, Device::cuda()); }),
              HasSubstr(kCpuOnlyBuild));
  EXPECT_THAT(error_of([] { axpy_on_device(1.0f, nullptr, nullptr, 4, nullptr); }),
              AllOf(HasSubstr("CUDA kernel axpy_on_device"), HasSubstr("--config=cpu")));
}

// ---- on a GPU ---------------------------------------------------------------------------------

TEST(CudaSmokeKernelTest, AxpyMatchesTheHostBitForBit) {
  LOOM_SKIP_WITHOUT_CUDA();
  // More elements than one grid covers (4096 blocks x 256 threads), and not a multiple of the
  // block size, so the grid-stride loop and the tail both run.
  const std::int64_t n = 3 * 1024 * 1024 + 5;
  const float a = 1.37f;
  const std::vector<float> x = random_floats(n, 1234, -4.0f, 4.0f);
  const std::vector<float> y = random_floats(n, 5678, -4.0f, 4.0f);
  const std::size_t bytes = n * sizeof(float);

  DeviceBuffer dx(bytes, 0);
  DeviceBuffer dy(bytes, 0);
  copy_host_to_device(dx.floats(), x.data(), bytes, 0);
  copy_host_to_device(dy.floats(), y.data(), bytes, 0);
  {
    DeviceGuard on_device(0);
    axpy_on_device(a, dx.floats(), dy.floats(), n, nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> result(n);
  copy_device_to_host(result.data(), dy.floats(), bytes, 0);

  int mismatches = 0;
  for (std::int64_t i = 0; i < n && mismatches < 10; ++i) {
    const float expected = std::fma(a, x[i], y[i]);
    EXPECT_EQ(result[i], expected) << "at i=" << i << ": x=" << x[i] << " y=" << y[i];
    if (result[i] != expected) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);

  // device_to_device: a second buffer holds the same bits.
  DeviceBuffer dz(bytes, 0);
  copy_device_to_device(dz.floats(), dy.floats(), bytes, 0);
  std::vector<float> copied(n);
  copy_device_to_host(copied.data(), dz.floats(), bytes, 0);
  EXPECT_EQ(copied, result);
}

TEST(CudaRuntimeTest, AbsurdAllocationThrowsNamingTheSize) {
  LOOM_SKIP_WITHOUT_CUDA();
  const std::size_t absurd = std::size_t{1} << 60;  // 1 EiB
  const std::string message = error_of([&] { device_malloc(absurd, 0); });
  EXPECT_THAT(message, AllOf(StartsWith("device_malloc: cudaMalloc of 1152921504606846976 bytes "
                                        "(1.00 EiB) on cuda:0 failed: "),
                             HasSubstr("cudaErrorMemoryAllocation")));
  // The failure was reported once and cleared: the next launch check does not see it again.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* small = device_malloc(256, 0);
  EXPECT_NE(small, nullptr);
  device_free(small, 0);
}

}  // namespace
}  // namespace loom::cuda
