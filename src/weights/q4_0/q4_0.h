// Q4_0 (ggml block_q4_0): blocks of 32 elements in 18 bytes, little-endian:
//   bytes 0-1   d, the block's scale, IEEE binary16
//   bytes 2-17  qs[0..15], two 4-bit codes per byte
//   element i    (0 ≤ i < 16) = d · ((qs[i] & 0x0F) − 8)
//   element i+16              = d · ((qs[i] >> 4) − 8)
//   (elements i and i+16 share a byte: the low nibbles are the first half of the block)
// Every decoded weight is exact in f32. The matvec quantises the activation per block of 32
// (matvec.h, "Numerics, Q8_0/Q4_0"); a weight's code is its nibble − 8, in [−8, 7].
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_q4_0 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [32]
/// ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude, signed, the first on ties)
/// / −8, nibble = min(15, trunc(x / d + 8.5)) (0 / d taken as 0 when d = 0).
void QuantizeBlock(const float* x, uint8_t* block);
int32_t Code(const uint8_t* block, int64_t i);  ///< the nibble of element i, − 8
float Scale(const uint8_t* block);              ///< d
/// w[i] = d·code i in double (exact), abs[i] = |w[i]|, i < 32.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();                 ///< row kernels, best target here
/// Whether LoadModel repacks Q4_0 here (repack.h): the kernels dispatched here run the interleaved
/// layout with x86 byte dots (AVX2 or better). Elsewhere the plain rows are kept.
bool RepackPays();
}  // namespace kvq::weights_q4_0
