// Q6_K's scalar reference (see q6_k.h): ggml's decoder, the integer form the scalar kernels and
// ExactBlock read, and ggml's reference quantiser without its rmse search.
#include "weights/q6_k/q6_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q6_k {
namespace {

// The 6-bit code of element i (0 ≤ i < 256), by the table in q6_k.h.
int Code6(const uint8_t* block, int i) {
  const int h = i / 128, k = (i % 128) / 32, l = i % 32;
  const uint8_t low = block[64 * h + 32 * (k % 2) + l];
  const uint8_t high = block[128 + 32 * h + l];
  return (k < 2 ? (low & 15) : (low >> 4)) | ((high >> (2 * k)) & 3) << 4;
}

// The largest-magnitude value of x [n], with its sign (the first one on ties).
float SignedMax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  }
  return max;
}

}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = KQuantHalf(block + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
  for (int i = 0; i < 256; ++i) out[i] = d * static_cast<float>(sc[i / 16]) * static_cast<float>(Code6(block, i) - 32);
}

void Ints(const uint8_t* block, KQuantInts* out) {
  out->d = KQuantHalf(block + 208);
  out->dmin = 0.0f;
  for (int j = 0; j < 16; ++j) out->sc[j] = static_cast<int8_t>(block[192 + j]), out->m[j] = 0;
  // Code6's table, looped as the block is laid out (contiguous runs of 32 codes per half h and
  // quarter k) so that the compiler can vectorise it: the portable row kernels decode every
  // super-block through here.
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      const uint8_t* low = block + 64 * h + 32 * (k % 2);
      const uint8_t* high = block + 128 + 32 * h;
      const int shift = k < 2 ? 0 : 4;
      for (int l = 0; l < 32; ++l) {
        const int code = ((low[l] >> shift) & 15) | ((high[l] >> (2 * k)) & 3) << 4;
        out->code[128 * h + 32 * k + l] = static_cast<int8_t>(code - 32);
      }
    }
  }
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  KQuantInts k;
  Ints(block, &k);
  KQuantExact(k, w, abs);
}

void QuantizeBlock(const float* x, uint8_t* block) {
  float scale[16];
  for (int j = 0; j < 16; ++j) scale[j] = SignedMax(x + 16 * j, 16) / -32.0f;
  const uint16_t d_bits = F32ToF16(SignedMax(scale, 16) / -128.0f);
  const float d = F16ToF32(d_bits);
  int8_t sc[16];
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(d != 0.0f ? std::clamp(KQuantNearest(scale[j] / d), -128, 127) : 0);
  uint8_t code[256];
  for (int i = 0; i < 256; ++i) {
    const float ds = d * static_cast<float>(sc[i / 16]);
    code[i] = static_cast<uint8_t>((ds != 0.0f ? std::clamp(KQuantNearest(x[i] / ds), -32, 31) : 0) + 32);
  }
  std::memset(block, 0, 192);
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    block[64 * h + 32 * (k % 2) + l] |= static_cast<uint8_t>((code[i] & 15) << (k < 2 ? 0 : 4));
    block[128 + 32 * h + l] |= static_cast<uint8_t>((code[i] >> 4) << (2 * k));
  }
  std::memcpy(block + 192, sc, 16);
  std::memcpy(block + 208, &d_bits, 2);  // little-endian host
}

}  // namespace kvq::weights_q6_k
