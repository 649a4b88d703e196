// CUDA storage for Tensor: allocation and host<->device copies (kernels: cuda_*_test.cc). The
// round trips run on a GPU and skip with the reason elsewhere; the error paths run everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom {
namespace {

using testing::error_of;
using ::testing::HasSubstr;
using testing::kAllDTypes;

TEST(CudaTensorTest, RoundTripThroughDeviceIsExact) {
  LOOM_SKIP_WITHOUT_CUDA();
  for (DType dtype : kAllDTypes) {
    const Tensor host = ops::to(ops::arange(0.0, 37.0, 1.0, kFloat32), dtype);
    const Tensor device = ops::to(host, Device::cuda(0));
    EXPECT_TRUE(device.device().is_cuda());
    EXPECT_EQ(device.dtype(), dtype);
    const Tensor device_copy = ops::clone(device);  // device-to-device
    EXPECT_EQ(ops::to_vector(ops::to(device_copy, Device::cpu())), ops::to_vector(host))
        << dtype_name(dtype);
  }
}

TEST(CudaTensorTest, NonContiguousHostTensorIsMadeContiguousBeforeUpload) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Tensor host =
      ops::transpose(ops::reshape(ops::arange(0.0, 12.0, 1.0, kFloat32), {3, 4}), 0, 1);
  const Tensor back = ops::to(ops::to(host, Device::cuda(0)), Device::cpu());
  EXPECT_EQ(ops::to_vector(back), ops::to_vector(host));
}

TEST(CudaTensorTest, AllocatingWithoutAGpuFailsWithTheReason) {
  if (cuda::available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU error path";
  EXPECT_THAT(error_of([] { Tensor::empty({4}, kFloat32, Device::cuda(0)); }), HasSubstr("cuda"));
}

}  // namespace
}  // namespace loom
