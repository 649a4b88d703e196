// bf16 / f16 <-> f32 conversions (tensor/half.h), bit-exact.
//
// Expected bit patterns were computed offline with NumPy 2.4 (float32 -> float16) and
// ml_dtypes 0.5 (float32 -> bfloat16), both IEEE round-to-nearest-even casts that agree with
// PyTorch's CPU casts on every non-NaN input; they are pasted here as constants. NaN payloads
// differ between those libraries (NumPy keeps f16 payloads, PyTorch's scalar bf16 path returns
// 0x7fc0 for every NaN), so NaN is checked as "is a NaN, sign kept", plus the canonical quiet
// NaN, on which all of them agree.
//
// Beyond the tables, the rounding is checked exhaustively at every rounding boundary: for each
// pair of adjacent finite f16 (bf16) values, the float midpoint between them is exactly
// representable, so the values just below / at / just above it must round down / to the even
// neighbour / up.
#include "tensor/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace loom {
namespace {

struct Case {
  uint32_t f32_bits;
  uint16_t f16_bits;
  uint16_t bf16_bits;
};

// {float bits, float16 bits (NumPy), bfloat16 bits (ml_dtypes)}.
constexpr Case kCases[] = {
    {0x00000000u, 0x0000, 0x0000},  // 0
    {0x80000000u, 0x8000, 0x8000},  // -0
    {0x3f800000u, 0x3c00, 0x3f80},  // 1
    {0xbf800000u, 0xbc00, 0xbf80},  // -1
    {0x3f000000u, 0x3800, 0x3f00},  // 0.5
    {0x40000000u, 0x4000, 0x4000},  // 2
    {0x3eaaaaabu, 0x3555, 0x3eab},  // 1/3
    {0x40490fdbu, 0x4248, 0x4049},  // pi
    {0x3dcccccdu, 0x2e66, 0x3dcd},  // 0.1
    {0xc0200000u, 0xc100, 0xc020},  // -2.5
    {0x3a83126fu, 0x1419, 0x3a83},  // 0.001
    {0x4640e6b6u, 0x7207, 0x4641},  // 12345.678
    {0x477fe000u, 0x7bff, 0x4780},  // 65504 = f16 max
    {0x477fef00u, 0x7bff, 0x4780},  // 65519
    {0x477feffdu, 0x7bff, 0x4780},  // 65519.99 (just below the overflow threshold)
    {0x477ff000u, 0x7c00, 0x4780},  // 65520: the f16 tie between 65504 and 2^16 -> inf
    {0x47c35000u, 0x7c00, 0x47c3},  // 1e5 -> f16 inf
    {0xc7c35000u, 0xfc00, 0xc7c3},  // -1e5 -> f16 -inf
    {0x7f800000u, 0x7c00, 0x7f80},  // inf
    {0xff800000u, 0xfc00, 0xff80},  // -inf
    {0x38800000u, 0x0400, 0x3880},  // 2^-14 = smallest f16 normal
    {0x38000000u, 0x0200, 0x3800},  // 2^-15: f16 subnormal
    {0x33800000u, 0x0001, 0x3380},  // 2^-24 = smallest f16 subnormal
    {0x33000000u, 0x0000, 0x3300},  // 2^-25: tie between 0 and 2^-24 -> 0 (even)
    {0x33000001u, 0x0001, 0x3300},  // just above 2^-25 -> 2^-24
    {0x33c00000u, 0x0002, 0x33c0},  // 1.5 * 2^-24: tie between 1 and 2 -> 2 (even)
    {0x34200000u, 0x0002, 0x3420},  // 2.5 * 2^-24: tie between 2 and 3 -> 2 (even)
    {0x322bcc77u, 0x0000, 0x322c},  // 1e-8: below half the smallest f16 subnormal
    {0x3f802000u, 0x3c01, 0x3f80},  // 1 + 2^-10: one f16 ulp above 1
    {0x3f801000u, 0x3c00, 0x3f80},  // 1 + 2^-11: f16 tie -> 1 (even)
    {0x3f803000u, 0x3c02, 0x3f80},  // 1 + 3*2^-11: f16 tie -> 1 + 2^-9 (even)
    {0x45001000u, 0x6800, 0x4500},  // 2049: f16 tie -> 2048
    {0x45003000u, 0x6802, 0x4500},  // 2051: f16 tie -> 2052
    // bf16 rounding of the 16 dropped bits.
    {0x3f808000u, 0x3c04, 0x3f80},  // bf16 tie, even below -> round down
    {0x3f818000u, 0x3c0c, 0x3f82},  // bf16 tie, odd below -> round up
    {0x3f808001u, 0x3c04, 0x3f81},  // just above the tie -> up
    {0x3f807fffu, 0x3c04, 0x3f80},  // just below the tie -> down
    {0x3f817fffu, 0x3c0c, 0x3f81},
    {0xbf808000u, 0xbc04, 0xbf80},  // negative ties mirror
    {0xbf818000u, 0xbc0c, 0xbf82},
    {0x7f7fffffu, 0x7c00, 0x7f80},  // float max -> bf16 inf (rounds up past bf16 max)
    {0x7f7f7fffu, 0x7c00, 0x7f7f},  // -> bf16 max
    {0x7f7f8000u, 0x7c00, 0x7f80},  // tie between bf16 max (odd) and inf -> inf
    // Float subnormals: bf16 keeps them (no flush to zero), f16 underflows to 0.
    {0x00008000u, 0x0000, 0x0000},  // bf16 tie -> 0
    {0x00018000u, 0x0000, 0x0002},  // bf16 tie -> 2 (even)
    {0x00000001u, 0x0000, 0x0000},
    {0x007fffffu, 0x0000, 0x0080},  // largest float subnormal -> smallest bf16 normal
};

TEST(HalfTest, FloatToF16MatchesNumPy) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << std::hex << "float bits 0x" << c.f32_bits);
    EXPECT_EQ(float_to_f16(bits_float(c.f32_bits)), c.f16_bits);
  }
}

