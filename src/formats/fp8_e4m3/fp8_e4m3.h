// fp8-e4m3: each number stored as one OCP FP8 E4M3 code scaled by a power of two 2^e (an E8M0
// exponent byte, as in OCP MX), e chosen from the block's own amax so no number saturates — a
// decode-only cache stays in range however its later rows grow (the per-tensor scale calibrated on
// the first block, FormatId 4, saturated 7-17% of later numbers; see docs/formats.md).
//
//   e  = the smallest integer in [-126, 119] with amax <= 448 · 2^e      (amax = 0: e = -126)
//   c  = roundE4M3(x · 2^-e)       RNE, saturating at ±448 (not reached: |x| <= amax)
//   x' = E4M3(c) · 2^e
// Scaling by a power of two is exact, so x' is x rounded to E4M3's 3 mantissa bits, E4M3's
// subnormals starting at 2^(e-6): |x − x'| <= max(|x| · 2^-4, 2^(e-10)). (e stops at 119 so the
// SIMD kernels' row factor 2^(e+8) is a finite f32; only |x| > 448 · 2^119 ≈ 3.0e38 saturates.)
// Exponent byte b = e + 127 (E8M0's bias), so b is in [1, 246].
//
// Keys — block = one group of G = 32 rows (kFp8KeyGroupRows); per head, in head order:
//   [b: 1 byte, amax over the head's 32 × head_dim numbers] [32 rows × head_dim codes, row-major]
// then zero bytes up to a multiple of 32: block bytes = roundup(n_kv_heads · (1 + 32 · head_dim),
// 32) — whole bytes per position, as kvq's accounting requires (kvq/kv_memory.h); for n_kv_heads
// <= 32 that is 32 · n_kv_heads · head_dim + 32. Until a group has all 32 rows its rows are the
// residual, held in f32 by whoever stores the rows (formats/row_sequence.h, the cache), exactly as
// for KIVI keys.
// Values — block = one row: [b: 1 byte, amax over the row's n_kv_heads × head_dim numbers]
//   [n_kv_heads × head_dim codes, heads in order]: 1 + n_kv_heads · head_dim bytes.
// Codes are S.EEEE.MMM (bias 7; 0x7F/0xFF NaN never written for finite input).
// Bits per number (complete groups, n_kv_heads <= 32): keys and values both 8 + 8 / (n_kv_heads ·
// head_dim) — 8.25 at 4 × 8 (stories260K), 8.0078 at 8 × 128.
#pragma once

#include "kvq/format.h"

namespace kvq {
inline constexpr int32_t kFp8KeyGroupRows = 32;  ///< G
const FormatDesc& Fp8E4m3Format();
const CodecKernels& Fp8E4m3KeyKernels();    ///< SIMD kernels, best target here
const CodecKernels& Fp8E4m3ValueKernels();  ///< SIMD kernels, best target here
}  // namespace kvq
