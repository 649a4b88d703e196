// The caching allocator. BlockPool's bookkeeping (rounding, pools, splitting, merging, reuse,
// release, stats, out-of-memory retry) runs everywhere over a fake RawAllocator that hands out
// addresses it never dereferences; the device cases (CUDA Storage goes through the pool) skip
// without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>

#include "base/error.h"
#include "tensor/cuda/block_pool.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace loom::cuda {
namespace {

using loom::testing::error_of;
using ::testing::HasSubstr;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

// Addresses from a counter, a capacity to run out of, and a record of what is live.
class FakeAllocator final : public RawAllocator {
 public:
  explicit FakeAllocator(std::size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  void* allocate(std::size_t bytes) override {
    LOOM_CHECK(used_ + bytes <= capacity_, "fake: out of memory ({} used, {} asked)", used_, bytes);
    void* ptr = reinterpret_cast<void*>(next_);
    next_ += bytes + 4096;  // a gap, so segments are never adjacent
    used_ += bytes;
    live_[ptr] = bytes;
    ++allocations;
    return ptr;
  }
  void free(void* ptr) override {
    auto it = live_.find(ptr);
    LOOM_CHECK(it != live_.end(), "fake: double free");
    used_ -= it->second;
    live_.erase(it);
    ++frees;
  }
  std::string name() const override { return "fake:0"; }
  std::size_t live_bytes() const { return used_; }

  int allocations = 0;
  int frees = 0;

 private:
  std::size_t capacity_;
  std::uintptr_t next_ = 0x100000;
  std::size_t used_ = 0;
  std::map<void*, std::size_t> live_;
};

char* as_bytes(void* p) { return static_cast<char*>(p); }

TEST(BlockPoolTest, RoundsToFiveHundredTwelveBytesAndPicksSegments) {
  EXPECT_EQ(BlockPool::round_size(1), 512u);
  EXPECT_EQ(BlockPool::round_size(512), 512u);
  EXPECT_EQ(BlockPool::round_size(513), 1024u);
  EXPECT_EQ(BlockPool::segment_size(512), 2 * kMiB);
  EXPECT_EQ(BlockPool::segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(BlockPool::segment_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(BlockPool::segment_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(BlockPool::segment_size(11 * kMiB + 1), 12 * kMiB);
}

TEST(BlockPoolTest, ZeroBytesIsNullWithoutTouchingTheAllocator) {
  FakeAllocator raw;
  BlockPool pool(raw);
  EXPECT_EQ(pool.allocate(0), nullptr);
  pool.free(nullptr);
  EXPECT_EQ(raw.allocations, 0);
}

TEST(BlockPoolTest, SmallBlocksShareOneSegmentBackToBack) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* a = pool.allocate(100);
  void* b = pool.allocate(1000);
  void* c = pool.allocate(512);
  EXPECT_EQ(raw.allocations, 1);  // one 2 MiB segment serves all three
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 512);
  EXPECT_EQ(as_bytes(c), as_bytes(b) + 1024);
  const AllocatorStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 512u + 1024u + 512u);
  EXPECT_EQ(s.requested_bytes, 100u + 1000u + 512u);
  EXPECT_EQ(s.reserved_bytes, 2 * kMiB);
  EXPECT_EQ(s.active_blocks, 3);
  EXPECT_EQ(s.segments, 1);
}

TEST(BlockPoolTest, FreedBlockIsReusedWithoutANewSegment) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* a = pool.allocate(3 * kMiB);
  pool.free(a);
  void* b = pool.allocate(3 * kMiB);
  EXPECT_EQ(a, b);
  EXPECT_EQ(raw.allocations, 1);
  EXPECT_EQ(pool.stats().allocations, 2);
  EXPECT_EQ(pool.stats().raw_allocations, 1);
}

TEST(BlockPoolTest, SmallAndLargeRequestsUseSeparatePools) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* large = pool.allocate(2 * kMiB);  // 20 MiB segment, split: 18 MiB stays free (large)
  void* small = pool.allocate(4 * kKiB);  // must not come from the large segment's remainder
  EXPECT_EQ(raw.allocations, 2);
  EXPECT_EQ(pool.stats().reserved_bytes, 22 * kMiB);
  EXPECT_TRUE(as_bytes(small) < as_bytes(large) || as_bytes(small) >= as_bytes(large) + 20 * kMiB);
}

