// F32: one element per block, 4 bytes, IEEE binary32 little-endian; a row is cols × 4 bytes.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_f32 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< 4 bytes -> out [1]
void QuantizeBlock(const float* x, uint8_t* block);      ///< the bits of x[0]
const WeightKernels& Kernels();                          ///< row kernels, best target here
}  // namespace kvq::weights_f32
