// Q2_0 (PrismML's llama.cpp fork, Bonsai models; ggml type 42, block_q2_0): blocks of 64
// elements in 18 bytes, little-endian:
//   bytes 0-1    d, the block's scale, IEEE binary16
//   bytes 2-17   qs[0..15], four 2-bit codes per byte, lowest bits first
//   element j    (0 ≤ j < 64) = d · (((qs[j / 4] >> (2·(j % 4))) & 3) − 1)
//   (codes 0, 1, 2, 3 -> −d, 0, +d, +2d; the reference quantiser is ternary and never writes 3,
//   but every code decodes and the kernels take all four)
// Every decoded weight is exact in f32. The matvec quantises the activation per block of 32
// (matvec.h), two activation blocks per weight block; a weight's code is the 2-bit code − 1.
//
// Kernel numerics (matvec_roundings = 4). Per row and activation block b,
// I_b = Σ_i (c_i − 1)·q_i is exact in int32 lanes (x86: Σ c_i·q_i from unsigned codes, started
// from −Σq over the lane's elements, QuantizedX::offset). Per weight block B and row,
// t_B = Σ_{b∈B} d_x,b·(lane partials of I_b) (≤ 2 roundings per term), acc += d_w·t_B by FMA (1,
// then ≤ n_wb − 1 more, n_wb = cols / 64), then a sum over 8 lanes (3): at most
// 2 + n_wb + 3 = n_blocks/2 + 5 ≤ n_blocks + 4 roundings per term (n_blocks = cols / 32 ≥ 2),
// each relative to a partial of magnitude ≤ |d_w·d_x|·Σ|code·q| over its lane: the matvec.h
// bound γ_{n_blocks+4}·abs_sum, abs_i = |w_i|. Scalar targets: s = d_w·d_x, acc += s·I_b.
// Repacked (MatrixLayout::kInterleaved16, repack.h, a bit transpose of each block's codes; LoadModel
// repacks Q2_0 where RepackPays): the 16-row-group kernel Q4_0 and Q8_0 use
// (interleaved_rows-inl.h), lane j of one accumulator = row j's whole I_b, exact, then
// acc = fma(d_w·d_x, I_b, acc) per activation block: n_blocks + 1 roundings per term, the same bits
// on every target (a different order from the row kernels', so not their bits, as matvec.h allows
// for a layout). The rows % 16 tail rows keep the row kernels.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_q2_0 {
inline constexpr int64_t kBlockElems = 64;
inline constexpr int64_t kBlockBytes = 18;
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [64]
/// The reference (ternary) quantiser: d = f16(max |x| over the block); code_j = 1 +
/// round(x_j·(1/d)) with round half away from zero, clamped to [0, 2] (so −1, 0, +1 times d; a
/// block of zeros gets d = 0 and codes 1; a NaN gets code 1). Code 3 (+2d) is never written.
void QuantizeBlock(const float* x, uint8_t* block);
/// w[j] = d·(code − 1) in double (exact), abs[j] = |w[j]|, j < 64.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
/// Whether LoadModel repacks Q2_0 here (repack.h): the kernels dispatched here run the interleaved
/// layout with 512-bit byte dots (AVX3_DL). Elsewhere the plain rows are kept.
bool RepackPays();
}  // namespace kvq::weights_q2_0
