// Known-answer Q6_K blocks for the weight-type conformance suite: bytes packed here from chosen
// int8 sub-block scales and per-element 6-bit codes the way ggml's quantize_row_q6_K_ref packs
// them (not by kvq's decoder or encoder), values from those parameters as ggml computes them
// (d·sc·(code − 32) in f32, exact), with literal spot checks.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// d as f16 bits (and its f32 value), sc[16], L[256] in [0, 63] (weight = d·sc[e/16]·(L[e] − 32)).
inline KnownBlock Q6KBlock(uint16_t d_bits, float d, const int (&sc)[16], const std::vector<int>& L) {
  std::vector<uint8_t> ql(128), qh(64);
  for (int j = 0, o = 0; j < 256; j += 128, o += 1) {  // ggml's quantize_row_q6_K_ref packing
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[64 * o + l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[64 * o + l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[32 * o + l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                            ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
  }
  KnownBlock k;
  for (uint8_t b : ql) k.bytes.push_back(b);
  for (uint8_t b : qh) k.bytes.push_back(b);
  for (int j = 0; j < 16; ++j) k.bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(sc[j])));
  for (uint8_t b : U16(d_bits)) k.bytes.push_back(b);
  for (int e = 0; e < 256; ++e) k.values.push_back(d * static_cast<float>(sc[e / 16]) * static_cast<float>(L[e] - 32));
  return k;
}

inline std::vector<KnownBlock> Q6_KKnownBlocks() {
  std::vector<KnownBlock> out;
  // Codes: a ramp over 0..63 shifted per 16 (0 and 63 appear, every quarter's bit positions used).
  std::vector<int> ramp(256);
  for (int e = 0; e < 256; ++e) ramp[e] = (5 * e + e / 16) % 64;
  // (a) d = 1: value = sc·(L − 32), 16 distinct scales including −128, 127, 0 and −1.
  const int sc_a[16] = {1, -128, 127, 0, -1, 2, 3, -4, 50, -50, 64, -64, 7, 100, -100, 33};
  out.push_back(Q6KBlock(0x3C00, 1.0f, sc_a, ramp));
  EXPECT_EQ(out.back().values[0], -32.0f);               // L = 0
  EXPECT_EQ(out.back().values[16], -128.0f * (17 - 32));  // L = (80 + 1) % 64 = 17
  EXPECT_EQ(out.back().values[255], 33.0f * (((5 * 255 + 15) % 64) - 32));
  EXPECT_EQ(out.back().bytes[0], 0x40);    // ql[0]: element 0 (L 0) low, element 64 (L 324 % 64 = 4) high
  // qh[l] holds the top 2 bits of elements l, l+32, l+64, l+96 at bits 0, 2, 4, 6:
  EXPECT_EQ(out.back().bytes[128], 0x88);       // L 0, 34, 4, 38 -> 0, 2, 0, 2
  EXPECT_EQ(out.back().bytes[128 + 12], 0x87);  // L 60, 30, 0, 34 -> 3, 1, 0, 2
  // (b) the largest d = 65504 with the extreme codes: 65504·127·(−32) and 65504·(−128)·31, exact.
  std::vector<int> ends(256);
  for (int e = 0; e < 256; ++e) ends[e] = e % 2 == 0 ? 0 : 63;
  const int sc_b[16] = {127, -128, 1, -1, 127, -128, 1, -1, 127, -128, 1, -1, 127, -128, 1, -1};
  out.push_back(Q6KBlock(0x7BFF, 65504.0f, sc_b, ends));
  EXPECT_EQ(out.back().values[0], -266208256.0f);  // 65504·127·−32
  EXPECT_EQ(out.back().values[17], -259919872.0f);  // 65504·−128·31
  // (c) a negative subnormal d = −2^-24.
  out.push_back(Q6KBlock(0x8001, -0x1p-24f, sc_a, ramp));
  EXPECT_EQ(out.back().values[0], 32 * 0x1p-24f);
  // (d) d = −0: −0·sc·(L − 32) is ±0 by the signs of sc and L − 32.
  out.push_back(Q6KBlock(0x8000, -0.0f, sc_b, ends));
  EXPECT_TRUE(std::signbit(out.back().values[1]));   // (−0·127)·31
  EXPECT_FALSE(std::signbit(out.back().values[0]));  // (−0·127)·−32
  return out;
}

}  // namespace kvq::test
