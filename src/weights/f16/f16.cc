// F16's scalar reference (see f16.h), through base/float_codes.
#include "weights/f16/f16.h"

#include <cstring>

#include "base/float_codes.h"

namespace kvq::weights_f16 {
void DequantizeBlock(const uint8_t* block, float* out) {
  out[0] = F16ToF32(static_cast<uint16_t>(block[0] | block[1] << 8));
}
void QuantizeBlock(const float* x, uint8_t* block) {
  const uint16_t h = F32ToF16(x[0]);
  std::memcpy(block, &h, 2);  // little-endian host
}
}  // namespace kvq::weights_f16
