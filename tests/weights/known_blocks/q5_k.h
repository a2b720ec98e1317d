// Known-answer Q5_K blocks for the weight-type conformance suite: bytes packed here from chosen
// sub-block scales, mins and per-element 5-bit codes the way ggml's quantize_row_q5_K_ref packs
// them (not by kvq's decoder or encoder), and the values from those parameters by ggml's
// arithmetic (d1 = d·sc, m1 = dmin·m, d1·code − m1 in f32), with literal spot checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// d, dmin as f16 bits (and f32 values), sc[8], m[8] < 64, L[256] < 32 (element e: sub-block e / 32).
inline KnownBlock Q5KBlock(uint16_t d_bits, float d, uint16_t dmin_bits, float dmin, const int (&sc)[8],
                           const int (&m)[8], const std::vector<int>& L) {
  KnownBlock k;
  for (uint8_t b : U16(d_bits)) k.bytes.push_back(b);
  for (uint8_t b : U16(dmin_bits)) k.bytes.push_back(b);
  uint8_t scales[12] = {};
  for (int j = 0; j < 8; ++j) {  // as Q4_K (ggml's quantize_row_q4_K_ref / q5_K_ref)
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(sc[j]);
      scales[j + 4] = static_cast<uint8_t>(m[j]);
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
  for (uint8_t b : scales) k.bytes.push_back(b);
  uint8_t qh[32] = {}, ql[128] = {};
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0, o = 0; n < 256; n += 64, o += 32) {  // ggml's packing of L into qh and qs
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) l1 -= 16, qh[j] |= m1;
      if (l2 > 15) l2 -= 16, qh[j] |= m2;
      ql[o + j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2), m2 = static_cast<uint8_t>(m2 << 2);
  }
  for (uint8_t b : qh) k.bytes.push_back(b);
  for (uint8_t b : ql) k.bytes.push_back(b);
  for (int e = 0; e < 256; ++e) {
    const float d1 = d * static_cast<float>(sc[e / 32]), m1f = dmin * static_cast<float>(m[e / 32]);
    k.values.push_back(d1 * static_cast<float>(L[e]) - m1f);
  }
  return k;
}

inline std::vector<KnownBlock> Q5_KKnownBlocks() {
  std::vector<KnownBlock> out;
  std::vector<int> ramp(256);  // 0..31 in every sub-block, shifted per sub-block
  for (int e = 0; e < 256; ++e) ramp[e] = (e + 3 * (e / 32)) % 32;
  const int sc_a[8] = {1, 63, 2, 33, 17, 63, 5, 40};
  const int m_a[8] = {0, 63, 7, 1, 63, 32, 16, 3};
  // (a) d = dmin = 1: sc·code − m exactly.
  out.push_back(Q5KBlock(0x3C00, 1.0f, 0x3C00, 1.0f, sc_a, m_a, ramp));
  EXPECT_EQ(out.back().values[31], 31.0f);                // sub-block 0, code 31
  EXPECT_EQ(out.back().values[61], 63.0f * 0 - 63.0f);    // sub-block 1, code (61 + 3) % 32 = 0
  EXPECT_EQ(out.back().values[255], 40.0f * 20 - 3.0f);   // sub-block 7, code (255 + 21) % 32 = 20
  // qh[16]: element 16 (code 16: bit 0), 48 (code 19: bit 1), 80 (22: bit 2), 112 (25: bit 3),
  // 144 (28: bit 4), 176 (31: bit 5), 208 (2: —), 240 (5: —).
  EXPECT_EQ(out.back().bytes[16 + 16], 0x3F);
  // (b) negative d = −1, largest dmin 65504.
  const int sc_b[8] = {63, 0, 1, 62, 31, 32, 15, 16};
  out.push_back(Q5KBlock(0xBC00, -1.0f, 0x7BFF, 65504.0f, sc_b, m_a, ramp));
  EXPECT_EQ(out.back().values[63], -65504.0f * 63);  // sub-block 1: sc 0 (−0·2), m 63
  // (c) subnormal d = 2^-24, dmin = 3·2^-24.
  out.push_back(Q5KBlock(0x0001, 0x1p-24f, 0x0003, 3 * 0x1p-24f, sc_a, m_a, ramp));
  // (d) rounding: d = 0x3555 (0.333251953125), dmin = 0x2E66 (0.0999755859375), codes 31 − ramp.
  std::vector<int> down(256);
  for (int e = 0; e < 256; ++e) down[e] = 31 - ramp[e];
  out.push_back(Q5KBlock(0x3555, 0.333251953125f, 0x2E66, 0.0999755859375f, sc_b, m_a, down));
  return out;
}

}  // namespace kvq::test
