// Q8_0's scalar reference (see q8_0.h): the decoder the SIMD kernels are tested against, and
// ggml's reference quantiser, written from its definition.
#include "weights/q8_0/q8_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q8_0 {
namespace {

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

float Scale(const uint8_t* block) { return F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8)); }

int32_t Code(const uint8_t* block, int64_t i) { return static_cast<int8_t>(block[2 + i]); }

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = Scale(block);
  for (int64_t i = 0; i < 32; ++i) out[i] = d * static_cast<float>(Code(block, i));
}

void QuantizeBlock(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = F32ToF16(d);
  std::memcpy(block, &h, 2);  // little-endian host
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(RoundHalfAway(x[j] * id)));
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  const double d = Scale(block);
  for (int64_t i = 0; i < 32; ++i) {
    w[i] = d * Code(block, i);
    abs[i] = std::fabs(w[i]);
  }
}

}  // namespace kvq::weights_q8_0
