// The multi-tensor ops (tensor/ops_foreach.h). On the CPU they are the per-tensor ops bit for
// bit; on a meta trace for a GPU they allocate what the kernels do; the CUDA cases (many tensors
// per launch, more than one launch, empty, bf16 and strided tensors among them) compare with the
// CPU and skip without a GPU.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tests/tensor/cuda_test_util.h"

namespace loom {
namespace {

using namespace ::loom::testing;  // NOLINT(build/namespaces): the comparison helpers
using ::testing::HasSubstr;

// Tensors of many sizes (an empty one, one over a chunk of 4096 elements, one over 64 chunks),
// a bf16 one and a strided view: both paths of each op.
std::vector<Tensor> assorted_tensors(int count) {
  std::vector<Tensor> tensors;
  for (int i = 0; i < count; ++i) {
    const int64_t n = i == 3 ? 0 : i == 5 ? 70001 : i == 8 ? 4097 : 1 + 37 * i;
    tensors.push_back(random_tensor({n}, 100 + i, kFloat32));
  }
  tensors.push_back(random_tensor({33}, 7, kBFloat16));
  tensors.push_back(ops::transpose(random_tensor({9, 13}, 8, kFloat32), 0, 1));
  return tensors;
}

std::vector<Tensor> on_gpu(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(gpu(t));
  return out;
}

TEST(ForeachTest, SumOfSquaresOnTheCpuIsThePerTensorSumBitForBit) {
  const std::vector<Tensor> tensors = assorted_tensors(12);
  const Tensor sums = ops::foreach_sum_of_squares(tensors);
  ASSERT_EQ(sums.shape(), (Shape{static_cast<int64_t>(tensors.size())}));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor x = ops::to(tensors[i], kFloat32);
    expect_bitwise_equal({.actual = ops::narrow(sums, 0, static_cast<int64_t>(i), 1),
                          .expected = ops::reshape(ops::sum(ops::mul(x, x)), {1}),
                          .what = "sum of squares " + std::to_string(i)});
  }
  EXPECT_EQ(ops::foreach_sum_of_squares({}).numel(), 0);
}

TEST(ForeachTest, MulOnTheCpuIsMulBitForBit) {
  const std::vector<Tensor> tensors = assorted_tensors(6);
  std::vector<Tensor> expected, actual;
  for (const Tensor& t : tensors) {
    expected.push_back(ops::clone(t));
    actual.push_back(ops::clone(t));
  }
  actual.back() = ops::transpose(ops::clone(ops::transpose(tensors.back(), 0, 1)), 0, 1);
  for (const Tensor& t : expected) ops::mul_(t, 0.37);
  ops::foreach_mul_(actual, 0.37);
  for (size_t i = 0; i < tensors.size(); ++i) {
    expect_bitwise_equal(
        {.actual = actual[i], .expected = expected[i], .what = "mul_ " + std::to_string(i)});
  }
}

TEST(ForeachTest, TensorsOnTwoDevicesAreNamed) {
  const std::vector<Tensor> mixed = {ops::zeros({2}), ops::empty({2}, kFloat32, Device::meta())};
  EXPECT_THAT(error_of([&] { ops::foreach_sum_of_squares(mixed); }),
              HasSubstr("foreach_sum_of_squares: tensor 0 is on cpu and tensor 1 on meta"));
  EXPECT_THAT(error_of([&] { ops::foreach_mul_(mixed, 2.0); }),
              HasSubstr("foreach_mul_: tensor 0 is on cpu and tensor 1 on meta"));
}

TEST(ForeachTest, ATraceForAGpuAllocatesTheSumsAndAChunkScratchOnly) {
  // 3 f32 tensors of 4096, 4097 and 1 elements: 1 + 2 + 1 chunks of scratch, 3 sums; no
  // per-tensor squares as the CPU's composition makes.
  const std::vector<Tensor> tensors = {ops::empty({4096}, kFloat32, Device::meta()),
                                       ops::empty({4097}, kFloat32, Device::meta()),
                                       ops::empty({1}, kFloat32, Device::meta())};
  MetaTargetGuard gpu_like(Device::cuda(0));
  MemoryTracker tracker;
  ScopedMemoryTracker scope(tracker);
  {
    const Tensor sums = ops::foreach_sum_of_squares(tensors);
    EXPECT_EQ(sums.shape(), (Shape{3}));
  }
  EXPECT_EQ(tracker.stats().allocations, 2);
  EXPECT_EQ(tracker.stats().peak_bytes, (3 + 4) * 4);
  // The CPU's composition: a square per tensor, its sum, the reshaped sums and their cat.
  MetaTargetGuard cpu_like(Device::cpu());
  MemoryTracker composed;
  ScopedMemoryTracker composed_scope(composed);
  ops::foreach_sum_of_squares(tensors);
  EXPECT_GT(composed.stats().allocations, 2);
}

TEST(ForeachTest, ScalingOnATraceForAGpuAllocatesNothing) {
  // The kernel scales in place; the CPU's mul_ on a GPU makes a temporary per tensor.
  const std::vector<Tensor> tensors = {ops::empty({4096}, kFloat32, Device::meta()),
                                       ops::empty({3}, kFloat32, Device::meta())};
  MetaTargetGuard gpu_like(Device::cuda(0));
  MemoryTracker tracker;
  ScopedMemoryTracker scope(tracker);
  ops::foreach_mul_(tensors, 0.5);
  EXPECT_EQ(tracker.stats().allocations, 0);
}

TEST(ForeachTest, ToOnTheCpuIsToBitForBit) {
  const std::vector<Tensor> tensors = assorted_tensors(6);
  for (DType dtype : {kBFloat16, kFloat16, kFloat32}) {
    const std::vector<Tensor> got = ops::foreach_to(tensors, dtype);
    ASSERT_EQ(got.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(got[i].dtype(), dtype);
      expect_bitwise_equal({.actual = got[i],
                            .expected = ops::to(tensors[i], dtype),
                            .what = "foreach_to " + std::to_string(i)});
    }
  }
  // A tensor already of the dtype comes back as it is, as to() returns it.
  EXPECT_TRUE(ops::foreach_to(tensors, kFloat32)[0].is_same(tensors[0]));
  EXPECT_TRUE(ops::foreach_to({}, kBFloat16).empty());
}

TEST(ForeachTest, CastsOnATraceForAGpuAllocateTheirOutputsOnly) {
  const std::vector<Tensor> tensors = {ops::empty({4097}, kFloat32, Device::meta()),
                                       ops::empty({3}, kFloat32, Device::meta())};
  MetaTargetGuard gpu_like(Device::cuda(0));
  MemoryTracker tracker;
  ScopedMemoryTracker scope(tracker);
  const std::vector<Tensor> got = ops::foreach_to(tensors, kBFloat16);
  EXPECT_EQ(got[0].shape(), (Shape{4097}));
  EXPECT_EQ(got[1].dtype(), kBFloat16);
  EXPECT_EQ(tracker.stats().allocations, 2);
  EXPECT_EQ(tracker.stats().peak_bytes, (4097 + 3) * 2);
}

class CudaForeachTest : public ::testing::Test {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_CUDA(); }
};

