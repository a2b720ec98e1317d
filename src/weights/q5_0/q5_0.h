// Q5_0 (ggml block_q5_0): blocks of 32 elements in 22 bytes, little-endian:
//   bytes 0-1   d, the block's scale, IEEE binary16
//   bytes 2-5   qh, a little-endian uint32: bit i is the 5th (high) bit of element i
//   bytes 6-21  qs[0..15], the low 4 bits, two per byte
//   element i    (0 ≤ i < 16) = d · (((qs[i] & 0x0F) | ((qh >> i) & 1) << 4) − 16)
//   element i+16              = d · (((qs[i] >> 4)   | ((qh >> (i+16)) & 1) << 4) − 16)
//   (elements i and i+16 share a qs byte: the low nibbles are the first half of the block)
// Every decoded weight is exact in f32 (d has 11 significant bits, a code 5). The matvec
// quantises the activation per block of 32 (matvec.h); a weight's code is its 5-bit value − 16,
// in [−16, 15], and the kernels take the same f32 steps as Q4_0's (weights/quant_rows-inl.h: the
// scale product, one FMA per block, 3 adds of the lane reduction): matvec_roundings = 4.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_q5_0 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [32]
/// ggml's quantize_row_q5_0_ref: d = (the value of largest magnitude, signed, the first on ties)
/// / −16, code = min(31, trunc(x / d + 16.5)) (0 / d taken as 0 when d = 0).
void QuantizeBlock(const float* x, uint8_t* block);
int32_t Code(const uint8_t* block, int64_t i);  ///< the 5-bit value of element i, − 16
float Scale(const uint8_t* block);              ///< d
/// w[i] = d·code i in double (exact), abs[i] = |w[i]|, i < 32.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q5_0