TEST(BlockPoolTest, BestFitTakesTheSmallestFreeBlockThatHolds) {
  FakeAllocator raw;
  BlockPool pool(raw);
  // Three separate large segments (each request >= 10 MiB gets its own, unsplit).
  void* big = pool.allocate(16 * kMiB);
  void* mid = pool.allocate(12 * kMiB);
  void* top = pool.allocate(30 * kMiB);
  pool.free(big);
  pool.free(mid);
  pool.free(top);
  EXPECT_EQ(pool.allocate(11 * kMiB), mid);
  EXPECT_EQ(pool.allocate(13 * kMiB), big);
  EXPECT_EQ(raw.allocations, 3);
}

TEST(BlockPoolTest, LargeRemainderIsSplitOffAndMergedBackOnFree) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* a = pool.allocate(4 * kMiB);  // 20 MiB segment: 4 MiB block + 16 MiB free remainder
  void* b = pool.allocate(8 * kMiB);  // from the remainder: 8 MiB + 8 MiB free
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 4 * kMiB);
  EXPECT_EQ(raw.allocations, 1);
  pool.free(a);
  pool.free(b);
  // All three pieces merged: a 20 MiB request would need a new segment (>= 10 MiB requests get
  // their own size), but a 19 MiB one fits the merged block at the segment's start.
  EXPECT_EQ(pool.allocate(19 * kMiB), a);
  EXPECT_EQ(raw.allocations, 1);
}

TEST(BlockPoolTest, SmallRemainderBelowOneMebibyteStaysWithTheLargeBlock) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* a = pool.allocate(12 * kMiB + 512);  // segment 14 MiB; 2 MiB - 512 left: > 1 MiB, split
  EXPECT_EQ(pool.stats().allocated_bytes, 12 * kMiB + 512);
  pool.free(a);
  // The merged 14 MiB block fits; the ~0.5 MiB left over is too small to split off a large block.
  void* b = pool.allocate(13 * kMiB + 512 * 1025);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.stats().allocated_bytes, 14 * kMiB);
  EXPECT_EQ(raw.allocations, 1);
  pool.free(b);
}

TEST(BlockPoolTest, ReleaseCachedReturnsOnlyWholeFreeSegments) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* keep = pool.allocate(1000);       // small segment stays in use
  void* gone = pool.allocate(12 * kMiB);  // own 12 MiB segment
  pool.free(gone);
  EXPECT_EQ(pool.release_cached(), 12 * kMiB);
  EXPECT_EQ(raw.live_bytes(), 2 * kMiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * kMiB);
  EXPECT_EQ(pool.stats().segments, 1);
  pool.free(keep);
  EXPECT_EQ(pool.release_cached(), 2 * kMiB);
  EXPECT_EQ(raw.live_bytes(), 0u);
  EXPECT_EQ(raw.frees, 2);
}

TEST(BlockPoolTest, PeakFollowsTheHighWaterMarkUntilReset) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* a = pool.allocate(12 * kMiB);
  void* b = pool.allocate(12 * kMiB);
  pool.free(a);
  pool.free(b);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 24 * kMiB);
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 24 * kMiB);  // still held as cache
  void* c = pool.allocate(512);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 512u);
  pool.free(c);
}

TEST(BlockPoolTest, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeAllocator raw(/*capacity=*/30 * kMiB);
  BlockPool pool(raw);
  pool.free(pool.allocate(20 * kMiB));  // cached, unused
  void* p = pool.allocate(24 * kMiB);   // does not fit beside the cache; fits after releasing it
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(pool.stats().cache_flushes, 1);
  EXPECT_EQ(pool.stats().reserved_bytes, 24 * kMiB);
  EXPECT_EQ(raw.frees, 1);
}

