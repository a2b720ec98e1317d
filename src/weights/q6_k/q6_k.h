// Q6_K (ggml block_q6_K, ggml-common.h): super-blocks of 256 elements in 210 bytes, little-endian:
//   bytes 0-127    ql[128]: the low 4 bits of each 6-bit code
//   bytes 128-191  qh[64]: the high 2 bits, four codes per byte
//   bytes 192-207  scales[16]: int8 sub-block scales sc[j], one per 16 elements
//   bytes 208-209  d, the super-block scale, IEEE binary16
// Two halves of 128 elements (h = 0, 1; ql[64h ..], qh[32h ..], sc[8h ..]); for l < 32:
//   element 128h + l       code = (ql[64h + l]      & 15) | ((qh[32h + l] >> 0) & 3) << 4
//   element 128h + 32 + l  code = (ql[64h + 32 + l] & 15) | ((qh[32h + l] >> 2) & 3) << 4
//   element 128h + 64 + l  code = (ql[64h + l]      >> 4) | ((qh[32h + l] >> 4) & 3) << 4
//   element 128h + 96 + l  code = (ql[64h + 32 + l] >> 4) | ((qh[32h + l] >> 6) & 3) << 4
//   weight i = d · sc[i / 16] · (code − 32)
// Decoded as ggml's dequantize_row_q6_K: (d·sc)·(code − 32) in f32, exact (|d's significand| ≤
// 2047, |sc| ≤ 128, |code − 32| ≤ 32: a product below 2^24). Activation block b (elements 32b ..
// 32b+31) holds sub-blocks 2b and 2b+1.
#pragma once

#include <cstdint>

#include "weights/kquant.h"
#include "weights/weight_type.h"

namespace kvq::weights_q6_k {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [256], as ggml
/// ggml's quantize_row_q6_K_ref without its rmse search (make_qx_quants type 0): per 16, scale =
/// (the value of largest magnitude, signed) / −32; d = (the scale of largest magnitude) / −128
/// (f16); sc = nearest(scale / d) clamped to [−128, 127]; code = nearest(x / (d·sc)) clamped to
/// [−32, 31], + 32 (32 where d·sc = 0).
void QuantizeBlock(const float* x, uint8_t* block);
void Ints(const uint8_t* block, KQuantInts* out);  ///< the integer form (kquant.h), no mins
/// w[i] exact in double, abs[i] = |w[i]|, i < 256.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q6_k
