// Known-answer Q4_K blocks for the weight-type conformance suite: bytes packed here from chosen
// sub-block scales, mins and per-element codes the way ggml's quantize_row_q4_K_ref packs them
// (not by kvq's decoder or encoder), and the values from those parameters by ggml's arithmetic
// (d1 = d·sc, m1 = dmin·m, d1·code − m1 in f32), with literal spot checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {


// d, dmin as f16 bits (with their f32 values), sc[8], m[8] < 64, code[256] < 16: element e is in
// sub-block e / 32 and its code is code[e].
inline KnownBlock Q4KBlock(uint16_t d_bits, float d, uint16_t dmin_bits, float dmin, const int (&sc)[8],
                           const int (&m)[8], const std::vector<int>& code) {
  std::vector<uint8_t> scales(12, 0);
  for (int j = 0; j < 8; ++j) {  // ggml's quantize_row_q4_K_ref packing
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(sc[j]);
      scales[j + 4] = static_cast<uint8_t>(m[j]);
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
  KnownBlock k{U16(d_bits), {}};
  const std::vector<uint8_t> dm = U16(dmin_bits);
  k.bytes.insert(k.bytes.end(), dm.begin(), dm.end());
  k.bytes.insert(k.bytes.end(), scales.begin(), scales.end());
  for (int j = 0; j < 256; j += 64) {
    for (int l = 0; l < 32; ++l) k.bytes.push_back(static_cast<uint8_t>(code[j + l] | code[j + l + 32] << 4));
  }
  for (int e = 0; e < 256; ++e) {
    const float d1 = d * static_cast<float>(sc[e / 32]);
    const float m1 = dmin * static_cast<float>(m[e / 32]);
    k.values.push_back(d1 * static_cast<float>(code[e]) - m1);
  }
  return k;
}

inline std::vector<KnownBlock> Q4_KKnownBlocks() {
  std::vector<KnownBlock> out;
  // Codes: a ramp mod 16 shifted per sub-block (0 and 15 in every sub-block).
  std::vector<int> ramp(256);
  for (int e = 0; e < 256; ++e) ramp[e] = (e + e / 32) % 16;
  // (a) d = dmin = 1: value = sc·code − m exactly. Scales and mins differ in every position and
  // reach 63 in both the low (j < 4) and the split (j ≥ 4) packing.
  const int sc_a[8] = {1, 63, 2, 33, 17, 63, 5, 40};
  const int m_a[8] = {0, 63, 7, 1, 63, 32, 16, 3};
  out.push_back(Q4KBlock(0x3C00, 1.0f, 0x3C00, 1.0f, sc_a, m_a, ramp));
  EXPECT_EQ(out.back().values[0], 0.0f);            // sub-block 0: 1·0 − 0
  EXPECT_EQ(out.back().values[15], 15.0f);          // 1·15 − 0
  EXPECT_EQ(out.back().values[32], 63.0f - 63.0f);  // sub-block 1, code (32 + 1) % 16 = 1: 63·1 − 63
  EXPECT_EQ(out.back().values[46], 63.0f * 15 - 63.0f);  // code (46 + 1) % 16 = 15
  EXPECT_EQ(out.back().values[255], 40.0f * 6 - 3.0f);   // sub-block 7, code (255 + 7) % 16 = 6
  EXPECT_EQ(out.back().bytes[16], 0x10);  // element 0 (code 0) low, element 32 (code 1) high
  // (b) negative d = −1 with the largest dmin 65504: −sc·code − 65504·m, exact (< 2^23).
  const int sc_b[8] = {63, 0, 1, 62, 31, 32, 15, 16};
  const int m_b[8] = {63, 1, 0, 2, 33, 47, 48, 31};
  out.push_back(Q4KBlock(0xBC00, -1.0f, 0x7BFF, 65504.0f, sc_b, m_b, ramp));
  EXPECT_EQ(out.back().values[15], -63.0f * 15 - 65504.0f * 63);
  // (c) subnormal d = 2^-24, dmin = 3·2^-24: (sc·code − 3m)·2^-24, exact.
  out.push_back(Q4KBlock(0x0001, 0x1p-24f, 0x0003, 3 * 0x1p-24f, sc_a, m_b, ramp));
  EXPECT_EQ(out.back().values[15], (15.0f - 3 * 63) * 0x1p-24f);
  // (d) d = 1/3 in f16 (0x3555 = 0.333251953125) and dmin = 0x2E66 (0.0999755859375): d1·code − m1
  // rounds; codes 15 − ramp.
  std::vector<int> down(256);
  for (int e = 0; e < 256; ++e) down[e] = 15 - ramp[e];
  out.push_back(Q4KBlock(0x3555, 0.333251953125f, 0x2E66, 0.0999755859375f, sc_b, m_a, down));
  // (e) d = −0, dmin = +0: (−0·sc)·code − 0·m = −0 everywhere.
  out.push_back(Q4KBlock(0x8000, -0.0f, 0x0000, 0.0f, sc_a, m_a, ramp));
  EXPECT_TRUE(std::signbit(out.back().values[7]));
  return out;
}

}  // namespace kvq::test
