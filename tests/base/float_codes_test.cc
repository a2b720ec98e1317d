// The small float codes every format builds on: f16, bf16, OCP E4M3 and E2M1. Exhaustive where the
// code space is small (all 65,536 f16/bf16 codes, all 256 E4M3, all 16 E2M1) and at every tie
// between adjacent codes, where round-to-nearest-even is decided.
#include "base/float_codes.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

namespace kvq {
namespace {

bool IsF16Nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0; }
bool IsBf16Nan(uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0; }

TEST(F16, EveryCodeDecodesAndReencodesToItself) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t h = static_cast<uint16_t>(c);
    const float f = F16ToF32(h);
    if (IsF16Nan(h)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsF16Nan(F32ToF16(f))) << std::hex << c;
      continue;
    }
    EXPECT_EQ(F32ToF16(f), h) << std::hex << c;
  }
}

TEST(F16, DecodesKnownValues) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(F16ToF32(0x7C00)));
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
}

// Between adjacent finite codes c and c+1 (same sign), the exact midpoint (representable in f32)
// must round to the code with an even mantissa, i.e. the even code.
TEST(F16, TiesRoundToEvenAtEveryAdjacentPair) {
  for (uint32_t c = 0; c < 0x7BFF; ++c) {
    for (uint16_t sign : {0x0000, 0x8000}) {
      const uint16_t lo = static_cast<uint16_t>(c | sign), hi = static_cast<uint16_t>((c + 1) | sign);
      const float mid = (F16ToF32(lo) + F16ToF32(hi)) / 2.0f;  // exact: f32 has 13 spare bits
      ASSERT_EQ(F32ToF16(mid), (c % 2 == 0) ? lo : hi) << std::hex << c;
      // Just off the tie, the nearer code wins whatever its parity.
      ASSERT_EQ(F32ToF16(std::nextafter(mid, 0.0f)), std::fabs(F16ToF32(lo)) < std::fabs(mid) ? lo : hi);
    }
  }
}

TEST(F16, OverflowRoundsToInfinityPastTheLastTie) {
  EXPECT_EQ(F32ToF16(65519.99f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // tie between 65504 (odd) and 2^16 (even): inf
  EXPECT_EQ(F32ToF16(-1e9f), 0xFC00);
  EXPECT_EQ(F32ToF16(INFINITY), 0x7C00);
}

#ifdef __FLT16_MANT_DIG__
// g++ implements _Float16 conversion with IEEE round-to-nearest-even: an independent oracle.
TEST(F16, MatchesCompilerConversionOnRandomFloats) {
  std::mt19937 rng(3);
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(F32ToF16(f), std::bit_cast<uint16_t>(h)) << f;
  }
}
#endif

TEST(Bf16, EveryCodeDecodesAndReencodesToItself) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t b = static_cast<uint16_t>(c);
    const float f = Bf16ToF32(b);
    if (IsBf16Nan(b)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsBf16Nan(F32ToBf16(f)));
      continue;
    }
    EXPECT_EQ(F32ToBf16(f), b) << std::hex << c;
  }
}

// A bf16 code is the top half of an f32, so the midpoint of codes c and c+1 is the f32 with bits
// (c << 16) | 0x8000, for every finite c (across binade boundaries too).
TEST(Bf16, TiesRoundToEvenAtEveryAdjacentPair) {
  for (uint32_t c = 0; c < 0x7F7F; ++c) {
    for (uint32_t sign : {0x0000u, 0x8000u}) {
      const float mid = std::bit_cast<float>(((c | sign) << 16) | 0x8000u);
      const uint16_t want = static_cast<uint16_t>(((c % 2 == 0) ? c : c + 1) | sign);
      ASSERT_EQ(F32ToBf16(mid), want) << std::hex << c;
      ASSERT_EQ(F32ToBf16(std::bit_cast<float>(((c | sign) << 16) | 0x7FFFu)), c | sign);
      ASSERT_EQ(F32ToBf16(std::bit_cast<float>(((c | sign) << 16) | 0x8001u)), (c + 1) | sign);
    }
  }
}

