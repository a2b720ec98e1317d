// Reference f32 <-> f16 / bf16 / E4M3 / E2M1 conversions (see float_codes.h).
// f16 and bf16 use the usual bit manipulation; the 8- and 4-bit codes round by searching their
// sorted table of magnitudes, which makes "nearest, ties to the even code" literal: in these
// formats the code's lowest bit is the mantissa's lowest bit, so the even code is the even mantissa.
#include "base/float_codes.h"

#include <array>
#include <bit>
#include <cmath>

namespace kvq {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

// Rounds |f| (finite, >= 0) to the nearest entry of an ascending table of magnitudes, ties to the
// even index; values past the last entry saturate to it. Returns the index (= code magnitude bits).
template <size_t N>
uint8_t NearestCode(const std::array<float, N>& table, float a) {
  if (a >= table[N - 1]) return N - 1;
  size_t lo = 0;  // table[lo] <= a < table[lo + 1]
  size_t hi = N - 1;
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid] <= a) lo = mid; else hi = mid;
  }
  // Compare distances exactly: both differences are exact in f32 for these small tables.
  const float below = a - table[lo];
  const float above = table[lo + 1] - a;
  if (below < above) return static_cast<uint8_t>(lo);
  if (above < below) return static_cast<uint8_t>(lo + 1);
  return static_cast<uint8_t>((lo % 2 == 0) ? lo : lo + 1);
}

std::array<float, 127> MakeE4m3Table() {  // codes 0x00..0x7E: all non-negative finite values
  std::array<float, 127> t{};
  for (int c = 0; c < 127; ++c) {
    const int e = c >> 3, m = c & 7;
    t[c] = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                  : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  }
  return t;
}
const std::array<float, 127> kE4m3 = MakeE4m3Table();
constexpr std::array<float, 8> kE2m1 = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

uint16_t F32ToF16(float f) {
  const uint32_t u = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00 | static_cast<uint16_t>((abs >> 13) & 0x1FF);  // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00;  // >= 65520 (halfway to 2^16): inf
  if (abs >= 0x38800000u) {                      // normal f16 range (>= 2^-14)
    // Rebias the exponent and round the 13 dropped bits to nearest even; a mantissa carry
    // correctly increments the exponent.
    const uint32_t rebased = abs - (112u << 23);
    const uint32_t rounded = rebased + 0xFFFu + ((rebased >> 13) & 1u);
    return sign | static_cast<uint16_t>(rounded >> 13);
  }
  // Subnormal f16 (or zero): value = n * 2^-24 with n = RNE(|f| * 2^24); exact scaling in f32.
  const float scaled = FromBits(abs) * 16777216.0f;
  return sign | static_cast<uint16_t>(RoundHalfEven(scaled));
}

uint16_t F32ToBf16(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040);  // qNaN
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);  // overflow carries into inf: correct
  return static_cast<uint16_t>(rounded >> 16);
}

uint8_t F32ToE4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | 0x7F;
  return sign | NearestCode(kE4m3, std::fabs(f));  // inf saturates through the table's end
}

float E2m1ToF32(uint8_t code) {
  const float v = kE2m1[code & 7];
  return (code & 8) ? -v : v;
}

uint8_t F32ToE2m1(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  return sign | NearestCode(kE2m1, std::fabs(f));
}

}  // namespace kvq
