// Q4_1 (ggml block_q4_1): blocks of 32 elements in 20 bytes, little-endian:
//   bytes 0-1   d, the block's scale, IEEE binary16
//   bytes 2-3   m, the block's min (its offset), IEEE binary16
//   bytes 4-19  qs[0..15], two unsigned 4-bit codes per byte
//   element i    (0 ≤ i < 16) = d · (qs[i] & 0x0F) + m
//   element i+16              = d · (qs[i] >> 4) + m
//   (elements i and i+16 share a byte: the low nibbles are the first half of the block)
// Decoded in f32 as ggml's dequantize_row_q4_1: d·n is exact (11 + 4 significant bits), the
// add of m rounds once. The exact weight d·n + m is exact in double (both terms are multiples
// of 2^-24 below 2^22).
// MatVec (matvec.h, quantised activation): per activation block, d·d_x·Σ n·q + m·d_x·Σq, the
// nibble dot exact in int32 and Σq the activation's exact block sum (QuantizedX::sum). The f32
// steps (weights/quant_rows-inl.h, "a type with a min"): a dot term is rounded at most
// n_blocks + 5 times, a min term at most n_blocks/8 + 5 times, each relative to a term of
// magnitude ≤ d_x·(|d·n| + |m|)·|q|, the abs of ExactBlock: matvec_roundings = 5.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_q4_1 {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [32]
/// ggml's quantize_row_q4_1_ref: min and max of the block, d = (max − min) / 15, m = min,
/// nibble = min(15, trunc((x − min) / d + 0.5)) with 1/d taken as 0 when d = 0.
void QuantizeBlock(const float* x, uint8_t* block);
/// w[i] = d·n_i + m in double (exact), abs[i] = |d·n_i| + |m|, i < 32.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q4_1
