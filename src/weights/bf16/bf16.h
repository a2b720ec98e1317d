// BF16: one element per block, 2 bytes little-endian, the high half of an IEEE binary32; a row is
// cols × 2 bytes.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_bf16 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< 2 bytes -> out [1] (exact)
void QuantizeBlock(const float* x, uint8_t* block);      ///< x[0] rounded to nearest even (F32ToBf16)
const WeightKernels& Kernels();                          ///< row kernels, best target here
}  // namespace kvq::weights_bf16
