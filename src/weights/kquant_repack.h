// Q2_K / Q3_K / Q4_K / Q5_K / Q6_K matrices repacked at load for the interleaved K-quant kernels
// (MatrixLayout::kInterleaved16, as Q4_0 / Q8_0 in weights/repack.h): 16 rows per group, per
// super-block of 256 the 16 rows' scales together and their codes 4 elements per row in turn, so
// one 512-bit byte dot (vpdpbusd) makes int32 lane j = row j's partial dot of 4 elements with the
// activation's 4 codes broadcast; lane j ends as row j's exact sub-block dot. The group's bytes are
// the 16 plain super-blocks' bytes moved (a matrix repacked keeps its size; the file is unchanged).
// Every "vector" below is 64 bytes, byte 4j+i belonging to row j (its halves are rows 0..7 and
// 8..15: what a 256-bit kernel loads).
//
// Q4_K (kquant.h's 6-bit scales; q4_k.h), a group's super-block, 2304 bytes:
//   bytes 0-31      d of rows 0..15, IEEE binary16
//   bytes 32-63     dmin of rows 0..15
//   bytes 64-255    3 vectors: vector v, byte 4j+i = row j's scales[4v+i] (the packed 12 bytes)
//   bytes 256-2303  32 vectors: vector 8c+k, byte 4j+i = row j's qs[32c+4k+i] (low nibble element
//                   64c+4k+i, of sub-block 2c; high nibble element 64c+32+4k+i, sub-block 2c+1)
// Q5_K (q5_k.h), a group's super-block, 2816 bytes: Q4_K's with the 5th bits between the scales
// and the codes:
//   bytes 0-255     d, dmin and the 3 scale vectors, as Q4_K
//   bytes 256-767   8 vectors: vector k, byte 4j+i = row j's qh[4k+i] (bit 2c the 5th bit of
//                   element 64c+4k+i, bit 2c+1 of element 64c+32+4k+i: code vector 8c+k's)
//   bytes 768-2815  32 code vectors, as Q4_K's
// Q6_K (q6_k.h), a group's super-block, 3360 bytes; codes re-cut (the same bits, other bytes) so
// that a sub-block of 16 elements is 3 vectors and unpacks with few operations (u = the unsigned
// 6-bit code, code + 32):
//   bytes 0-31      d of rows 0..15
//   bytes 32-287    16 vectors of 16 bytes: vector s, byte j = row j's scales[s] (int8)
//   bytes 288-3359  per sub-block s = 0..15, 3 vectors v = 0..2 at 288 + (3s + v)·64: byte 4j+i =
//                   u of row j's element 16s+4v+i, shifted left by 2, | bits 2v..2v+1 of u of
//                   its element 16s+12+i (in bits 0-1)
// Q3_K (q3_k.h), a group's super-block, 1760 bytes; codes re-cut so that an activation block's 32
// elements are 3 vectors and unpack by masks (u = the unsigned 3-bit code, code + 4):
//   bytes 0-31      d of rows 0..15
//   bytes 32-223    3 vectors: vector v, byte 4j+i = row j's scales[4v+i] (the packed 12 bytes)
//   bytes 224-1759  per activation block b = 0..7, 3 vectors v = 0..2 at 224 + (3b + v)·64: byte 4j+i
//                   of vector v holds u of row j's element 32b+4v+i in bits 0-2 (chunk v of sub-block
//                   2b) and of its element 32b+16+4v+i in bits 3-5 (chunk v of sub-block 2b+1); bits
//                   6-7 hold the chunks 3: in vector 0 bits 0-1 of u of element 32b+12+i, in vector 1
//                   those of element 32b+28+i, in vector 2 bit 2 of each (bit 6, bit 7)
// Q2_K (q2_k.h), a group's super-block, 1344 bytes; codes re-cut so that the 4 sub-blocks of 16 of
// two activation blocks share 4 vectors, sub-block k's codes at bits 2k..2k+1 of each byte (read
// unshifted as 4^k·code by a byte dot):
//   bytes 0-31      d of rows 0..15
//   bytes 32-63     dmin of rows 0..15
//   bytes 64-319    4 vectors: vector p, byte 4j+i = row j's scales[4p+i] (sc in bits 0-3, m in 4-7)
//   bytes 320-1343  per quad p = 0..3 of sub-blocks (4p..4p+3: activation blocks 2p, 2p+1), 4 vectors
//                   c = 0..3 at 320 + (4p + c)·64: byte 4j+i, bits 2k..2k+1 = the code of row j's
//                   element 16(4p+k) + 4c + i
// The last rows % 16 rows follow the groups row-major, as in repack.h.
#pragma once

#include <cstdint>

#include "weights/matrix.h"

namespace kvq {

inline constexpr int64_t kQ4_KGroupScaleBytes = 256;  // d, dmin, the 3 scale vectors
inline constexpr int64_t kQ5_KGroupScaleBytes = 768;  // Q4_K's 256, then the 8 qh vectors
inline constexpr int64_t kQ5_KGroupHighBitsAt = 256;  // the qh vectors
inline constexpr int64_t kQ6_KGroupScaleBytes = 288;  // d, the 16 scale vectors; the codes follow
inline constexpr int64_t kQ6_KGroupScalesAt = 32;     // the scale vectors
inline constexpr int64_t kQ3_KGroupScaleBytes = 224;  // d, the 3 scale vectors; the codes follow
inline constexpr int64_t kQ2_KGroupScaleBytes = 320;  // d, dmin, the 4 scale vectors; the codes follow
inline constexpr int64_t kQ2_KGroupScalesAt = 64;     // the scale vectors

/// Whether `type` has an interleaved K-quant layout (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
bool IsInterleavedKQuant(WeightType type);

/// Whether LoadModel repacks the K-quants here (CanRepack, repack.h), the classifier included:
/// where the dispatched kernels run the groups with x86 byte dots (AVX2 or better), measured
/// faster than the row kernels one token at a time and in blocks (docs/performance.md). Elsewhere
/// the portable interleaved kernel gathers each row's block before the row kernel's arithmetic:
/// in the WebAssembly module it ran Q4_K 0.5× and Q6_K 0.35× as fast as the rows, so the plain rows
/// are kept. The same answer for all five types (every K-quant kernel file is built for the same
/// targets); defined beside Q4_K's kernels (q4_k_kernels.cc).
bool KQuantRepackPays();

/// rows [16][row_bytes] plain, super-block sb of each -> the group's super-block (bytes above).
void InterleaveKQuantBlock(WeightType type, const uint8_t* rows, int64_t row_bytes, int64_t sb, uint8_t* out);

/// The plain super-block of row j (0..15) from a group's super-block `group_block`.
void GatherKQuantBlock(WeightType type, const uint8_t* group_block, int64_t j, uint8_t* out);

}  // namespace kvq
