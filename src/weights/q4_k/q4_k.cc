// Q4_K's scalar reference (see q4_k.h): ggml's decoder, the integer form the scalar kernels and
// ExactBlock read, and a simple min/max reference quantiser.
#include "weights/q4_k/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q4_k {

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = KQuantHalf(block), dmin = KQuantHalf(block + 2);
  uint8_t sc[8], m[8];
  KQuantScalesMins6(block + 4, sc, m);
  const uint8_t* qs = block + 16;
  for (int c = 0; c < 4; ++c) {
    const float d1 = d * static_cast<float>(sc[2 * c]), m1 = dmin * static_cast<float>(m[2 * c]);
    const float d2 = d * static_cast<float>(sc[2 * c + 1]), m2 = dmin * static_cast<float>(m[2 * c + 1]);
    for (int l = 0; l < 32; ++l) out[64 * c + l] = d1 * static_cast<float>(qs[32 * c + l] & 15) - m1;
    for (int l = 0; l < 32; ++l) out[64 * c + 32 + l] = d2 * static_cast<float>(qs[32 * c + l] >> 4) - m2;
  }
}

void Ints(const uint8_t* block, KQuantInts* out) {
  out->d = KQuantHalf(block);
  out->dmin = KQuantHalf(block + 2);
  uint8_t sc[8], m[8];
  KQuantScalesMins6(block + 4, sc, m);
  for (int j = 0; j < 16; ++j) out->sc[j] = sc[j / 2], out->m[j] = m[j / 2];
  const uint8_t* qs = block + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out->code[64 * c + l] = static_cast<int8_t>(qs[32 * c + l] & 15);
      out->code[64 * c + 32 + l] = static_cast<int8_t>(qs[32 * c + l] >> 4);
    }
  }
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  KQuantInts k;
  Ints(block, &k);
  KQuantExact(k, w, abs);
}

void QuantizeBlock(const float* x, uint8_t* block) {
  float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    scale[j] = (hi - lo) / 15.0f;
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  const uint16_t d_bits = F32ToF16(max_scale / 63.0f), dmin_bits = F32ToF16(max_min / 63.0f);
  const float d = F16ToF32(d_bits), dmin = F16ToF32(dmin_bits);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.0f ? std::clamp(KQuantNearest(scale[j] / d), 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0.0f ? std::clamp(KQuantNearest(min[j] / dmin), 0, 63) : 0);
  }
  std::memcpy(block, &d_bits, 2);  // little-endian host
  std::memcpy(block + 2, &dmin_bits, 2);
  KQuantPackScalesMins6(sc, m, block + 4);
  uint8_t code[256];
  for (int j = 0; j < 8; ++j) {
    const float ds = d * static_cast<float>(sc[j]), dm = dmin * static_cast<float>(m[j]);
    for (int l = 0; l < 32; ++l) {
      code[32 * j + l] = static_cast<uint8_t>(ds > 0.0f ? std::clamp(KQuantNearest((x[32 * j + l] + dm) / ds), 0, 15) : 0);
    }
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) block[16 + 32 * c + l] = static_cast<uint8_t>(code[64 * c + l] | code[64 * c + 32 + l] << 4);
  }
}

}  // namespace kvq::weights_q4_k
