// fp8-e4m3: each number stored as one OCP FP8 E4M3 code, scaled by one f32 per tensor
// (tensor = one layer's K or V), fixed at calibration.
//
// Block = one row (rows_per_block = 1), 1 byte per number, no per-row scale:
//   [head 0: c0 c1 ... c(head_dim-1)] [head 1: ...] ...      c = E4M3 code (S.EEEE.MMM)
// Outside the rows: tensor_scale (f32), kept by the cache beside the pages (4 bytes per tensor).
//
// Calibration: tensor_scale = amax / 448 over the first block written (normally the prefill), so
// that block's largest magnitude maps to E4M3's largest value; an all-zero block gives 1.0.
// Encoding: code = roundE4M3(x / tensor_scale), round to nearest even, saturating at ±448 — later
// values larger than the calibration block saturate. Decoding: E4M3(code) × tensor_scale.
#pragma once

#include "kvq/format.h"

namespace kvq {
const FormatDesc& Fp8E4m3Format();
const CodecKernels& Fp8E4m3Kernels();  ///< SIMD kernels, best target here
}  // namespace kvq
