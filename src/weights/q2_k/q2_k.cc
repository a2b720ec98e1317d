// Q2_K's scalar reference (see q2_k.h): ggml's decoder, the integer form the scalar kernels and
// ExactBlock read, and a simple min/max reference quantiser.
#include "weights/q2_k/q2_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q2_k {
namespace {

// The 2-bit code of element i, by the table in q2_k.h.
int Code2(const uint8_t* block, int i) {
  const int h = i / 128, k = (i % 128) / 32, l = i % 32;
  return (block[16 + 32 * h + l] >> (2 * k)) & 3;
}

}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  const float d = KQuantHalf(block + 80), dmin = KQuantHalf(block + 82);
  for (int i = 0; i < 256; ++i) {
    const uint8_t sc = block[i / 16];
    const float dl = d * static_cast<float>(sc & 15), ml = dmin * static_cast<float>(sc >> 4);
    out[i] = dl * static_cast<float>(Code2(block, i)) - ml;
  }
}

void Ints(const uint8_t* block, KQuantInts* out) {
  out->d = KQuantHalf(block + 80);
  out->dmin = KQuantHalf(block + 82);
  for (int j = 0; j < 16; ++j) out->sc[j] = block[j] & 15, out->m[j] = block[j] >> 4;
  // Code2's table, looped as the block is laid out (contiguous runs of 32 codes) so that the
  // compiler can vectorise it: the portable row kernels decode every super-block through here.
  // Four codes per 32-bit word (each byte's bits 2k, 2k+1 shifted down together): the WebAssembly
  // compiler left the byte-by-byte form of this loop scalar, Q2_K at a third of the other
  // K-quants' speed in the page; words vectorise as 32-bit lanes.
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; l += 4) {
        uint32_t word;
        std::memcpy(&word, block + 16 + 32 * h + l, 4);
        word = (word >> (2 * k)) & 0x03030303u;  // byte i: element 128h + 32k + l + i (little-endian host)
        std::memcpy(out->code + 128 * h + 32 * k + l, &word, 4);
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
  float scale[16], min[16], max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float lo = 0.0f, hi = x[16 * j];
    for (int l = 0; l < 16; ++l) lo = std::min(lo, x[16 * j + l]), hi = std::max(hi, x[16 * j + l]);
    scale[j] = (hi - lo) / 3.0f;
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  const uint16_t d_bits = F32ToF16(max_scale / 15.0f), dmin_bits = F32ToF16(max_min / 15.0f);
  const float d = F16ToF32(d_bits), dmin = F16ToF32(dmin_bits);
  std::memset(block, 0, 84);
  int sc[16], m[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = d > 0.0f ? std::clamp(KQuantNearest(scale[j] / d), 0, 15) : 0;
    m[j] = dmin > 0.0f ? std::clamp(KQuantNearest(min[j] / dmin), 0, 15) : 0;
    block[j] = static_cast<uint8_t>(sc[j] | m[j] << 4);
  }
  for (int i = 0; i < 256; ++i) {
    const float ds = d * static_cast<float>(sc[i / 16]), dm = dmin * static_cast<float>(m[i / 16]);
    const int code = ds > 0.0f ? std::clamp(KQuantNearest((x[i] + dm) / ds), 0, 3) : 0;
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    block[16 + 32 * h + l] |= static_cast<uint8_t>(code << (2 * k));
  }
  std::memcpy(block + 80, &d_bits, 2);  // little-endian host
  std::memcpy(block + 82, &dmin_bits, 2);
}

}  // namespace kvq::weights_q2_k
