// Q5_K (ggml block_q5_K, ggml-common.h): super-blocks of 256 elements in 176 bytes, little-endian:
//   bytes 0-1     d, the super-block scale, IEEE binary16
//   bytes 2-3     dmin, the super-block min scale, binary16
//   bytes 4-15    scales[12]: eight 6-bit scales sc[j] and mins m[j], packed as Q4_K's (q4_k.h)
//   bytes 16-47   qh[32]: the 5th bit of each code; bit 2c of qh[l] for element 64c + l, bit
//                 2c+1 for element 64c + 32 + l
//   bytes 48-175  qs[128]: the low 4 bits, per 64 elements (c = 0..3, qs[32c .. 32c+31]) the 32
//                 low nibbles, then the 32 high nibbles of the same bytes
//   element 64c + l      (l < 32) = d·sc[2c]   · ((qs[32c + l] & 15) + 16·(qh[l] >> 2c & 1)) − dmin·m[2c]
//   element 64c + 32 + l          = d·sc[2c+1] · ((qs[32c + l] >> 4) + 16·(qh[l] >> (2c+1) & 1)) − dmin·m[2c+1]
// Decoded as ggml's dequantize_row_q5_K in f32: d1 = d·sc, m1 = dmin·m (exact), d1·code (exact)
// − m1 (one rounding). Sub-block j is activation block j of the super-block.
#pragma once

#include <cstdint>

#include "weights/kquant.h"
#include "weights/weight_type.h"

namespace kvq::weights_q5_k {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [256], as ggml
/// Q4_K's min/max reference quantiser (q4_k.h) with codes in [0, 31]: scale = (max − lo) / 31.
void QuantizeBlock(const float* x, uint8_t* block);
void Ints(const uint8_t* block, KQuantInts* out);  ///< the integer form (kquant.h)
/// w[i] exact in double, abs[i] = |d·sc·code| + |dmin·m| (kquant.h), i < 256.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q5_k