TEST(HalfTest, FloatToBf16MatchesMlDtypes) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << std::hex << "float bits 0x" << c.f32_bits);
    EXPECT_EQ(float_to_bf16(bits_float(c.f32_bits)), c.bf16_bits);
  }
}

TEST(HalfTest, KnownF16ToFloat) {
  EXPECT_EQ(f16_to_float(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
  EXPECT_EQ(f16_to_float(0x8000), 0.0f);
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7c01)));  // signalling pattern: still NaN
  EXPECT_TRUE(std::isnan(f16_to_float(0xfe00)));
  EXPECT_EQ(float_bits(f16_to_float(0x7e00)), 0x7fc00000u);  // the canonical quiet NaN
}

TEST(HalfTest, KnownBf16ToFloat) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc020), -2.5f);
  EXPECT_EQ(bf16_to_float(0x7f7f), bits_float(0x7f7f0000u));
  EXPECT_EQ(bf16_to_float(0x0001), bits_float(0x00010000u));  // bf16 subnormal
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7f81)));
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

TEST(HalfTest, NaNStaysNaNWithItsSign) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(float_to_f16(qnan), 0x7e00);
  EXPECT_EQ(float_to_bf16(qnan), 0x7fc0);
  EXPECT_EQ(float_to_f16(-qnan), 0xfe00);
  // Every NaN, quiet or signalling, any payload (including payloads living only in the low 13
  // or 16 bits that truncation would turn into infinity) must stay a NaN.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f800fffu, 0x7f801000u, 0x7fa00000u,
                        0x7fffffffu, 0x7f80ffffu, 0x7f810000u, 0xffc00000u, 0xff800001u}) {
    SCOPED_TRACE(testing::Message() << std::hex << "float bits 0x" << bits);
    const float nan = bits_float(bits);
    ASSERT_TRUE(std::isnan(nan));
    const uint16_t h = float_to_f16(nan);
    const uint16_t b = float_to_bf16(nan);
    EXPECT_TRUE(f16_is_nan(h)) << std::hex << h;
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << b;
    EXPECT_EQ(h >> 15, bits >> 31);
    EXPECT_EQ(b >> 15, bits >> 31);
    EXPECT_TRUE(std::isnan(f16_to_float(h)));
    EXPECT_TRUE(std::isnan(bf16_to_float(b)));
  }
}

