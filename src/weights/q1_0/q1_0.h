// Q1_0 (PrismML's llama.cpp fork, Bonsai models; ggml type 41, block_q1_0): blocks of 128
// elements in 18 bytes, little-endian:
//   bytes 0-1    d, the block's scale, IEEE binary16
//   bytes 2-17   qs[0..15], one sign bit per element, least significant bit first
//   element j    (0 ≤ j < 128) = bit (j % 8) of qs[j / 8] ? +d : −d
// Every decoded weight (±d) is exact in f32. The matvec quantises the activation per block of 32
// (matvec.h), four activation blocks per weight block; a weight's code is ±1.
//
// Kernel numerics (matvec_roundings = 4). Per row and activation block b the integer
// I_b = Σ_i code_i·q_i = 2·Σ_{bit set} q_i − Σ_i q_i is exact in int32 lanes (AVX3: four
// rows' lanes folded further in integers, still exact). Per weight block B and row,
// t_B = Σ_{b∈B} d_x,b·(lane partials of I_b) in f32, one multiply then FMAs: ≤ 2 roundings per
// term on AVX3 (two vectors of two activation blocks), ≤ 4 on AVX2 (four of one). Then
// acc += d_w·t_B by FMA (1 rounding, then ≤ n_wb − 1 more as later blocks are added,
// n_wb = cols / 128), then a row's lanes summed (AVX3: 4 lanes, 2; AVX2: 8 lanes, 3). A term
// takes at most n_wb + 7 ≤ n_blocks + 4 roundings (n_blocks = cols / 32 = 4·n_wb), each relative to
// a partial of magnitude ≤ |d_w·d_x|·Σ|code·q| over its lane, so the matvec.h bound
// γ_{n_blocks+4}·abs_sum holds (abs_i = |w_i| = |d|). The scalar targets take s = d_w·d_x, then
// acc += s·I_b: ≤ 3 + n_blocks − 1 roundings. AVX3_DL (one bit position at a time): I_b from
// byte dots of 2·(sign bit) against the activation codes of the same elements, exact; per group of four weight blocks
// acc += (d_w·d_x)·I_b in lane b (2 roundings), ≤ n_wb/4 later FMAs, 16 lanes summed (4): a term
// takes ≤ n_wb/4 + 6 ≤ n_blocks + 4 roundings.
// On AVX3_DL, QuantizedX::offset holds the activation codes permuted by bit position, not lane
// offsets (q1_0_kernels.cc, ActivationOffsets): per group g of m ≤ 4 weight blocks of a token,
// byte 512g + 16m·t + 16L + 4s + j = code 512g + 128L + 32s + 8j + t. AVX2 reads lane offsets (−Σ of 4 codes) there,
// the 128-bit targets the codes permuted per weight block (byte 128wb + 16t + j = code
// 128wb + 8j + t), AVX3 and the scalar targets nothing; on AVX3_DL the bytes that follow (cols·8 of them) hold the
// lookup tables below.
// Repacked (MatrixLayout::kInterleaved16, repack.h; LoadModel repacks Q1_0 where RepackPays):
// AVX3_DL looks up partial sums instead of multiplying bit by bit: per token and activation block,
// for each 4 consecutive elements, the sums of their codes' low nibbles and high parts over every
// subset (16 entries each, twice the sums, exact in a byte), built once per token in
// activation_offsets; per 16 rows × 32 weights one vector of sign bytes gives the tables' indices
// (a shift and two ternary-logic ops), 4 byte permutes (vpermb), 2 byte adds and 2 byte dots
// (vpdpbusd by 1 and by 16) make each row's I_b exactly, and the float operations are the row
// kernel's on the same values in the same order, lane for lane (row j's 16 lanes, visited 4 at a
// time so that up to 4 groups of 16 rows share each table load, summed as _mm512_reduce_add_ps
// sums them; the kernel is in q1_0_lookup-inl.h): the same bits as RowGroup on the plain rows, so
// the bound above holds unchanged. Other targets copy each 16-row group back to plain rows and
// run their row kernel: their row kernel's bits too.
#pragma once

#include <cstdint>

#include "weights/weight_type.h"

namespace kvq::weights_q1_0 {
inline constexpr int64_t kBlockElems = 128;
inline constexpr int64_t kBlockBytes = 18;
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [128]
/// PrismML's reference quantiser: d = f16(mean |x| over the block) (γ = mean|w|); bit j = 1 when
/// x_j ≥ 0: the tie at zero goes to +d (+0 and −0 alike); a NaN gets −d (x ≥ 0 is false).
void QuantizeBlock(const float* x, uint8_t* block);
/// w[j] = ±d in double (exact), abs[j] = |w[j]|, j < 128.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
/// Whether the kernels dispatched here read the repacked layout with lookup tables (AVX3_DL with
/// GFNI), so repacking at load pays: elsewhere a repacked group is copied back to plain rows per
/// call, slower than reading the plain rows.
bool RepackPays();
/// Where weight block wb (of n_wb) of a row sits in a repacked 16-row group, in group blocks from
/// the group's start (repack.h): the blocks in the order the lookup kernel visits them, wb ≡ 0
/// mod 4 first, then ≡ 1, 2 and 3, each in increasing wb (its passes, q1_0_lookup-inl.h), so that
/// every pass reads its group's bytes front to back — a stream the hardware prefetcher follows,
/// where in wb order it read every fourth block.
inline int64_t RepackedBlockAt(int64_t wb, int64_t n_wb) {
  int64_t at = wb / 4;
  for (int64_t pass = 0; pass < wb % 4; ++pass) at += (n_wb - pass + 3) / 4;  // blocks ≡ pass mod 4
  return at;
}
}  // namespace kvq::weights_q1_0
