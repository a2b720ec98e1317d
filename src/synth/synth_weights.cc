// The random numbers of synth (see synth.h): a splitmix64 stream per row. The row encoders are
// the weight-type registry's reference quantisers (weights/<name>/).
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

}  // namespace kvq
