// Q5_1's scalar reference (see q5_1.h): the decoder the SIMD kernels are tested against, and
// ggml's reference quantiser, written from its definition.
#include "weights/q5_1/q5_1.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q5_1 {
namespace {

float HalfAt(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

int32_t FiveBit(const uint8_t* block, int64_t i) {
  uint32_t qh;
  std::memcpy(&qh, block + 4, 4);  // little-endian host
  const uint8_t byte = block[8 + i % 16];
  const int32_t low = i < 16 ? (byte & 0x0F) : (byte >> 4);
  return low | static_cast<int32_t>((qh >> i) & 1) << 4;
}

}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = HalfAt(block), m = HalfAt(block + 2);
  for (int64_t i = 0; i < 32; ++i) out[i] = static_cast<float>(FiveBit(block, i)) * d + m;
}

void QuantizeBlock(const float* x, uint8_t* block) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t hd = F32ToF16(d), hm = F32ToF16(min);
  std::memcpy(block, &hd, 2);  // little-endian host
  std::memcpy(block + 2, &hm, 2);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(31, static_cast<int>((x[j] - min) * id + 0.5f));
    const int hi = std::min(31, static_cast<int>((x[16 + j] - min) * id + 0.5f));
    block[8 + j] = static_cast<uint8_t>((lo & 0x0F) | (hi & 0x0F) << 4);
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
  }
  std::memcpy(block + 4, &qh, 4);
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  const double d = HalfAt(block), m = HalfAt(block + 2);
  for (int64_t i = 0; i < 32; ++i) {
    const double dn = d * FiveBit(block, i);
    w[i] = dn + m;
    abs[i] = std::fabs(dn) + std::fabs(m);
  }
}

}  // namespace kvq::weights_q5_1
