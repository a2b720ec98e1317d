// Q3_K's scalar reference (see q3_k.h): ggml's decoder, the integer form the scalar kernels and
// ExactBlock read, and ggml's reference quantiser without its rmse search.
#include "weights/q3_k/q3_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q3_k {
namespace {

// The signed 3-bit code of element i, by the table in q3_k.h.
int Code3(const uint8_t* block, int i) {
  const int h = i / 128, k = (i % 128) / 32, l = i % 32;
  const int low2 = (block[32 + 32 * h + l] >> (2 * k)) & 3;
  return low2 - (((block[l] >> (4 * h + k)) & 1) != 0 ? 0 : 4);
}

float SignedMax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  }
  return max;
}

}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = KQuantHalf(block + 108);
  uint8_t u[16];
  KQuantScales6x16(block + 96, u);
  for (int i = 0; i < 256; ++i) {
    const float dl = d * static_cast<float>(u[i / 16] - 32);
    out[i] = dl * static_cast<float>(Code3(block, i));
  }
}

void Ints(const uint8_t* block, KQuantInts* out) {
  out->d = KQuantHalf(block + 108);
  out->dmin = 0.0f;
  uint8_t u[16];
  KQuantScales6x16(block + 96, u);
  for (int j = 0; j < 16; ++j) out->sc[j] = u[j] - 32, out->m[j] = 0;
  // Code3's table, looped as the block is laid out (contiguous runs of 32 codes) so that the
  // compiler can vectorise it: the portable row kernels decode every super-block through here.
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      const uint8_t* low = block + 32 + 32 * h;
      const int bit = 4 * h + k;
      for (int l = 0; l < 32; ++l) {
        out->code[128 * h + 32 * k + l] =
            static_cast<int8_t>(((low[l] >> (2 * k)) & 3) - (((block[l] >> bit) & 1) != 0 ? 0 : 4));
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
  for (int j = 0; j < 16; ++j) scale[j] = SignedMax(x + 16 * j, 16) / -4.0f;
  const uint16_t d_bits = F32ToF16(SignedMax(scale, 16) / -32.0f);
  const float d = F16ToF32(d_bits);
  std::memset(block, 0, 110);
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = d != 0.0f ? std::clamp(KQuantNearest(scale[j] / d), -32, 31) : 0;
    const int u = sc[j] + 32;  // packed as ggml's quantize_row_q3_K_ref
    block[96 + j % 8] |= static_cast<uint8_t>((u & 15) << (j < 8 ? 0 : 4));
    block[96 + 8 + j % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (j / 4)));
  }
  for (int i = 0; i < 256; ++i) {
    const float ds = d * static_cast<float>(sc[i / 16]);
    const int code = ds != 0.0f ? std::clamp(KQuantNearest(x[i] / ds), -4, 3) : 0;
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const int u = code + 4;
    block[32 + 32 * h + l] |= static_cast<uint8_t>((u & 3) << (2 * k));
    block[l] |= static_cast<uint8_t>((u >> 2) << (4 * h + k));
  }
  std::memcpy(block + 108, &d_bits, 2);  // little-endian host
}

}  // namespace kvq::weights_q3_k
