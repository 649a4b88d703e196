// Counter-based RNG (tensor/rng.h): Philox4x32-10 known answers, determinism, the slice
// property DTensor initialization relies on, and distribution sanity.
#include "tensor/rng.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"
#include "tests/testing/tensor_checks.h"

namespace loom {
namespace {

using testing::error_of;
using testing::expect_close;

using Block = std::array<uint32_t, 4>;

// Known-answer vectors of Random123 1.09 (kat_vectors, "philox4x32 10 ..."): counter, key,
// expected output. The third uses the hex digits of pi as its input, as in the original file.
TEST(PhiloxTest, Random123KnownAnswers) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(PhiloxTest, EveryInputWordMatters) {
  const Block base = philox4x32({1, 2, 3, 4}, {5, 6});
  for (int w = 0; w < 4; ++w) {
    std::array<uint32_t, 4> c{1, 2, 3, 4};
    c[w] ^= 1u;
    EXPECT_NE(philox4x32(c, {5, 6}), base) << "counter word " << w;
  }
  EXPECT_NE(philox4x32({1, 2, 3, 4}, {4, 6}), base);
  EXPECT_NE(philox4x32({1, 2, 3, 4}, {5, 7}), base);
  EXPECT_EQ(philox4x32({1, 2, 3, 4}, {5, 6}), base);  // a pure function
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = ops::contiguous(t);
  std::vector<uint8_t> bytes(c.numel() * element_size(c.dtype()));
  if (!bytes.empty()) std::memcpy(bytes.data(), c.raw_data(), bytes.size());
  return bytes;
}

TEST(RngTest, DeterministicAndSeedDependent) {
  for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EXPECT_EQ(bytes_of(ops::normal({7, 5}, 42, 0, 1, dtype)),
              bytes_of(ops::normal({7, 5}, 42, 0, 1, dtype)));
    EXPECT_EQ(bytes_of(ops::uniform({7, 5}, 42, -1, 1, dtype)),
              bytes_of(ops::uniform({7, 5}, 42, -1, 1, dtype)));
  }
  // Different seeds differ (almost every element: a collision of two f32 normals is ~2^-24).
  const std::vector<double> a = ops::to_vector(ops::normal({1000}, 1));
  const std::vector<double> b = ops::to_vector(ops::normal({1000}, 2));
  const std::vector<double> c =
      ops::to_vector(ops::normal({1000}, uint64_t{1} << 32 | 1));  // high seed bits
  int same_ab = 0, same_ac = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
  }
  EXPECT_LE(same_ab, 2);
  EXPECT_LE(same_ac, 2);
  // normal and uniform with one seed use separate streams: no element-wise relation.
  const std::vector<double> u = ops::to_vector(ops::uniform({1000}, 1));
  EXPECT_NE(u, a);
  // The element depends on the global index only, so a tensor's prefix does not depend on its
  // length.
  const std::vector<double> longer = ops::to_vector(ops::normal({2000}, 1));
  EXPECT_EQ(std::vector<double>(longer.begin(), longer.begin() + 1000), a);
  // mean/std are applied after sampling: normal(m, s) == m + s * normal(0, 1), to f32 rounding.
  std::vector<double> expected;
  for (double v : a) expected.push_back(3.0 + 0.5 * v);
  expect_close({.actual = ops::normal({1000}, 1, 3.0, 0.5),
                .expected = expected,
                .tol = {.atol = 1e-5},
                .what = "normal(3, 0.5)"});
}

struct SliceCase {
  Shape global;
  Shape offset;
  Shape local;
};

