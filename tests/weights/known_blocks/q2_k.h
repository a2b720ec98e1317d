// Known-answer Q2_K blocks for the weight-type conformance suite: bytes packed here from chosen
// sub-block scales, mins and per-element 2-bit codes the way ggml's quantize_row_q2_K packs them
// (not by kvq's decoder or encoder), values from those parameters by ggml's arithmetic
// (dl = d·sc, ml = dmin·m, dl·code − ml in f32), with literal spot checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// d, dmin as f16 bits (and f32 values), sc[16], m[16] < 16, L[256] < 4.
inline KnownBlock Q2KBlock(uint16_t d_bits, float d, uint16_t dmin_bits, float dmin, const int (&sc)[16],
                           const int (&m)[16], const std::vector<int>& L) {
  KnownBlock k;
  for (int j = 0; j < 16; ++j) k.bytes.push_back(static_cast<uint8_t>(sc[j] | (m[j] << 4)));
  uint8_t qs[64] = {};
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
  for (uint8_t b : qs) k.bytes.push_back(b);
  for (uint8_t b : U16(d_bits)) k.bytes.push_back(b);
  for (uint8_t b : U16(dmin_bits)) k.bytes.push_back(b);
  for (int e = 0; e < 256; ++e) {
    const float dl = d * static_cast<float>(sc[e / 16]), ml = dmin * static_cast<float>(m[e / 16]);
    k.values.push_back(dl * static_cast<float>(L[e]) - ml);
  }
  return k;
}

inline std::vector<KnownBlock> Q2_KKnownBlocks() {
  std::vector<KnownBlock> out;
  std::vector<int> ramp(256);  // 0..3 in every sub-block, shifted per sub-block
  for (int e = 0; e < 256; ++e) ramp[e] = (e + e / 16) % 4;
  const int sc_a[16] = {15, 0, 1, 14, 2, 13, 3, 12, 4, 11, 5, 10, 6, 9, 7, 8};
  const int m_a[16] = {0, 15, 7, 8, 1, 14, 2, 13, 3, 12, 4, 11, 5, 10, 6, 9};
  // (a) d = dmin = 1: sc·code − m exactly.
  out.push_back(Q2KBlock(0x3C00, 1.0f, 0x3C00, 1.0f, sc_a, m_a, ramp));
  EXPECT_EQ(out.back().values[3], 45.0f);    // 15·3 − 0
  EXPECT_EQ(out.back().values[16], -15.0f);  // sub-block 1: 0·1 − 15
  EXPECT_EQ(out.back().bytes[1], 0xF0);      // sc 0, m 15
  EXPECT_EQ(out.back().bytes[16], 0 | 2 << 2 | 0 << 4 | 2 << 6);  // codes of elements 0, 32, 64, 96
  // (b) negative d = −1, largest dmin 65504: −sc·code − 65504·m, exact.
  out.push_back(Q2KBlock(0xBC00, -1.0f, 0x7BFF, 65504.0f, sc_a, m_a, ramp));
  EXPECT_EQ(out.back().values[19], -65504.0f * 15);  // sub-block 1 (sc 0): −0·… − 65504·15
  // (c) subnormal d = 2^-24, dmin = 3·2^-24.
  out.push_back(Q2KBlock(0x0001, 0x1p-24f, 0x0003, 3 * 0x1p-24f, sc_a, m_a, ramp));
  EXPECT_EQ(out.back().values[3], 45 * 0x1p-24f);
  // (d) rounding: d = 0x3555 (0.333251953125), dmin = 0x2E66 (0.0999755859375).
  out.push_back(Q2KBlock(0x3555, 0.333251953125f, 0x2E66, 0.0999755859375f, sc_a, m_a, ramp));
  return out;
}

}  // namespace kvq::test
