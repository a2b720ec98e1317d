// Q2_0's scalar reference (see q2_0.h): the decoder the SIMD kernels and DecodeWeightRow use, and
// a ternary reference quantiser (d = max |x|, round to −1/0/+1), written from its definition.
#include "weights/q2_0/q2_0.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_q2_0 {
namespace {
float Scale(const uint8_t* block) { return F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8)); }
int Code(const uint8_t* block, int64_t j) { return (block[2 + j / 4] >> (2 * (j % 4))) & 3; }
}  // namespace

void DequantizeBlock(const uint8_t* block, float* out) {
  // Byte by byte, 4 elements each, from a table of the four weights (all exact: d·{−1, 0, 1, 2}).
  // −0·d would be d·(0 − 1) = −d, etc.: each entry is the f32 product, as d·(code − 1) gives it.
  const float d = Scale(block);
  const float value[4] = {d * -1.0f, d * 0.0f, d * 1.0f, d * 2.0f};  // [code]
  for (int64_t k = 0; k < kBlockElems / 4; ++k) {
    const uint8_t byte = block[2 + k];
    for (int c = 0; c < 4; ++c) out[4 * k + c] = value[(byte >> (2 * c)) & 3];
  }
}

void QuantizeBlock(const float* x, uint8_t* block) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kBlockElems; ++j) amax = std::max(amax, std::fabs(x[j]));
  const uint16_t h = F32ToF16(amax);
  std::memcpy(block, &h, 2);  // little-endian host
  // Rounded against the stored scale, so a value at the f16-rounded extreme still maps to ±1.
  const float d = F16ToF32(h);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  std::memset(block + 2, 0, kBlockBytes - 2);
  for (int64_t j = 0; j < kBlockElems; ++j) {
    const float r = std::round(x[j] * id);  // NaN (a NaN or inf input) falls through to code 1
    const int code = r >= 1.0f ? 2 : r <= -1.0f ? 0 : 1;
    block[2 + j / 4] |= static_cast<uint8_t>(code << (2 * (j % 4)));
  }
}

void ExactBlock(const uint8_t* block, double* w, double* abs) {
  const double d = Scale(block);
  for (int64_t j = 0; j < kBlockElems; ++j) {
    w[j] = d * (Code(block, j) - 1);
    abs[j] = std::fabs(w[j]);
  }
}

}  // namespace kvq::weights_q2_0
