// Q5_0's scalar reference (see q5_0.h): the decoder the SIMD kernels are tested against, and
// ggml's reference quantiser, written from its definition.
#include "weights/q5_0/q5_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q5_0 {

float Scale(const uint8_t* block) { return F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8)); }

int32_t Code(const uint8_t* block, int64_t i) {
  uint32_t qh;
  std::memcpy(&qh, block + 2, 4);  // little-endian host
  const uint8_t byte = block[6 + i % 16];
  const int32_t low = i < 16 ? (byte & 0x0F) : (byte >> 4);
  return (low | static_cast<int32_t>((qh >> i) & 1) << 4) - 16;
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
  const float d = max / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = F32ToF16(d);
  std::memcpy(block, &h, 2);  // little-endian host
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    // x/d + 16.5 lies in [0.5, 32.5]: truncation is floor, and 32 (the extreme itself) is
    // clamped to 31, as ggml does.
    const int lo = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    const int hi = std::min(31, static_cast<int>(x[16 + j] * id + 16.5f));
    block[6 + j] = static_cast<uint8_t>((lo & 0x0F) | (hi & 0x0F) << 4);
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
  }
  std::memcpy(block + 2, &qh, 4);
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  const double d = Scale(block);
  for (int64_t i = 0; i < 32; ++i) {
    w[i] = d * Code(block, i);
    abs[i] = std::fabs(w[i]);
  }
}

}  // namespace kvq::weights_q5_0
