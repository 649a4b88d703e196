// Checks a kernel makes on the device and the host reports at its next synchronization
// (tensor/cuda/device_checks.h). PendingChecks' bookkeeping runs everywhere; the ops' cases
// (embedding and cross entropy with a bad index or target: the op returns, the next wait for the
// device throws the host check's message) skip without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cuda/device_checks.h"
#include "tensor/cuda/pending_checks.h"
#include "tensor/cuda/stream.h"
#include "tensor/ops.h"
#include "tests/tensor/cuda_test_util.h"

namespace loom {
namespace {

using cuda::PendingChecks;
using loom::testing::error_of;
using loom::testing::gpu;
using loom::testing::random_tensor;
using ::testing::HasSubstr;

constexpr int64_t kOk = PendingChecks::kNoFailure;

PendingChecks::Describe named(const std::string& name, int* calls = nullptr) {
  return [name, calls](int64_t position) {
    if (calls != nullptr) ++*calls;
    return name + " failed at " + std::to_string(position);
  };
}

TEST(PendingChecksTest, NoFailureDescribesNothingAndFreesEverySlot) {
  PendingChecks checks(3);
  int calls = 0;
  std::vector<int> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(*checks.begin(named("c", &calls)));
  EXPECT_EQ(slots, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(checks.pending(), 3);
  EXPECT_FALSE(checks.begin(named("one too many")).has_value());
  const std::vector<int64_t> values(3, kOk);
  EXPECT_FALSE(checks.take_failure(values.data()).has_value());
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(checks.pending(), 0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(checks.begin(named("again")).has_value());
}

TEST(PendingChecksTest, TheFirstCheckBegunThatFailedIsReportedAtItsPosition) {
  PendingChecks checks(4);
  int first_calls = 0, second_calls = 0, third_calls = 0;
  const int a = *checks.begin(named("first", &first_calls));
  const int b = *checks.begin(named("second", &second_calls));
  const int c = *checks.begin(named("third", &third_calls));
  std::vector<int64_t> values(4, kOk);
  values[b] = 17;
  values[c] = 2;  // a lower position in a later check: still the later check
  const auto failure = checks.take_failure(values.data());
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->describe(failure->position), "second failed at 17");
  EXPECT_EQ(first_calls, 0);
  EXPECT_EQ(third_calls, 0);
  EXPECT_EQ(checks.pending(), 0);
  // Every slot is free again, the failed ones too.
  std::vector<int> again;
  for (int i = 0; i < 4; ++i) again.push_back(*checks.begin(named("x")));
  EXPECT_THAT(again, ::testing::UnorderedElementsAre(0, 1, 2, 3));
  (void)a;
}

TEST(PendingChecksTest, SlotsOfChecksNotPendingAreNotRead) {
  PendingChecks checks(2);
  (void)*checks.begin(named("only"));
  // Slot 1 holds a stale position from some earlier use: no pending check owns it.
  const std::vector<int64_t> values = {kOk, 5};
  EXPECT_FALSE(checks.take_failure(values.data()).has_value());
}

TEST(PendingChecksTest, CapacityMustBePositive) {
  EXPECT_THAT(error_of([] { PendingChecks checks(0); }),
              HasSubstr("capacity must be positive, got 0"));
}

class CudaDeviceChecksTest : public ::testing::Test {
 protected:
  void SetUp() override { LOOM_SKIP_WITHOUT_CUDA(); }
};

TEST_F(CudaDeviceChecksTest, EmbeddingReturnsAndTheNextWaitNamesTheBadIndex) {
  const Tensor weight = gpu(random_tensor({5, 4}, 9, kBFloat16));
  const Tensor idx = gpu(ops::from_vector_i64({1, 4, 5, 7, 0, -1}, {2, 3}));
  Tensor rows;
  ASSERT_NO_THROW(rows = ops::embedding(weight, idx));  // no synchronization, so no report yet
  const std::string message = error_of([&] { ops::to_vector(rows); });
  // The first failing position in row-major order, whatever order the threads ran in.
  EXPECT_THAT(message, HasSubstr("embedding: index 5 at position (0, 2) of indices shape (2, 3) "
                                 "is out of range for 5 embeddings (expected 0..4)"));
  EXPECT_THAT(message, HasSubstr("found on cuda:0"));
  // Reported once: the next wait finds nothing pending.
  EXPECT_NO_THROW(cuda::synchronize(0));
  // The good rows were written; the bad ones are zeros, never read out of bounds.
  const std::vector<double> actual = ops::to_vector(rows);
  const std::vector<double> table = ops::to_vector(weight);
  const std::vector<int64_t> index = {1, 4, 5, 7, 0, -1};
  for (size_t i = 0; i < index.size(); ++i) {
    for (size_t j = 0; j < 4; ++j) {
      const bool in_range = index[i] >= 0 && index[i] < 5;
      EXPECT_EQ(actual[i * 4 + j], in_range ? table[index[i] * 4 + j] : 0.0) << i << ", " << j;
    }
  }
}

TEST_F(CudaDeviceChecksTest, EmbeddingBackwardNamesTheBadIndexAtSynchronize) {
  const Tensor g = gpu(random_tensor({3, 4}, 10, kFloat32));
  const Tensor idx = gpu(ops::from_vector_i64({2, 6, 1}, {3}));
  Tensor grad;
  ASSERT_NO_THROW(grad = ops::embedding_backward(g, idx, 6));
  EXPECT_THAT(error_of([] { cuda::synchronize(0); }),
              HasSubstr("embedding_backward: index 6 at position (1,) of indices shape (3,) is "
                        "out of range for 6 embeddings (expected 0..5)"));
}

TEST_F(CudaDeviceChecksTest, CrossEntropyNamesTheBadTargetForwardAndBackward) {
  const Tensor logits = gpu(random_tensor({4, 7}, 11, kBFloat16));
  const Tensor targets = gpu(ops::from_vector_i64({0, -100, 9, 3}, {4}));
  auto result = ops::cross_entropy(logits, targets, -100, Reduction::kMean);
  EXPECT_THAT(error_of([&] { ops::to_vector(result.loss); }),
              HasSubstr("cross_entropy: target 9 at position 2 is out of range for 7 classes "
                        "(logits shape (4, 7)); expected 0..6 or ignore_index -100"));
  const Tensor grad = ops::cross_entropy_backward(gpu(ops::scalar_tensor(1.0, kFloat32)), logits,
                                                  targets, -100, Reduction::kMean);
  EXPECT_THAT(error_of([&] { ops::to_vector(grad); }),
              HasSubstr("cross_entropy_backward: target 9 at position 2 is out of range for 7 "
                        "classes"));
}

TEST_F(CudaDeviceChecksTest, MoreChecksThanSlotsBeforeAWaitStillReportTheFirstFailure) {
  const Tensor weight = gpu(random_tensor({8, 4}, 12, kFloat32));
  const Tensor good = gpu(ops::from_vector_i64({1, 2, 3}, {3}));
  const Tensor bad = gpu(ops::from_vector_i64({1, 8, 3}, {3}));
  // More checks than slots: the one that finds them all taken waits for the device first.
  for (int i = 0; i < cuda::kDeviceCheckSlots + 10; ++i) ops::embedding(weight, good);
  EXPECT_NO_THROW(cuda::synchronize(0));
  for (int i = 0; i < cuda::kDeviceCheckSlots - 1; ++i) ops::embedding(weight, good);
  ops::embedding(weight, bad);                                  // the last free slot
  EXPECT_THAT(error_of([&] { ops::embedding(weight, good); }),  // finds none free: waits
              HasSubstr("embedding: index 8 at position (1,) of indices shape (3,)"));
  EXPECT_NO_THROW(cuda::synchronize(0));
}

}  // namespace
}  // namespace loom
