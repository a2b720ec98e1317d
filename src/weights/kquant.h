// What the K-quant weight types (Q2_K .. Q6_K: ggml super-blocks of 256 elements) share on the
// scalar side: one integer form of a block that every K-quant maps to, the exact weights it gives
// (ExactBlock), and the 6-bit scale/min unpacking of Q4_K and Q5_K (ggml's get_scale_min_k4).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/float_codes.h"

namespace kvq {

inline constexpr int64_t kKQuantBlockElems = 256;  // QK_K
inline constexpr int64_t kKQuantSubElems = 16;     // the finest sub-block of any K-quant

/// A K-quant block in one integer form: weight i = d·sc[i/16]·code[i] − dmin·m[i/16] exactly,
/// with integer sub-block scales and mins per 16 elements (a type with sub-blocks of 32 repeats
/// each one twice; a type without mins has m = 0 and dmin = 0). The scalar kernels and
/// ExactBlock read it; DequantizeBlock follows ggml's own arithmetic instead.
struct KQuantInts {
  float d = 0.0f;     // the super-block scale (f16 in the block)
  float dmin = 0.0f;  // the super-block min scale (f16; 0 where the type has none)
  int32_t sc[16] = {};
  int32_t m[16] = {};
  int8_t code[256] = {};  // [256] signed codes
};

/// The f16 at `p` (little-endian) as f32.
inline float KQuantHalf(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

/// w[i] = d·sc·code − dmin·m in double (exact: f16 scales times integers of ≤ 14 bits) and
/// abs[i] = |d·sc·code| + |dmin·m|, the magnitudes of the two terms the kernels add.
inline void KQuantExact(const KQuantInts& k, double* w, double* abs) {
  for (int64_t i = 0; i < kKQuantBlockElems; ++i) {
    const double main = static_cast<double>(k.d) * k.sc[i / 16] * k.code[i];
    const double min = static_cast<double>(k.dmin) * k.m[i / 16];
    w[i] = main - min;
    abs[i] = std::fabs(main) + std::fabs(min);
  }
}

/// Q4_K / Q5_K scales[12] -> sc[8], m[8] (6 bits each; ggml's get_scale_min_k4 for j = 0..7):
///   j < 4:  sc = s[j] & 63,                            m = s[j+4] & 63
///   j ≥ 4:  sc = (s[j+4] & 15) | (s[j−4] >> 6) << 4,   m = (s[j+4] >> 4) | (s[j] >> 6) << 4
/// Four bytes at a time: a = s[0..3], b = s[4..7], c = s[8..11].
inline void KQuantScalesMins6(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t sc_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);  // bits 6-7 of a -> 4-5
  const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
  std::memcpy(sc, &sc_lo, 4);
  std::memcpy(sc + 4, &sc_hi, 4);
  std::memcpy(m, &m_lo, 4);
  std::memcpy(m + 4, &m_hi, 4);
}

/// Q4_K's and Q5_K's header (d at byte 0, dmin at 2, scales[12] at 4) into the integer form's
/// d, dmin, sc[16] and m[16] (each 32-element scale and min for both its 16-element sub-blocks).
inline void KQuantHeader6(const uint8_t* block, KQuantInts* out) {
  out->d = KQuantHalf(block);
  out->dmin = KQuantHalf(block + 2);
  uint8_t sc[8], m[8];
  KQuantScalesMins6(block + 4, sc, m);
  for (int j = 0; j < 16; ++j) out->sc[j] = sc[j / 2], out->m[j] = m[j / 2];
}

/// The inverse of KQuantScalesMins6 (sc, m < 64), as ggml's quantize_row_q4_K_ref packs them.
inline void KQuantPackScalesMins6(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
}

/// Q3_K scales[12] -> sixteen 6-bit values u[j] (the scale is u[j] − 32), as ggml's
/// dequantize_row_q3_K unpacks them: low 4 bits s[j] & 15 (j < 8) or s[j − 8] >> 4 (j ≥ 8), high
/// 2 bits (s[8 + j % 4] >> 2·(j / 4)) & 3. Four bytes at a time: a = s[0..3], b = s[4..7], c = s[8..11].
inline void KQuantScales6x16(const uint8_t* s, uint8_t* u) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t out[4] = {(a & 0x0F0F0F0Fu) | (c & 0x03030303u) << 4,
                           (b & 0x0F0F0F0Fu) | ((c >> 2) & 0x03030303u) << 4,
                           ((a >> 4) & 0x0F0F0F0Fu) | ((c >> 4) & 0x03030303u) << 4,
                           ((b >> 4) & 0x0F0F0F0Fu) | ((c >> 6) & 0x03030303u) << 4};
  std::memcpy(u, out, 16);
}

/// round-half-even to int for |v| < 2^22 (ggml's nearest_int, without its bit trick).
inline int KQuantNearest(float v) { return static_cast<int>(std::nearbyint(v)); }

/// The simple reference quantiser's scales of Q4_K and Q5_K (codes 0..max_code per 32-element
/// sub-block): per sub-block j, scale = (max − min(0, lo)) / max_code and min = −min(0, lo); the
/// super-block d and dmin = their largest / 63 in f16; sc[j], m[j] = the 6-bit nearest multiples.
/// Writes d, dmin at block bytes 0-3 and the packed scales at 4-15; returns the f16-rounded d, dmin.
inline void KQuantChooseScalesMins6(const float* x, float max_code, uint8_t* block, uint8_t* sc, uint8_t* m,
                                    float* d_out, float* dmin_out) {
  float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    scale[j] = (hi - lo) / max_code;
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  const uint16_t d_bits = F32ToF16(max_scale / 63.0f), dmin_bits = F32ToF16(max_min / 63.0f);
  const float d = F16ToF32(d_bits), dmin = F16ToF32(dmin_bits);
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.0f ? std::clamp(KQuantNearest(scale[j] / d), 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0.0f ? std::clamp(KQuantNearest(min[j] / dmin), 0, 63) : 0);
  }
  std::memcpy(block, &d_bits, 2);  // little-endian host
  std::memcpy(block + 2, &dmin_bits, 2);
  KQuantPackScalesMins6(sc, m, block + 4);
  *d_out = d;
  *dmin_out = dmin;
}

}  // namespace kvq