// For several shapes and arbitrary regions: filling the local block alone with
// RngRegion{global, offset} equals, bit for bit, that block of the full tensor filled at once.
TEST(RngTest, SlicePropertyMatchesTheFullTensor) {
  const std::vector<SliceCase> cases = {
      {{17}, {0}, {17}},
      {{17}, {5}, {7}},
      {{17}, {16}, {1}},
      {{17}, {9}, {0}},
      {{7, 9}, {0, 0}, {3, 9}},           // row shard
      {{7, 9}, {6, 0}, {1, 9}},           // last uneven row shard
      {{7, 9}, {0, 4}, {7, 5}},           // column shard
      {{7, 9}, {2, 3}, {4, 5}},           // interior block
      {{7, 9}, {3, 8}, {4, 1}},           // single column
      {{5, 6, 7}, {1, 2, 3}, {3, 2, 4}},  // 3-D interior block
      {{5, 6, 7}, {4, 0, 0}, {1, 6, 7}},
      {{5, 6, 7}, {0, 5, 6}, {5, 1, 1}},
      {{3, 1, 4}, {1, 0, 1}, {2, 1, 2}},  // size-1 dim
  };
  const uint64_t seed = 0x123456789abcdefull;
  for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
    for (const SliceCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " global " + shape_str(c.global) + " offset " +
                   shape_str(c.offset) + " local " + shape_str(c.local));
      const RngRegion region{c.global, c.offset};
      // The same block of the full tensor, via narrow on each dim.
      auto block_of = [&](Tensor full) {
        for (size_t d = 0; d < c.global.size(); ++d) {
          full = ops::narrow(full, static_cast<int64_t>(d), c.offset[d], c.local[d]);
        }
        return full;
      };
      Tensor full_n = Tensor::empty(c.global, dtype);
      ops::normal_(full_n, seed, 0.5, 2.0);
      Tensor local_n = Tensor::empty(c.local, dtype);
      ops::normal_(local_n, seed, 0.5, 2.0, region);
      EXPECT_EQ(bytes_of(local_n), bytes_of(block_of(full_n)));

      Tensor full_u = Tensor::empty(c.global, dtype);
      ops::uniform_(full_u, seed, -3.0, 1.0);
      Tensor local_u = Tensor::empty(c.local, dtype);
      ops::uniform_(local_u, seed, -3.0, 1.0, region);
      EXPECT_EQ(bytes_of(local_u), bytes_of(block_of(full_u)));

      if (dtype == kFloat32) {
        const Tensor full_m = ops::bernoulli_keep_mask(c.global, seed, 0.3);
        const Tensor local_m = ops::bernoulli_keep_mask(c.local, seed, 0.3, region);
        EXPECT_EQ(bytes_of(local_m), bytes_of(block_of(full_m)));
      }
    }
  }
}

TEST(RngTest, ShardsTileTheFullTensor) {
  // Four uneven row x column shards of (10, 7) put back together equal the whole.
  const Shape global{10, 7};
  Tensor full = ops::normal(global, 9);
  Tensor assembled = ops::zeros(global);
  for (auto [r0, rn] : {std::pair<int64_t, int64_t>{0, 3}, {3, 7}}) {
    for (auto [c0, cn] : {std::pair<int64_t, int64_t>{0, 4}, {4, 3}}) {
      Tensor shard = Tensor::empty({rn, cn});
      ops::normal_(shard, 9, 0.0, 1.0, RngRegion{global, {r0, c0}});
      ops::copy_(ops::narrow(ops::narrow(assembled, 0, r0, rn), 1, c0, cn), shard);
    }
  }
  EXPECT_EQ(bytes_of(assembled), bytes_of(full));
}

TEST(RngTest, RegionErrors) {
  Tensor t = Tensor::empty({3, 4});
  EXPECT_EQ(error_of([&] {
              ops::normal_(t, 1, 0, 1, RngRegion{{6, 4}, {4, 0}});
            }),
            "normal_: local shape (3, 4) at offset (4, 0) does not fit in global shape (6, 4)");
  EXPECT_EQ(error_of([&] {
              ops::uniform_(t, 1, 0, 1, RngRegion{{12}, {0}});
            }),
            "uniform_: region of global shape (12,) and offset (0,) does not match the local shape "
            "(3, 4)");
  EXPECT_EQ(error_of([] { ops::normal_(Tensor::empty({2}, kInt64), 1); }),
            "normal_: expected a floating dtype (f32, bf16, f16), got i64");
  EXPECT_EQ(
      error_of([] {
        ops::normal_(ops::transpose(Tensor::empty({2, 3}), 0, 1), 1);
      }),
      "normal_: expected a contiguous tensor, got Tensor(shape=(3, 2), dtype=f32, device=cpu)");
  EXPECT_EQ(error_of([] { ops::bernoulli_keep_mask({2}, 1, 1.5); }),
            "dropout: probability must be in [0, 1], got 1.5");
}

