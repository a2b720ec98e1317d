// Known-answer blocks for Q1_0 (src/weights/q1_0/q1_0.h): f16 d, then 128 sign bits, element j at
// bit j % 8 of byte 2 + j / 8, set -> +d, clear -> −d. The expected values are chosen first and
// the bytes packed from them (the encoder's direction, not the decoder's), with literal spot
// checks of the packed bytes.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// d's bits, then the 16 bytes packed from `plus` (element j's bit set where plus[j]).
inline KnownBlock Q1_0Pack(uint16_t d_bits, const std::vector<bool>& plus, const std::vector<float>& values) {
  KnownBlock k{U16(d_bits), values};
  k.bytes.resize(18, 0);
  for (int j = 0; j < 128; ++j) {
    if (plus[j]) k.bytes[2 + j / 8] |= static_cast<uint8_t>(1u << (j % 8));
  }
  return k;
}

inline std::vector<KnownBlock> Q1_0KnownBlocks() {
  std::vector<KnownBlock> out;
  // (a) d = 1: + where j % 3 == 0, so every activation sub-block (elements 0-31, 32-63, 64-95,
  // 96-127) and every bit position of a byte holds both signs.
  std::vector<bool> plus(128);
  std::vector<float> values(128);
  for (int j = 0; j < 128; ++j) {
    plus[j] = j % 3 == 0;
    values[j] = plus[j] ? 1.0f : -1.0f;
  }
  out.push_back(Q1_0Pack(0x3C00, plus, values));
  EXPECT_EQ(out.back().bytes[2], 0x49);   // elements 0, 3, 6
  EXPECT_EQ(out.back().bytes[3], 0x92);   // elements 9, 12, 15
  EXPECT_EQ(out.back().bytes[17], 0x49);  // elements 120, 123, 126
  // (b) d = −0: set bits give −0, clear bits −(−0) = +0; alternate bits (0x55 in every byte).
  std::vector<bool> alt(128);
  std::vector<float> zeros(128);
  for (int j = 0; j < 128; ++j) {
    alt[j] = j % 2 == 0;
    zeros[j] = alt[j] ? -0.0f : 0.0f;
  }
  out.push_back(Q1_0Pack(0x8000, alt, zeros));
  EXPECT_EQ(out.back().bytes[2], 0x55);
  // (c) the largest f16 scale 65504: only elements 0 and 127 positive.
  std::vector<bool> ends(128, false);
  ends[0] = ends[127] = true;
  std::vector<float> big(128, -65504.0f);
  big[0] = big[127] = 65504.0f;
  out.push_back(Q1_0Pack(0x7BFF, ends, big));
  EXPECT_EQ(out.back().bytes[2], 0x01);
  EXPECT_EQ(out.back().bytes[17], 0x80);
  // (d) a negative subnormal scale d = −2^-24: set -> −2^-24, clear -> +2^-24; the last
  // activation sub-block (elements 96-127) all set, the others clear.
  std::vector<bool> last(128, false);
  std::vector<float> tiny(128, 0x1p-24f);
  for (int j = 96; j < 128; ++j) last[j] = true, tiny[j] = -0x1p-24f;
  out.push_back(Q1_0Pack(0x8001, last, tiny));
  EXPECT_EQ(out.back().bytes[14], 0xFF);
  EXPECT_EQ(out.back().bytes[13], 0x00);
  return out;
}

}  // namespace kvq::test
