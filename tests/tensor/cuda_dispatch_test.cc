// Device routing of the plain ops (tensor/op_device.h). Mixed-device errors run everywhere: a
// CUDA tensor with no elements needs no GPU (its storage is empty). CPU scalars joining GPU
// operands need a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tensor/op_device.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom {
namespace {

using testing::error_of;
using ::testing::HasSubstr;

Tensor empty_on_gpu(const Shape& shape) { return Tensor::empty(shape, kFloat32, Device::cuda(0)); }

TEST(CudaDispatchTest, MixedDevicesNameTheOpAndBothDevices) {
  const Tensor cpu = ops::zeros({0});
  const Tensor gpu = empty_on_gpu({0});
  const std::string message = error_of([&] { ops::add(cpu, gpu); });
  EXPECT_THAT(message, HasSubstr("add: expected all tensors on one device, got cpu (operand 0: "
                                 "Tensor(shape=(0,), dtype=f32, device=cpu)) and cuda:0 (operand "
                                 "1: Tensor(shape=(0,), dtype=f32, device=cuda:0))"));
  EXPECT_THAT(error_of([&] { ops::where(cpu, gpu, gpu); }),
              HasSubstr("where: expected all tensors on one device"));
  EXPECT_THAT(error_of([&] { ops::mul(gpu, cpu); }), HasSubstr("got cuda:0 (operand 0"));
}

TEST(CudaDispatchTest, TwoGpusAreTwoDevices) {
  const Tensor a = empty_on_gpu({0});
  const Tensor b = Tensor::empty({0}, kFloat32, Device::cuda(1));
  EXPECT_THAT(error_of([&] { ops::sub(a, b); }), HasSubstr("got cuda:0 (operand 0"));
  EXPECT_THAT(error_of([&] { ops::sub(a, b); }), HasSubstr("and cuda:1 (operand 1"));
}

TEST(CudaDispatchTest, CpuScalarsFollowTheOtherOperands) {
  const Tensor scalar = ops::scalar_tensor(2.0);
  const Tensor gpu = empty_on_gpu({0});
  EXPECT_EQ(op_device("add", {scalar, gpu}), Device::cuda(0));
  EXPECT_EQ(op_device("add", {gpu, scalar}), Device::cuda(0));
  EXPECT_EQ(op_device("add", {scalar, scalar}), Device::cpu());
  EXPECT_EQ(op_device("add", {Tensor(), gpu}), Device::cuda(0));  // undefined operands skipped
  // A 1-element (not 0-dim) CPU tensor is not a scalar.
  EXPECT_THAT(error_of([&] {
                op_device("add", {ops::ones({1}), gpu});
              }),
              HasSubstr("add: expected all tensors on one device"));
}

TEST(CudaDispatchTest, CpuScalarIsCopiedToTheGpu) {
  LOOM_SKIP_WITHOUT_CUDA();
  const Tensor gpu = ops::to(ops::from_vector({1, 2, 3}, {3}), Device::cuda(0));
  const Tensor sum = ops::add(gpu, ops::scalar_tensor(10.0));
  EXPECT_TRUE(sum.device().is_cuda());
  EXPECT_EQ(ops::to_vector(sum), (testing::Values{11, 12, 13}));
  EXPECT_EQ(ops::to_vector(ops::masked_fill(
                gpu, ops::to(ops::from_vector({1, 0, 1}, {3}), Device::cuda(0)), -1.0)),
            (testing::Values{-1, 2, -1}));
}

TEST(CudaDispatchTest, NoGpuErrorNamesTheReason) {
  if (cuda::available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU error path";
  EXPECT_THAT(error_of([] { ops::to(ops::ones({4}), Device::cuda(0)); }),
              HasSubstr("there is no CUDA device cuda:0; this process sees 0 CUDA devices"));
}

}  // namespace
}  // namespace loom
