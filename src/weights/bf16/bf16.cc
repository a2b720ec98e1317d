// BF16's scalar reference (see bf16.h), through base/float_codes.
#include "weights/bf16/bf16.h"

#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_bf16 {
void DequantizeBlock(const uint8_t* block, float* out) {
  out[0] = Bf16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8));
}
void QuantizeBlock(const float* x, uint8_t* block) {
  const uint16_t h = F32ToBf16(x[0]);
  std::memcpy(block, &h, 2);  // little-endian host
}
}  // namespace kvq::weights_bf16