// A tensor whose positions along a dim lie in runs of the global tensor (a context-parallel
// rank's two chunks of the sequence): its mask is the whole mask's runs, joined, bit for bit,
// for the whole local extent and for a piece of it that spans the runs' seam or sits in one.
TEST(RngTest, KeepMaskInRunsIsTheWholeMasksRunsJoined) {
  const Shape global{3, 16, 5};
  const uint64_t seed = 77;
  const Tensor whole = ops::bernoulli_keep_mask(global, seed, 0.4);
  // Local positions 0..7 are global 4..7 then 12..15 (chunks 1 and 6 of 8... as cp2 rank 1).
  RngRegion runs{global, {0, 0, 0}, /*runs_dim=*/1, {0, 4, 4, 4, 12, 4}};
  const Tensor expected =
      ops::cat(std::vector<Tensor>{ops::narrow(whole, 1, 4, 4), ops::narrow(whole, 1, 12, 4)}, 1);
  EXPECT_EQ(bytes_of(ops::bernoulli_keep_mask({3, 8, 5}, seed, 0.4, runs)),
            bytes_of(ops::contiguous(expected)));
  // Local positions 2..5 of those (a tensor-parallel rank's piece across the seam), rows 1..2.
  const RngRegion piece = region_within(runs, {3, 8, 5}, {1, 2, 0});
  EXPECT_EQ(bytes_of(ops::bernoulli_keep_mask({2, 4, 5}, seed, 0.4, piece)),
            bytes_of(ops::contiguous(ops::narrow(ops::narrow(expected, 1, 2, 4), 0, 1, 2))));
  // No positions (an empty sequence-parallel shard): an empty mask.
  EXPECT_EQ(
      ops::bernoulli_keep_mask({3, 0, 5}, seed, 0.4, region_within(runs, {3, 8, 5}, {0, 8, 0}))
          .shape(),
      (Shape{3, 0, 5}));
  // Local positions 5..7, inside the second run.
  const RngRegion inside = region_within(runs, {3, 8, 5}, {0, 5, 0});
  EXPECT_EQ(bytes_of(ops::bernoulli_keep_mask({3, 3, 5}, seed, 0.4, inside)),
            bytes_of(ops::contiguous(ops::narrow(expected, 1, 5, 3))));
}

// region_within places a piece of a block: offsets add, the block's global shape stays.
TEST(RngTest, RegionWithinComposesOffsets) {
  const RngRegion outer{{8, 6}, {4, 0}};  // a block of rows 4..7
  const RngRegion piece = region_within(outer, {4, 6}, {1, 3});
  EXPECT_EQ(piece.global_shape, (Shape{8, 6}));
  EXPECT_EQ(piece.global_offset, (Shape{5, 3}));
  const RngRegion alone = region_within({}, {4, 6}, {1, 3});  // the block is the whole
  EXPECT_EQ(alone.global_shape, (Shape{4, 6}));
  EXPECT_EQ(alone.global_offset, (Shape{1, 3}));
  const Tensor whole = ops::bernoulli_keep_mask({8, 6}, 5, 0.5);
  EXPECT_EQ(bytes_of(ops::bernoulli_keep_mask({2, 3}, 5, 0.5, piece)),
            bytes_of(ops::contiguous(ops::narrow(ops::narrow(whole, 0, 5, 2), 1, 3, 3))));
}

