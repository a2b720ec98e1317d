// Q4_0's scalar reference (see q4_0.h): the decoder the SIMD kernels are tested against, and
// ggml's reference quantiser, written from its definition.
#include "weights/q4_0/q4_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q4_0 {

float Scale(const uint8_t* block) { return F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8)); }

int32_t Code(const uint8_t* block, int64_t i) {
  const uint8_t byte = block[2 + i % 16];
  return (i < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
}

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = Scale(block);
  for (int64_t i = 0; i < 32; ++i) out[i] = d * static_cast<float>(Code(block, i));
}

void QuantizeBlock(const float* x, uint8_t* block) {
  // The value of largest magnitude, with its sign (the first one on ties), maps to code 0.
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = F32ToF16(d);
  std::memcpy(block, &h, 2);  // little-endian host
  for (int j = 0; j < 16; ++j) {
    // x/d + 8.5 lies in [0.5, 16.5]: truncation is floor, and 16 (the extreme itself) is
    // clamped to 15, as ggml does.
    const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int hi = std::min(15, static_cast<int>(x[16 + j] * id + 8.5f));
    block[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  const double d = Scale(block);
  for (int64_t i = 0; i < 32; ++i) {
    w[i] = d * Code(block, i);
    abs[i] = std::fabs(w[i]);
  }
}

}  // namespace kvq::weights_q4_0
