// fp4-e2m1: OCP FP4 E2M1 numbers with one FP8 E4M3 scale per 16 consecutive numbers of the row
// (the layout DeepSeek reports for its KV cache; seed 004 gives the rounding code).
//
//   s = roundE4M3(amax / 6)      amax over the 16 numbers; RNE, saturating; s = 0 → s = 2^-9
//   e = roundE2M1(x / s)         RNE, saturating at ±6
//   x' = E2M1(e) · s
//
// Block = one row (rows_per_block = 1), cut into groups of 16 numbers in row order (heads in
// order, so a group may span heads when head_dim < 16); per group of 16, 9 bytes:
//   [s: E4M3 code, 1 byte] [8 bytes: element 2j in the LOW nibble of byte j, 2j+1 in the high]
//   E2M1 nibble = S.EE.M. Row bytes = (n_kv_heads · head_dim / 16) · 9: 4.5 bits per number.
// Shape rule: n_kv_heads · head_dim a multiple of 16, and head_dim a multiple of 16 or a
// divisor of 16, so a head never straddles a group boundary partially.
#pragma once

#include "kvq/format.h"

namespace kvq {
inline constexpr int32_t kFp4GroupElems = 16;
const FormatDesc& Fp4E2m1Format();
const CodecKernels& Fp4E2m1Kernels();  ///< SIMD kernels, best target here
}  // namespace kvq
