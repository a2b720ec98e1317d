// Known-answer blocks for Q2_0 (src/weights/q2_0/q2_0.h): f16 d, then 64 2-bit codes, element j
// at bits 2·(j % 4) of byte 2 + j / 4, weight = (code − 1)·d. The codes and values are chosen
// first and the bytes packed from them, with literal spot checks; code 3 (+2d, which the
// reference quantiser never writes) appears in every case.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

inline KnownBlock Q2_0Pack(uint16_t d_bits, const std::vector<int>& codes, const std::vector<float>& values) {
  KnownBlock k{U16(d_bits), values};
  k.bytes.resize(18, 0);
  for (int j = 0; j < 64; ++j) k.bytes[2 + j / 4] |= static_cast<uint8_t>(codes[j] << (2 * (j % 4)));
  return k;
}

inline std::vector<KnownBlock> Q2_0KnownBlocks() {
  std::vector<KnownBlock> out;
  // (a) d = 1: code (j + j / 4) % 4, so every code sits at every position of a byte and in both
  // activation sub-blocks (elements 0-31, 32-63); codes 0, 1, 2, 3 -> −1, 0, 1, 2.
  const float by_code[4] = {-1.0f, 0.0f, 1.0f, 2.0f};
  std::vector<int> codes(64);
  std::vector<float> values(64);
  for (int j = 0; j < 64; ++j) {
    codes[j] = (j + j / 4) % 4;
    values[j] = by_code[codes[j]];
  }
  out.push_back(Q2_0Pack(0x3C00, codes, values));
  EXPECT_EQ(out.back().bytes[2], 0xE4);   // codes 0, 1, 2, 3
  EXPECT_EQ(out.back().bytes[3], 0x39);   // codes 1, 2, 3, 0
  EXPECT_EQ(out.back().bytes[17], 0x93);  // elements 60-63: codes 3, 0, 1, 2
  // (b) d = −0: −0·(code − 1) is +0 for code 0 (−0·−1) and −0 for codes 1, 2, 3.
  std::vector<float> zeros(64);
  for (int j = 0; j < 64; ++j) zeros[j] = codes[j] == 0 ? 0.0f : -0.0f;
  out.push_back(Q2_0Pack(0x8000, codes, zeros));
  // (c) d = 65504: element 0 code 3 -> 131008, element 63 code 0 -> −65504, the rest code 1 -> +0.
  std::vector<int> ends(64, 1);
  ends[0] = 3, ends[63] = 0;
  std::vector<float> big(64, 0.0f);
  big[0] = 131008.0f, big[63] = -65504.0f;
  out.push_back(Q2_0Pack(0x7BFF, ends, big));
  EXPECT_EQ(out.back().bytes[2], 0x57);
  EXPECT_EQ(out.back().bytes[17], 0x15);
  EXPECT_EQ(out.back().bytes[9], 0x55);
  // (d) d = −2^-24 (subnormal, negative), same codes: element 0 -> −2^-23, element 63 -> +2^-24,
  // code 1 -> −2^-24·0 = −0.
  std::vector<float> tiny(64, -0.0f);
  tiny[0] = -0x1p-23f, tiny[63] = 0x1p-24f;
  out.push_back(Q2_0Pack(0x8001, ends, tiny));
  return out;
}

}  // namespace kvq::test