TEST(RngTest, RegionInRunsErrors) {
  EXPECT_EQ(error_of([] {
              region_within({{8, 6}, {6, 0}}, {4, 6}, {0, 0});
            }),
            "region_within: a tensor of shape (4, 6) at offset (6, 0) does not fit in global "
            "shape (8, 6)");
  const RngRegion runs{{2, 16}, {0, 0}, 1, {0, 4, 4, 4, 12, 4}};
  EXPECT_EQ(error_of([&] {
              region_within(runs, {2, 10}, {0, 0});
            }),
            "region_within: a tensor of shape (2, 10) at offset (0, 0) does not fit in global "
            "shape (2, 16) (dim 1: 8 positions in runs)");
  EXPECT_EQ(error_of([] {
              ops::bernoulli_keep_mask({2, 4}, 1, 0.5, {{2, 16}, {0, 0}, 1, {0, 4, 4, 2, 12, 4}});
            }),
            "RngRegion: run 1 starts at local position 2 with length 4; runs must cover the local "
            "positions from 0 in order");
  EXPECT_EQ(error_of([] {
              ops::bernoulli_keep_mask({2, 6}, 1, 0.5, {{2, 16}, {0, 4}, 1, {0, 4, 4, 4, 12, 4}});
            }),
            "bernoulli: a tensor of shape (2, 6) at local positions [4, 10) along dim 1, but the "
            "region's runs cover 4 of them");
  EXPECT_EQ(error_of([&] {
              Tensor t = Tensor::empty({2, 8});
              ops::uniform_(t, 1, 0, 1, runs);
            }),
            "uniform_: a region in runs (along dim 1) is drawn run by run; give each run's block "
            "its own region");
}

TEST(RngTest, NormalStatistics) {
  // 100k samples: the sample mean has standard error 1/sqrt(n) = 0.0032 and the sample std
  // sqrt(1/(2n)) = 0.0022; 5 sigma bounds make a false failure ~1e-6 likely (and the seed is
  // fixed, so the outcome is deterministic anyway).
  const int64_t n = 100000;
  const std::vector<double> v = ops::to_vector(ops::normal({n}, 2024, 1.5, 2.0));
  double sum = 0, sum_sq = 0;
  int beyond_3_sigma = 0;
  for (double x : v) {
    sum += x;
    const double z = (x - 1.5) / 2.0;
    sum_sq += z * z;
    beyond_3_sigma += std::abs(z) > 3;
    ASSERT_TRUE(std::isfinite(x));
  }
  const double mean = sum / n;
  const double std = std::sqrt(sum_sq / n);
  EXPECT_NEAR(mean, 1.5, 5 * 2.0 / std::sqrt(n));
  EXPECT_NEAR(std, 1.0, 5 * std::sqrt(0.5 / n));
  // P(|z| > 3) = 0.0027: expect 270 +- 5 * sqrt(270) ~ 82.
  EXPECT_NEAR(beyond_3_sigma, 270, 82);
}

TEST(RngTest, UniformRangeAndStatistics) {
  const int64_t n = 100000;
  const std::vector<double> v = ops::to_vector(ops::uniform({n}, 77, -2.0, 3.0));
  double sum = 0;
  int low_half = 0;
  for (double x : v) {
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 3.0);
    sum += x;
    low_half += x < 0.5;
  }
  // Mean of U(-2, 3) is 0.5 with sd 5 / sqrt(12 n) = 0.0046 for the sample mean; 5 sigma.
  EXPECT_NEAR(sum / n, 0.5, 5 * 5.0 / std::sqrt(12.0 * n));
  // Half below the midpoint: binomial sd sqrt(n / 4) = 158; 5 sigma.
  EXPECT_NEAR(low_half, n / 2, 5 * 158);
  // Defaults: [0, 1).
  for (double x : ops::to_vector(ops::uniform({1000}, 5))) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
}

TEST(RngTest, BernoulliKeepRate) {
  const int64_t n = 100000;
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
    SCOPED_TRACE(p);
    const std::vector<double> m = ops::to_vector(ops::bernoulli_keep_mask({n}, 11, p));
    double kept = 0;
    for (double x : m) {
      ASSERT_TRUE(x == 0.0 || x == 1.0);
      kept += x;
    }
    // Binomial(n, 1 - p): sd sqrt(n p (1 - p)) <= 158; 5 sigma, and exact at p = 0 / 1.
    EXPECT_NEAR(kept, n * (1 - p), 5 * std::sqrt(n * p * (1 - p)));
  }
  // Different seeds give different masks.
  EXPECT_NE(ops::to_vector(ops::bernoulli_keep_mask({256}, 1, 0.5)),
            ops::to_vector(ops::bernoulli_keep_mask({256}, 2, 0.5)));
  EXPECT_EQ(ops::bernoulli_keep_mask({3, 4}, 1, 0.5).dtype(), kFloat32);
}

}  // namespace
}  // namespace loom
