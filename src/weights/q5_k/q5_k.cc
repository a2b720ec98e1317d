// Q5_K's scalar reference (see q5_k.h): ggml's decoder, the integer form the scalar kernels and
// ExactBlock read, and a simple min/max reference quantiser.
#include "weights/q5_k/q5_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q5_k {
namespace {

// The 5-bit code of element i, by the table in q5_k.h.
int Code5(const uint8_t* block, int i) {
  const int c = i / 64, l = i % 32;
  const bool high = i % 64 >= 32;
  const uint8_t byte = block[48 + 32 * c + l];
  return (high ? byte >> 4 : byte & 15) | ((block[16 + l] >> (2 * c + (high ? 1 : 0))) & 1) << 4;
}

}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = KQuantHalf(block), dmin = KQuantHalf(block + 2);
  uint8_t sc[8], m[8];
  KQuantScalesMins6(block + 4, sc, m);
  for (int i = 0; i < 256; ++i) {
    const float d1 = d * static_cast<float>(sc[i / 32]), m1 = dmin * static_cast<float>(m[i / 32]);
    out[i] = d1 * static_cast<float>(Code5(block, i)) - m1;
  }
}

void Ints(const uint8_t* block, KQuantInts* out) {
  KQuantHeader6(block, out);
  // Code5's table, looped as the block is laid out (contiguous runs of 32 codes) so that the
  // compiler can vectorise it: the portable row kernels decode every super-block through here.
  for (int c = 0; c < 4; ++c) {
    for (int high = 0; high < 2; ++high) {
      const uint8_t* nibbles = block + 48 + 32 * c;
      const int shift = 4 * high, bit = 2 * c + high;
      for (int l = 0; l < 32; ++l) {
        out->code[64 * c + 32 * high + l] = static_cast<int8_t>(((nibbles[l] >> shift) & 15) | ((block[16 + l] >> bit) & 1) << 4);
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
  uint8_t sc[8], m[8];
  float d = 0.0f, dmin = 0.0f;
  KQuantChooseScalesMins6(x, 31.0f, block, sc, m, &d, &dmin);
  std::memset(block + 16, 0, 160);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    const float ds = d * static_cast<float>(sc[j]), dm = dmin * static_cast<float>(m[j]);
    const int code = ds > 0.0f ? std::clamp(KQuantNearest((x[i] + dm) / ds), 0, 31) : 0;
    const int c = i / 64, l = i % 32;
    const bool high = i % 64 >= 32;
    block[48 + 32 * c + l] |= static_cast<uint8_t>((code & 15) << (high ? 4 : 0));
    block[16 + l] |= static_cast<uint8_t>((code >> 4) << (2 * c + (high ? 1 : 0)));
  }
}

}  // namespace kvq::weights_q5_k
