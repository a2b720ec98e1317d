// Q4_K (ggml block_q4_K, ggml-common.h): super-blocks of 256 elements in 144 bytes, little-endian:
//   bytes 0-1     d, the super-block scale, IEEE binary16
//   bytes 2-3     dmin, the super-block min scale, binary16
//   bytes 4-15    scales[12]: eight 6-bit sub-block scales sc[j] and eight 6-bit mins m[j]
//                 (j = 0..7, one per 32 elements), packed as ggml's get_scale_min_k4 reads them:
//                 j < 4: sc = s[j] & 63, m = s[j+4] & 63;
//                 j ≥ 4: sc = (s[j+4] & 15) | (s[j−4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4
//   bytes 16-143  qs[128], two 4-bit codes per byte: per 64 elements (chunk c = 0..3, qs[32c ..
//                 32c+31]), the 32 low nibbles, then the 32 high nibbles of the same 32 bytes
//   element 64c + l      (l < 32) = d·sc[2c]   · (qs[32c + l] & 15) − dmin·m[2c]
//   element 64c + 32 + l          = d·sc[2c+1] · (qs[32c + l] >> 4) − dmin·m[2c+1]
// Decoded as ggml's dequantize_row_q4_K in f32: d1 = d·sc (exact), m1 = dmin·m (exact), then
// d1·nibble (exact) − m1 (one rounding). Sub-block j is activation block j of the super-block
// (matvec.h), so its scale and min apply to one activation block each.
#pragma once

#include <cstdint>

#include "weights/kquant.h"
#include "weights/weight_type.h"

namespace kvq::weights_q4_k {
void DequantizeBlock(const uint8_t* block, float* out);  ///< block -> out [256], as ggml
/// A reference quantiser (simpler than ggml's make_qkx2 search): per sub-block of 32,
/// lo = min(0, min x), scale = (max x − lo) / 15, min = −lo; d = max scale / 63 and dmin =
/// max min / 63 (f16); sc, m = nearest(scale / d), nearest(min / dmin) clamped to [0, 63];
/// code = nearest((x + dmin·m) / (d·sc)) clamped to [0, 15] (0 where d·sc = 0).
void QuantizeBlock(const float* x, uint8_t* block);
void Ints(const uint8_t* block, KQuantInts* out);  ///< the integer form (kquant.h)
/// w[i] exact in double, abs[i] = |d·sc·code| + |dmin·m| (kquant.h), i < 256.
void ExactBlock(const uint8_t* block, double* w, double* abs);
const WeightKernels& Kernels();  ///< row kernels, best target here
}  // namespace kvq::weights_q4_k
