// Q8_0 (ggml block_q8_0): blocks of 32 elements in 34 bytes, little-endian:
//   bytes 0-1   d, the block's scale, IEEE binary16
//   bytes 2-33  qs[0..31], int8 codes
//   element i = d · qs[i]   (exact in f32: d has 11 significant bits, a code 8)
// The matvec quantises the activation per block of 32 (matvec.h, "Numerics, Q8_0/Q4_0").
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_q8_0 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [32]
/// ggml's quantize_row_q8_0_ref: d = amax / 127, qs[i] = round-half-away(x[i] / d) (0 when d = 0).
void QuantizeBlock(const float* x, uint8_t* block);
int32_t Code(const uint8_t* block, int64_t i);  ///< qs[i]
float Scale(const uint8_t* block);              ///< d
/// w[i] = d·code i in double (exact), abs[i] = |w[i]|, i < 32.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();                 ///< row kernels, best target here
/// Whether LoadModel repacks Q8_0 here (repack.h): the kernels dispatched here run the interleaved
/// layout with x86 byte dots (AVX2 or better). Elsewhere the plain rows are kept.
bool RepackPays();
}  // namespace kvq::weights_q8_0
