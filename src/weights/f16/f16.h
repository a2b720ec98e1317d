// F16: one element per block, 2 bytes, IEEE binary16 little-endian; a row is cols × 2 bytes.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_f16 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< 2 bytes -> out [1] (exact)
void QuantizeBlock(const float* x, uint8_t* block);      ///< x[0] rounded to nearest even
const WeightKernels& Kernels();                          ///< row kernels, best target here
}  // namespace kvq::weights_f16
