// The random numbers and the row encoders of synth (see synth.h): a splitmix64 stream per row,
// and ggml's reference quantisers for Q8_0 and Q4_0 written from their definitions.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"
#include "synth/synth.h"

namespace kvq {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// splitmix64 (Steele, Lea, Flood 2014): advances the state by the golden ratio and mixes it.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += kGolden);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Mix(uint64_t x) { return SplitMix64(&x); }

void PutF16(uint8_t* out, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(out, &h, 2);
}

// roundf (half away from zero) for |v| well inside int range: the truncation and the fraction
// v − trunc(v) are both exact in f32, so this equals roundf without a libm call per weight.
int RoundHalfAway(float v) {
  int t = static_cast<int>(v);
  const float frac = v - static_cast<float>(t);
  if (frac >= 0.5f) ++t;
  if (frac <= -0.5f) --t;
  return t;
}

}  // namespace

uint64_t SynthTensorSeed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a 64
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001B3ull;
  }
  return Mix(seed ^ h);
}

void SynthDrawRow(uint64_t tensor_seed, int64_t row, float amplitude, float* out, int64_t n) {
  uint64_t state = Mix(tensor_seed + static_cast<uint64_t>(row) * kGolden);
  // A 24-bit uniform u maps to (u − (2^24 − 1)/2) · a / 2^23: symmetric about 0, strictly inside
  // (−a, a). The subtraction is exact in f32 (24 significant bits), the product rounds once.
  const float scale = amplitude / 8388608.0f;
  auto value = [scale](uint64_t u) { return (static_cast<float>(u) - 8388607.5f) * scale; };
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint64_t r = SplitMix64(&state);
    out[i] = value(r >> 40);
    out[i + 1] = value((r >> 8) & 0xFFFFFF);
  }
  if (i < n) out[i] = value(SplitMix64(&state) >> 40);
}

void QuantizeRowQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + 34 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    PutF16(ob, d);
    for (int j = 0; j < 32; ++j) {
      ob[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(RoundHalfAway(xb[j] * id)));
    }
  }
}

void QuantizeRowQ4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + 18 * b;
    // The value of largest magnitude, with its sign (the first one on ties), maps to code 0.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    PutF16(ob, d);
    for (int j = 0; j < 16; ++j) {
      // x/d + 8.5 lies in [0.5, 16.5]: truncation is floor, and 16 (the extreme itself) is
      // clamped to 15, as ggml does.
      const int lo = std::min(15, static_cast<int>(xb[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(xb[16 + j] * id + 8.5f));
      ob[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace kvq
