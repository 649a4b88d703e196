#include "parallel/ddp/bucket_assignment.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"

namespace loom::ddp {
namespace {

using ::testing::ElementsAre;

TEST(BucketAssignmentTest, ReverseOrderWithSmallFirstBucket) {
  // f32 parameters of 100 elements (400 B each); caps: first 800 B, then 1200 B. A bucket
  // closes once it reaches its cap.
  const auto buckets = assign_buckets(std::vector<ParameterInfo>(7, {100, kFloat32}),
                                      {.first_bucket_bytes = 800, .bucket_bytes = 1200});
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_THAT(buckets[0], ElementsAre(6, 5));
  EXPECT_THAT(buckets[1], ElementsAre(4, 3, 2));
  EXPECT_THAT(buckets[2], ElementsAre(1, 0));
  // One parameter larger than every cap gets a bucket of its own.
  const auto big = assign_buckets({{10, kFloat32}, {1000, kFloat32}, {10, kFloat32}}, {800, 1200});
  ASSERT_EQ(big.size(), 2u);
  EXPECT_THAT(big[0], ElementsAre(2, 1));
  EXPECT_THAT(big[1], ElementsAre(0));
}

TEST(BucketAssignmentTest, DtypesNeverShareABucket) {
  const std::vector<ParameterInfo> params{
      {10, kFloat32}, {10, kBFloat16}, {10, kFloat32}, {10, kBFloat16}};
  const auto buckets = assign_buckets(params);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_THAT(buckets[0], ElementsAre(3, 1));
  EXPECT_THAT(buckets[1], ElementsAre(2, 0));
}

TEST(BucketAssignmentTest, DefaultCapsArePyTorchs) {
  const BucketCaps caps;
  EXPECT_EQ(caps.first_bucket_bytes, 1 << 20);
  EXPECT_EQ(caps.bucket_bytes, 25 << 20);
  EXPECT_THROW(assign_buckets({{1, kFloat32}}, {0, 1}), Error);
}

}  // namespace
}  // namespace loom::ddp
