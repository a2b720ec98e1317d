// Q4_0 / Q8_0 / Q1_0 / Q2_0 matrices repacked at load for the interleaved kernels (MatrixLayout::kInterleaved16):
// 16 rows per group, per block the 16 rows' f16 scales together, then their codes 4 elements per
// row in turn, so one 512-bit byte dot (vpdpbusd; on AVX2 two 256-bit maddubs + madd, one per
// half) makes int32 lane j = row j's partial dot of 4 elements with the activation's 4 codes
// broadcast, and after the block's last one lane j holds row j's exact block dot I_b: one
// convert and one FMA by a vector of 16 scale products then serve 16 dots. The file format is
// unchanged: only the bytes in memory move.
//
// A group of 16 rows, block b (block b of the group starts at b·16·block_bytes — for Q1_0 at
// weights_q1_0::RepackedBlockAt(b)·16·block_bytes, its blocks in the lookup kernel's order; the
// same bytes as the 16 plain blocks, so a matrix repacked keeps its size):
//   bytes 0-31   d of rows 0..15, IEEE binary16
//   Q4_0         4 vectors of 64 bytes: vector k, byte 4j+i = row j's qs[4k+i] (its low nibble is
//                element 4k+i, its high nibble element 16+4k+i: ggml's byte, copied)
//   Q8_0         8 vectors of 64 bytes: vector k, byte 4j+i = row j's qs[4k+i] (element 4k+i)
//   Q1_0         4 vectors of 64 bytes: vector k, byte 4j+i = row j's qs[4k+i] (its bit t is element
//                32k+8i+t: vector k holds activation block k of the 128-element block; q1_0.h)
//   Q2_0         4 vectors of 64 bytes: vector k, byte 4j+e, bits 2p..2p+1 = row j's 2-bit field of
//                element 16p+4k+e (p < 4; a bit transpose of the block's 16 code bytes, so that
//                chunk 4p+k of 4 consecutive elements unpacks by one shift and one AND, as Q4_0's
//                nibbles do; interleaved_rows-inl.h)
// (each 64-byte vector's halves are the rows 0..7 and 8..15: what a 256-bit kernel loads.)
// The last rows % 16 rows are not interleaved: they follow the groups row-major, at the offset
// they have in the plain matrix (rows · row_bytes is the same either way), and the row kernels
// (quant_rows-inl.h) serve them.
#pragma once

#include <cstdint>

#include "weights/matrix.h"

namespace kvq {

inline constexpr int64_t kInterleaveRows = 16;

/// Whether `w` (row-major) has a repacked layout: Q4_0, Q8_0, Q1_0 or Q2_0 (or Q4_K, Q5_K or Q6_K, whose
/// groups are in weights/kquant_repack.h) with at least kInterleaveRows rows, each only where its
/// dispatched kernels make the layout pay (weights_q4_0::RepackPays, weights_q8_0::RepackPays,
/// weights_q1_0::RepackPays, weights_q2_0::RepackPays, KQuantRepackPays). RepackMatrix serves
/// every such type on any target.
bool CanRepack(const Matrix& w);

/// Writes the kInterleaved16 form of the row-major `w` (CanRepack) to out [MatrixBytes of w] and
/// returns the Matrix viewing it. out must not overlap w.data.
Matrix RepackMatrix(const Matrix& w, uint8_t* out);

/// The plain (file-layout) bytes of block `block` of row `row` of w, in either layout: a pointer
/// into w.data for a row-major matrix or a tail row, else the block gathered into scratch
/// [block_bytes] and scratch returned. The one place the decoders and references read blocks.
const uint8_t* PlainBlock(const Matrix& w, int64_t row, int64_t block, uint8_t* scratch);

/// Bytes of `w`'s data (rows · row bytes; the same in both layouts).
int64_t MatrixDataBytes(const Matrix& w);

}  // namespace kvq
