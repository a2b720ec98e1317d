// Q2_K (ggml block_q2_K, ggml-common.h): super-blocks of 256 elements in 84 bytes, little-endian:
//   bytes 0-15    scales[16], one per 16 elements: sc[j] = scales[j] & 15, m[j] = scales[j] >> 4
//   bytes 16-79   qs[64]: 2-bit codes, four per byte: bits 2k of qs[32h + l] for element
//                 128h + 32k + l (h = 0, 1; k = 0..3; l < 32)
//   bytes 80-81   d, the super-block scale, IEEE binary16
//   bytes 82-83   dmin, the super-block min scale, binary16
//   weight i = d·sc[i / 16]·code − dmin·m[i / 16], code ∈ [0, 3]
// Decoded as ggml's dequantize_row_q2_K in f32: dl = d·sc, ml = dmin·m (exact), dl·code (exact)
// − ml (one rounding). Activation block b (elements 32b .. 32b+31) holds sub-blocks 2b and 2b+1.
#pragma once

#include <cstdint>

#include "weights/kquant.h"
#include "weights/weight_type.h"

namespace kvq::weights_q2_k {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [256], as ggml
/// A reference quantiser (simpler than ggml's make_qkx2 search): per sub-block of 16,
/// lo = min(0, min x), scale = (max x − lo) / 3, min = −lo; d = max scale / 15 and dmin =
/// max min / 15 (f16); sc, m = nearest(scale / d), nearest(min / dmin) clamped to [0, 15];
/// code = nearest((x + dmin·m) / (d·sc)) clamped to [0, 3] (0 where d·sc = 0).
void QuantizeBlock(const float* x, uint8_t* block);
void Ints(const uint8_t* block, KQuantInts* out);  ///< the integer form (kquant.h)
/// w[i] exact in double, abs[i] = |d·sc·code| + |dmin·m| (kquant.h), i < 256.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q2_k
