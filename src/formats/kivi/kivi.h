// int4-kivi / int2-kivi: KIVI's layout (Liu et al. 2024, arXiv 2402.02750). Keys are quantised per
// channel over groups of G = 32 tokens; values per token. Both are asymmetric b-bit codes:
//
//   z   = roundF16(min)                    min, max over the numbers sharing the scale
//   s   = roundF16((max - z) / (2^b - 1))
//   raw = clamp(round((x - z) / s), 0, 2^b - 1)        round = half to even; s = 0 → raw = 0
//   x'  = raw · s + z
//   (z and s saturate to ±65504 if the values exceed f16's range.)
//
// Keys — block = one group of G = 32 rows; per head, in head order:
//   [s: f16 × head_dim][z: f16 × head_dim][codes: 32 rows × head_dim · b / 8 bytes]
//   one (s, z) pair per channel, shared by the group's 32 tokens. Until a group has all 32 rows,
//   its rows are the residual, held in f32 by whoever stores the rows (format/row_sequence.h, the
//   cache), exactly as KIVI keeps the newest tokens in full precision.
// Values — block = one row; per head: [s: f16][z: f16][codes: head_dim · b / 8 bytes].
// Codes are packed little-endian within each byte (int4: element 2j in the low nibble of byte j).
//
// Bits per number (complete groups): keys b + 32/G, values b + 32/head_dim. Seed 004 prints the
// per-token figure (b + 16/head_dim) for its KIVI rows; kvq prints the exact figure.
#pragma once

#include "kvq/format.h"

namespace kvq {
inline constexpr int32_t kKiviGroupRows = 32;  ///< G
const FormatDesc& Int4KiviFormat();
const FormatDesc& Int2KiviFormat();
const CodecKernels& Int4KiviKeyKernels();  ///< SIMD kernels, best target here
const CodecKernels& Int2KiviKeyKernels();  ///< SIMD kernels, best target here
const CodecKernels& Int4KiviValueKernels();  ///< SIMD kernels, best target here
const CodecKernels& Int2KiviValueKernels();  ///< SIMD kernels, best target here
}  // namespace kvq
