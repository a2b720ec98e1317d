// Scalar conversions between f32 and the small float codes kvq stores: IEEE f16, bf16,
// OCP FP8 E4M3 and OCP FP4 E2M1. These are the reference definitions every format and every SIMD
// kernel is tested against. All rounding is round-to-nearest, ties to even (RNE).
#pragma once

#include <bit>
#include <cstdint>

namespace kvq {

// ---- IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. ----
/// Exact: every f16 value is an f32 value. Inline: kernels call it once per row for its scale.
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));  // inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  // Zero or subnormal: man · 2^-24, exact in f32.
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(static_cast<float>(man) * 0x1p-24f));
}
/// RNE; overflow rounds to ±inf (IEEE behaviour), NaN stays a quiet NaN with its sign.
uint16_t F32ToF16(float f);
/// roundF16(x) of the seeds: the f32 value of the nearest f16.
inline float RoundF16(float f) { return F16ToF32(F32ToF16(f)); }
inline constexpr float kF16Max = 65504.0f;

// ---- bfloat16: the high 16 bits of an f32 (1 sign, 8 exponent, 7 mantissa bits). ----
inline float Bf16ToF32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
/// RNE; values past the largest bf16 round to ±inf; NaN stays a quiet NaN with its sign.
uint16_t F32ToBf16(float f);

// ---- OCP FP8 E4M3 ("E4M3FN"): 1 sign, 4 exponent (bias 7), 3 mantissa bits. ----
// No infinities; NaN only at S.1111.111 (0x7F, 0xFF). Max normal 448 (0.1111.110); smallest
// subnormal 2^-9 (0.0000.001).
/// Inline: an E4M3 code S.EEEE.MMM placed as f16 bits S.0EEEE.MMM0000000 is the value / 2^8
/// (f16's exponent bias is 15, E4M3's 7), subnormals included.
inline float E4m3ToF32(uint8_t code) {
  if ((code & 0x7F) == 0x7F) return std::bit_cast<float>(0x7FC00000u | ((code & 0x80u) << 24));
  return F16ToF32(static_cast<uint16_t>(((code & 0x80) << 8) | ((code & 0x7F) << 7))) * 256.0f;
}
/// RNE, saturating: |x| beyond 448 (including ±inf) gives ±448; NaN gives 0x7F (sign kept).
uint8_t F32ToE4m3(float f);
inline float RoundE4m3(float f) { return E4m3ToF32(F32ToE4m3(f)); }
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE4m3MinSubnormal = 0.001953125f;  // 2^-9

// ---- OCP FP4 E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit, in the low 4 bits. ----
// Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; no inf, no NaN.
float E2m1ToF32(uint8_t code);
/// RNE, saturating at ±6 (±inf too); NaN gives +0 (E2M1 has no NaN; callers keep inputs finite).
uint8_t F32ToE2m1(float f);
inline constexpr float kE2m1Max = 6.0f;

/// Round half to even (assumes the default round-to-nearest-even environment): adding and
/// removing 2^23 leaves no fraction bits, so the hardware's own rounding decides ties. Inline and
/// branch-light because encoders call it per number.
inline float RoundHalfEven(float x) {
  if (!(x < 0x1p23f && x > -0x1p23f)) return x;  // already whole (or NaN)
  const float magic = x < 0.0f ? -0x1p23f : 0x1p23f;
  return (x + magic) - magic;
}

}  // namespace kvq
