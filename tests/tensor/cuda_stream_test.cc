// The compute stream and events. GPU cases skip without a GPU; the no-GPU error runs everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/smoke_kernel.h"
#include "tensor/cuda/stream.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::cuda {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;

TEST(CudaStreamTest, NoGpuErrorNamesTheReason) {
  if (available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU error path";
  EXPECT_THAT(error_of([] { compute_stream(0); }),
              HasSubstr("compute_stream: there is no CUDA device cuda:0"));
}

TEST(CudaStreamTest, OneStreamPerDeviceAndItIsCurrent) {
  LOOM_SKIP_WITHOUT_CUDA();
  const cudaStream_t s = compute_stream(0);
  EXPECT_NE(s, nullptr);
  EXPECT_EQ(compute_stream(0), s);
  DeviceGuard guard(0);
  EXPECT_EQ(current_stream(), s);
}

TEST(CudaStreamTest, KernelsAndCopiesRunInIssueOrder) {
  LOOM_SKIP_WITHOUT_CUDA();
  constexpr int n = 1 << 20;
  std::vector<float> x(n, 1.0f), y(n, 0.0f);
  float* dx = static_cast<float*>(device_malloc(n * sizeof(float), 0));
  float* dy = static_cast<float*>(device_malloc(n * sizeof(float), 0));
  copy_host_to_device(dx, x.data(), n * sizeof(float), 0);
  copy_host_to_device(dy, y.data(), n * sizeof(float), 0);
  Event start(0, /*timing=*/true), stop(0, /*timing=*/true);
  start.record();
  for (int i = 0; i < 50; ++i) axpy_on_device(1.0f, dx, dy, n, compute_stream(0));
  stop.record();
  copy_device_to_host(y.data(), dy, n * sizeof(float), 0);  // no explicit sync: stream order
  EXPECT_EQ(y[0], 50.0f);
  EXPECT_EQ(y[n - 1], 50.0f);
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GT(stop.elapsed_ms_since(start), 0.0f);
  device_free(dx, 0);
  device_free(dy, 0);
}

}  // namespace
}  // namespace loom::cuda
