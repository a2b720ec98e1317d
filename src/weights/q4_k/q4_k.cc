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
  KQuantHeader6(block, out);
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
  uint8_t sc[8], m[8];
  float d = 0.0f, dmin = 0.0f;
  KQuantChooseScalesMins6(x, 15.0f, block, sc, m, &d, &dmin);
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
