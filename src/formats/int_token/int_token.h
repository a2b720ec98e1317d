// int8 / int4 / int2 per token: seed 000's 4-bit row format, generalised to b bits.
// Symmetric offset-binary codes with one f16 scale per head row (head_dim numbers):
//
//   s   = roundF16(max|x| / (2^(b-1) - 1))            max over the head row; RNE to f16
//   raw = clamp(round(x / s) + 2^(b-1), 0, 2^b - 1)   round = half to even
//   x'  = (raw - 2^(b-1)) · s
//
// A zero row has s = 0: every raw is 2^(b-1) and decodes to 0 (no division by zero). Should
// max|x| / (2^(b-1) - 1) overflow f16, s saturates to 65504 (larger values then clamp).
//
// Block = one row (rows_per_block = 1); per head, in head order:
//   [s: f16, 2 bytes LE] [codes: head_dim · b / 8 bytes]
//   codes packed little-endian within a byte: element i at bits (i mod (8/b))·b of byte i/(8/b);
//   for int4, element 2j is the LOW nibble of byte j and element 2j+1 the high nibble.
// Bytes per head row = 2 + head_dim · b / 8. Seed 000 counts 544 bytes per layer-position for
// int4 at 4 heads × 128 (a 4-byte slot per scale); kvq packs the f16 scale in 2 bytes: 528.
#pragma once

#include "kvq/format.h"

namespace kvq {
const FormatDesc& Int8Format();
const FormatDesc& Int4Format();
const FormatDesc& Int2Format();
const CodecKernels& Int8Kernels();  ///< SIMD kernels, best target here
const CodecKernels& Int4Kernels();  ///< SIMD kernels, best target here
const CodecKernels& Int2Kernels();  ///< SIMD kernels, best target here
}  // namespace kvq