// OCP E4M3 (e4m3fn): value = (-1)^S · 2^(E-7) · (1 + M/8) for E > 0, 2^-6 · M/8 for E = 0;
// S.1111.111 is NaN; no infinities. Written out independently of the code under test.
float OcpE4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::pow(2.0, -6) * m / 8.0 : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return static_cast<float>(s ? -mag : mag);
}

TEST(E4m3, AllCodesDecodeToOcpValues) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float want = OcpE4m3(static_cast<uint8_t>(c));
    const float got = E4m3ToF32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got));
      EXPECT_TRUE(c == 0x7F || c == 0xFF);
      continue;
    }
    EXPECT_EQ(got, want) << c;
    EXPECT_FALSE(std::isinf(got));
    EXPECT_EQ(F32ToE4m3(got), c == 0x80 ? 0x80 : c) << c;  // re-encodes to itself (-0 keeps sign)
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(E4m3ToF32(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(kE4m3MinSubnormal, std::ldexp(1.0f, -9));
}

TEST(E4m3, TiesRoundToEvenAtEveryAdjacentPair) {
  for (int c = 0; c < 0x7E; ++c) {
    for (uint8_t sign : {0x00, 0x80}) {
      const uint8_t lo = static_cast<uint8_t>(c | sign), hi = static_cast<uint8_t>((c + 1) | sign);
      const float mid = (E4m3ToF32(lo) + E4m3ToF32(hi)) / 2.0f;
      ASSERT_EQ(F32ToE4m3(mid), (c % 2 == 0) ? lo : hi) << c;
      ASSERT_EQ(F32ToE4m3(std::nextafter(mid, 0.0f)), lo) << c;
      ASSERT_EQ(F32ToE4m3(std::nextafter(mid, sign ? -1e9f : 1e9f)), hi) << c;
    }
  }
}

TEST(E4m3, SaturatesInsteadOfOverflowing) {
  for (float big : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, INFINITY}) {
    EXPECT_EQ(F32ToE4m3(big), 0x7E) << big;
    EXPECT_EQ(F32ToE4m3(-big), 0xFE) << big;
  }
  EXPECT_EQ(F32ToE4m3(NAN), 0x7F);
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.0f, -11)), 0x00);  // quarter of the smallest subnormal
  EXPECT_EQ(F32ToE4m3(std::ldexp(1.0f, -10)), 0x00);  // tie with 0: even code 0
  EXPECT_EQ(F32ToE4m3(std::ldexp(3.0f, -11)), 0x01);
}

TEST(E2m1, AllCodesAndTheirTies) {
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -values[c & 7] : values[c & 7];
    EXPECT_EQ(E2m1ToF32(static_cast<uint8_t>(c)), want) << c;
    EXPECT_EQ(std::signbit(E2m1ToF32(static_cast<uint8_t>(c))), (c & 8) != 0);
    EXPECT_EQ(F32ToE2m1(want), c) << c;
  }
  // Ties between adjacent magnitudes go to the even code: 0.25→0, 0.75→1, 1.25→1, 1.75→2,
  // 2.5→2, 3.5→4, 5→4.
  const struct { float x; uint8_t code; } ties[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4},
                                                    {2.5f, 4},  {3.5f, 6},  {5.0f, 6}};
  for (const auto& t : ties) {
    EXPECT_EQ(F32ToE2m1(t.x), t.code) << t.x;
    EXPECT_EQ(F32ToE2m1(-t.x), t.code | 8) << t.x;
  }
  EXPECT_EQ(F32ToE2m1(7.0f), 7);
  EXPECT_EQ(F32ToE2m1(-INFINITY), 15);
}

TEST(RoundHalfEven, TiesGoToEven) {
  EXPECT_EQ(RoundHalfEven(0.5f), 0.0f);
  EXPECT_EQ(RoundHalfEven(1.5f), 2.0f);
  EXPECT_EQ(RoundHalfEven(2.5f), 2.0f);
  EXPECT_EQ(RoundHalfEven(-2.5f), -2.0f);
  EXPECT_EQ(RoundHalfEven(-3.5f), -4.0f);
  EXPECT_EQ(RoundHalfEven(2.5000002f), 3.0f);
  EXPECT_EQ(RoundHalfEven(8388607.5f), 8388608.0f);
}

}  // namespace
}  // namespace kvq
