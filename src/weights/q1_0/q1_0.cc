// Q1_0's scalar reference (see q1_0.h): the decoder the SIMD kernels and DecodeWeightRow use, and
// PrismML's reference quantiser (sign bits and the mean magnitude), written from its definition.
#include "weights/q1_0/q1_0.h"

#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q1_0 {
namespace {
float Scale(const uint8_t* block) { return F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8)); }
}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  // Byte by byte, 8 elements each: the embedding lookup (DecodeWeightRow) decodes whole rows
  // through here, so it is a plain select per element, no division per element.
  const float d = Scale(block);
  const float pm[2] = {-d, d};  // [bit]
  for (int64_t k = 0; k < kBlockElems / 8; ++k) {
    const uint8_t bits = block[2 + k];
    for (int b = 0; b < 8; ++b) out[8 * k + b] = pm[(bits >> b) & 1];
  }
}

void QuantizeBlock(const float* x, uint8_t* block) {
  float sum = 0.0f;  // Σ |x| in element order, then one division
  for (int64_t j = 0; j < kBlockElems; ++j) sum += std::fabs(x[j]);
  const uint16_t h = F32ToF16(sum / static_cast<float>(kBlockElems));
  std::memcpy(block, &h, 2);  // little-endian host
  std::memset(block + 2, 0, kBlockBytes - 2);
  for (int64_t j = 0; j < kBlockElems; ++j) {
    if (x[j] >= 0.0f) block[2 + j / 8] |= static_cast<uint8_t>(1u << (j % 8));
  }
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  const double d = Scale(block);
  for (int64_t j = 0; j < kBlockElems; ++j) {
    w[j] = (block[2 + j / 8] >> (j % 8) & 1) != 0 ? d : -d;
    abs[j] = std::fabs(d);
  }
}

}  // namespace kvq::weights_q1_0