// The exact value of an f16 bit pattern, from the IEEE definition (independent of half.cc).
double f16_reference(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return sign ? -magnitude : magnitude;
}

TEST(HalfTest, ExhaustiveF16RoundTrip) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = f16_to_float(h);
    const uint16_t back = float_to_f16(f);
    if (f16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      // NaN payloads normalize to the quiet NaN; the sign is kept.
      ASSERT_EQ(back, (h & 0x8000u) | 0x7e00u) << std::hex << i;
      continue;
    }
    ASSERT_EQ(back, h) << std::hex << "f16 0x" << i << " -> " << f;
    if (((h >> 10) & 0x1f) == 0x1f) {
      ASSERT_TRUE(std::isinf(f)) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(f), f16_reference(h)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h >> 15) != 0) << std::hex << i;
    }
  }
}

TEST(HalfTest, ExhaustiveBf16RoundTrip) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = bf16_to_float(b);
    ASSERT_EQ(float_bits(f), i << 16);  // bf16 is the top half of a float, by definition
    const uint16_t back = float_to_bf16(f);
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << i;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u) << std::hex << i;
      continue;
    }
    ASSERT_EQ(back, b) << std::hex << i;
  }
}

// Float just below / above x (same sign side, toward zero / away from zero for x > 0).
float below(float x) { return std::nextafter(x, 0.0f); }
float above(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }

TEST(HalfTest, F16RoundsToNearestEvenAtEveryBoundary) {
  // Adjacent positive f16 values lo = h, hi = h + 1 for h in [0, 0x7bff] (0x7bff's neighbour is
  // 0x7c00 = inf: IEEE rounds as if the next binade continued, so the midpoint 65520 is the
  // overflow threshold).
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double lo = f16_reference(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00u ? 65536.0 : f16_reference(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);  // exact: 12 significant bits
    const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(float_to_f16(static_cast<float>(lo)), h) << std::hex << h;
    ASSERT_EQ(float_to_f16(below(mid)), h) << std::hex << h;
    ASSERT_EQ(float_to_f16(mid), even) << std::hex << h;
    ASSERT_EQ(float_to_f16(above(mid)), h + 1) << std::hex << h;
    // Negative values mirror positive ones.
    ASSERT_EQ(float_to_f16(-below(mid)), 0x8000u | h) << std::hex << h;
    ASSERT_EQ(float_to_f16(-mid), 0x8000u | even) << std::hex << h;
    ASSERT_EQ(float_to_f16(-above(mid)), 0x8000u | (h + 1)) << std::hex << h;
  }
}

TEST(HalfTest, Bf16RoundsToNearestEvenAtEveryBoundary) {
  for (uint32_t h = 0; h < 0x7f80u; ++h) {
    const float lo = bits_float(h << 16);
    const float hi = bits_float((h + 1) << 16);         // 0x7f80 << 16 is inf: midpoint below
    const float mid = bits_float((h << 16) | 0x8000u);  // exact midpoint of lo and hi
    if (h + 1 < 0x7f80u) {
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + static_cast<double>(hi)) / 2);
    }
    const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(float_to_bf16(lo), h) << std::hex << h;
    ASSERT_EQ(float_to_bf16(below(mid)), h) << std::hex << h;
    ASSERT_EQ(float_to_bf16(mid), even) << std::hex << h;
    ASSERT_EQ(float_to_bf16(above(mid)), h + 1) << std::hex << h;
    ASSERT_EQ(float_to_bf16(-mid), 0x8000u | even) << std::hex << h;
    ASSERT_EQ(float_to_bf16(-above(mid)), 0x8000u | (h + 1)) << std::hex << h;
  }
}

}  // namespace
}  // namespace loom
