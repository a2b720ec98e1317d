// F32's scalar reference (see f32.h): a copy of the bits either way.
#include "weights/f32/f32.h"

#include <cstring>

namespace kvq::weights_f32 {
void DequantizeBlock(const uint8_t* block, float* out) { std::memcpy(out, block, 4); }
void QuantizeBlock(const float* x, uint8_t* block) { std::memcpy(block, x, 4); }
}  // namespace kvq::weights_f32