TEST(BlockPoolTest, OutOfMemoryWithNothingCachedNamesRequestAndState) {
  FakeAllocator raw(/*capacity=*/16 * kMiB);
  BlockPool pool(raw);
  void* held = pool.allocate(12 * kMiB);
  const std::string message = error_of([&] { pool.allocate(12 * kMiB); });
  EXPECT_THAT(message,
              HasSubstr("caching allocator on fake:0: cannot allocate a segment of 12.00 MiB"));
  EXPECT_THAT(message, HasSubstr("fake: out of memory"));
  EXPECT_THAT(message, HasSubstr("allocated 12.00 MiB"));
  pool.free(held);
}

TEST(BlockPoolTest, FreeOfAForeignOrFreedPointerIsAnError) {
  FakeAllocator raw;
  BlockPool pool(raw);
  void* a = pool.allocate(512);
  pool.free(a);
  EXPECT_THAT(error_of([&] { pool.free(a); }),
              HasSubstr("did not hand out (or already took back)"));
  int local = 0;
  EXPECT_THAT(error_of([&] { pool.free(&local); }), HasSubstr("caching allocator on fake:0"));
}

TEST(BlockPoolTest, ManyInterleavedAllocationsKeepTheBooksBalanced) {
  FakeAllocator raw;
  BlockPool pool(raw);
  std::vector<void*> live;
  std::size_t expected = 0;
  for (int i = 0; i < 400; ++i) {
    const std::size_t bytes = 1 + (static_cast<std::size_t>(i) * 7919u) % (3 * kMiB);
    live.push_back(pool.allocate(bytes));
    expected += BlockPool::round_size(bytes);
    if (live.size() > 8) {  // a sliding window of live blocks, as a training step's temporaries
      pool.free(live.front());
      live.erase(live.begin());
    }
  }
  for (void* p : live) pool.free(p);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().active_blocks, 0);
  // Reuse: the pool holds a small multiple of the window (8 x <= 3 MiB), not the ~600 MiB asked.
  EXPECT_LT(pool.stats().reserved_bytes * 4, expected);
  pool.release_cached();
  EXPECT_EQ(raw.live_bytes(), 0u);
}

// ---- the device allocator ----------------------------------------------------------------------

TEST(CachingAllocatorTest, NoGpuErrorNamesTheReason) {
  if (available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU error path";
  EXPECT_THAT(error_of([] { cached_malloc(1024, 0); }),
              HasSubstr("cached_malloc: there is no CUDA device cuda:0; this process sees 0"));
  EXPECT_EQ(cached_malloc(0, 0), nullptr);  // nothing to allocate: no device needed
}

TEST(CachingAllocatorTest, TensorsReuseFreedDeviceMemory) {
  LOOM_SKIP_WITHOUT_CUDA();
  empty_cache();
  { Tensor warm = Tensor::empty({1000, 1000}, kFloat32, Device::cuda(0)); }
  const AllocatorStats before = allocator_stats(0);
  for (int i = 0; i < 10; ++i) {
    Tensor t = Tensor::empty({1000, 1000}, kFloat32, Device::cuda(0));
  }
  const AllocatorStats after = allocator_stats(0);
  EXPECT_EQ(after.raw_allocations, before.raw_allocations);  // no cudaMalloc
  EXPECT_EQ(after.allocations, before.allocations + 10);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.reserved_bytes, std::size_t{4000000});
  reset_peak_stats(0);
  EXPECT_EQ(allocator_stats(0).peak_allocated_bytes, allocator_stats(0).allocated_bytes);
  EXPECT_GT(empty_cache(), 0u);
  EXPECT_LT(allocator_stats(0).reserved_bytes, after.reserved_bytes);
}

}  // namespace
}  // namespace loom::cuda
