// Q3_K (ggml block_q3_K, ggml-common.h): super-blocks of 256 elements in 110 bytes, little-endian:
//   bytes 0-31    hmask[32]: the high bit of each 3-bit code; bit 4h + k of hmask[l] for element
//                 128h + 32k + l
//   bytes 32-95   qs[64]: the low 2 bits, four codes per byte: bits 2k of qs[32h + l] for element
//                 128h + 32k + l (h = 0, 1; k = 0..3; l < 32)
//   bytes 96-107  scales[12]: sixteen 6-bit values u[j], one per 16 elements (kquant.h,
//                 KQuantScales6x16); the sub-block scale is sc[j] = u[j] − 32 ∈ [−32, 31]
//   bytes 108-109 d, the super-block scale, IEEE binary16
//   weight i = d · sc[i / 16] · (low2 − (high bit ? 0 : 4)), the code in [−4, 3]
// Decoded as ggml's dequantize_row_q3_K: (d·sc)·code in f32, exact (11 + 6 + 3 significant bits).
// Activation block b (elements 32b .. 32b+31) holds sub-blocks 2b and 2b+1.
#pragma once

#include <cstdint>

#include "weights/kquant.h"
#include "weights/weight_type.h"

namespace kvq::weights_q3_k {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [256], as ggml
/// ggml's quantize_row_q3_K_ref without its rmse search (make_q3_quants): per 16, scale = (the
/// value of largest magnitude, signed) / −4; d = (the scale of largest magnitude) / −32 (f16);
/// sc = nearest(scale / d) clamped to [−32, 31]; code = nearest(x / (d·sc)) clamped to [−4, 3]
/// (0 where d·sc = 0).
void QuantizeBlock(const float* x, uint8_t* block);
void Ints(const uint8_t* block, KQuantInts* out);  ///< the integer form (kquant.h), no mins
/// w[i] exact in double, abs[i] = |w[i]|, i < 256.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q3_k
