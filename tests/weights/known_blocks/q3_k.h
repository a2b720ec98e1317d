// Known-answer Q3_K blocks for the weight-type conformance suite: bytes packed here from chosen
// sub-block scales and per-element codes the way ggml's quantize_row_q3_K_ref packs them (not by
// kvq's decoder or encoder), values from those parameters as ggml computes them ((d·sc)·code in
// f32, exact), with literal spot checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// d as f16 bits (and f32 value), sc[16] ∈ [−32, 31], code[256] ∈ [−4, 3].
inline KnownBlock Q3KBlock(uint16_t d_bits, float d, const int (&sc)[16], const std::vector<int>& code) {
  uint8_t scales[12] = {}, hmask[32] = {}, qs[64] = {};
  for (int j = 0; j < 16; ++j) {  // ggml's packing of the scales
    int l = sc[j] + 32;
    if (j < 8) {
      scales[j] = static_cast<uint8_t>(l & 0xF);
    } else {
      scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
    }
    l >>= 4;
    scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
  }
  int L[256];
  for (int j = 0; j < 256; ++j) L[j] = code[j] + 4;
  int m = 0;
  uint8_t hm = 1;
  for (int j = 0; j < 256; ++j) {  // the high bit of the first 32 codes into bit 0, and so on
    if (L[j] > 3) hmask[m] |= hm, L[j] -= 4;
    if (++m == 32) m = 0, hm = static_cast<uint8_t>(hm << 1);
  }
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
  KnownBlock k;
  for (uint8_t b : hmask) k.bytes.push_back(b);
  for (uint8_t b : qs) k.bytes.push_back(b);
  for (uint8_t b : scales) k.bytes.push_back(b);
  for (uint8_t b : U16(d_bits)) k.bytes.push_back(b);
  for (int e = 0; e < 256; ++e) {
    const float dl = d * static_cast<float>(sc[e / 16]);
    k.values.push_back(dl * static_cast<float>(code[e]));
  }
  return k;
}

inline std::vector<KnownBlock> Q3_KKnownBlocks() {
  std::vector<KnownBlock> out;
  std::vector<int> ramp(256);  // −4..3 in every sub-block, shifted per sub-block
  for (int e = 0; e < 256; ++e) ramp[e] = (e + e / 16) % 8 - 4;
  const int sc_a[16] = {-32, 31, 0, -1, 1, 17, -17, 30, -30, 5, -5, 16, -16, 8, 2, -9};
  // (a) d = 1: sc·code, every scale position distinct, both extremes.
  out.push_back(Q3KBlock(0x3C00, 1.0f, sc_a, ramp));
  EXPECT_EQ(out.back().values[0], 128.0f);           // −32·−4
  EXPECT_EQ(out.back().values[16 + 6], 31.0f * 3);   // sub-block 1, code (22 + 1) % 8 − 4 = 3
  EXPECT_EQ(out.back().bytes[96], 0x20);             // scales[0]: u 0 (sc 0 = −32) low, u 2 (sc 8 = −30) high
  EXPECT_EQ(out.back().bytes[96 + 8], 0x48);  // scales[8]: top 2 bits of u[0, 4, 8, 12] = 0, 33, 2, 16
  // (b) the largest d = 65504: 65504·−32·−4 = 8384512, exact.
  out.push_back(Q3KBlock(0x7BFF, 65504.0f, sc_a, ramp));
  EXPECT_EQ(out.back().values[0], 8384512.0f);
  // (c) a negative subnormal d = −2^-24.
  out.push_back(Q3KBlock(0x8001, -0x1p-24f, sc_a, ramp));
  EXPECT_EQ(out.back().values[0], -128 * 0x1p-24f);
  // (d) d = −0: ±0 by the signs of sc·code.
  out.push_back(Q3KBlock(0x8000, -0.0f, sc_a, ramp));
  EXPECT_TRUE(std::signbit(out.back().values[0]));    // (−0·−32)·−4 = +0·−4 = −0
  EXPECT_FALSE(std::signbit(out.back().values[16]));  // (−0·31)·code (16 + 1) % 8 − 4 = −3: +0
  return out;
}

}  // namespace kvq::test