TEST_F(CudaForeachTest, SumOfSquaresOfManyTensorsMatchesTheCpu) {
  // 70 f32 tensors: two launches of at most 64, and the bf16 and strided ones composed.
  const std::vector<Tensor> tensors = assorted_tensors(70);
  const Tensor expected = ops::foreach_sum_of_squares(tensors);
  const Tensor actual = ops::foreach_sum_of_squares(on_gpu(tensors));
  EXPECT_TRUE(actual.device().is_cuda());
  // Sums of up to 70001 squares in another order: f32 rounding of long sums.
  expect_close({.actual = actual,
                .expected = expected,
                .tol = kernel_tolerance(kFloat32, 10.0),
                .what = "foreach_sum_of_squares"});
  // Deterministic: the same bits again.
  expect_bitwise_equal({.actual = ops::foreach_sum_of_squares(on_gpu(tensors)),
                        .expected = actual,
                        .what = "foreach_sum_of_squares again"});
}

TEST_F(CudaForeachTest, MulOfManyTensorsIsTheCpusMulBitForBit) {
  const std::vector<Tensor> tensors = assorted_tensors(70);
  std::vector<Tensor> expected;
  for (const Tensor& t : tensors) expected.push_back(ops::clone(t));
  ops::foreach_mul_(expected, -1.75e-3);
  const std::vector<Tensor> actual = on_gpu(tensors);
  ops::foreach_mul_(actual, -1.75e-3);
  for (size_t i = 0; i < tensors.size(); ++i) {
    expect_bitwise_equal({.actual = ops::to(actual[i], Device::cpu()),
                          .expected = expected[i],
                          .what = "foreach_mul_ " + std::to_string(i)});
  }
}

// Mixed precision's casts of every weight at a forward's start: 70 tensors (two launches of at
// most 64; empty, bf16 and strided ones composed), to bf16 and f16, the CPU's to() bit for bit.
TEST_F(CudaForeachTest, ToOfManyTensorsIsTheCpusToBitForBit) {
  const std::vector<Tensor> tensors = assorted_tensors(70);
  for (DType dtype : {kBFloat16, kFloat16}) {
    const std::vector<Tensor> got = ops::foreach_to(on_gpu(tensors), dtype);
    ASSERT_EQ(got.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_TRUE(got[i].device().is_cuda());
      expect_bitwise_equal({.actual = ops::to(got[i], Device::cpu()),
                            .expected = ops::to(tensors[i], dtype),
                            .what = fmt::format("foreach_to {} {}", dtype_name(dtype), i)});
    }
  }
}

}  // namespace
}  // namespace loom
