// Known-answer Q4_1 blocks for the weight-type conformance suite: bytes built from chosen
// nibbles, values worked out from weight = d·n + m (exact unless a case says how it rounds).
#pragma once

#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// d, m (f16 bits), then qs: byte j holds element j (low nibble) and j + 16 (high nibble).
inline KnownBlock Q4_1Block(uint16_t d_bits, uint16_t m_bits, const std::vector<uint8_t>& qs,
                            const std::vector<float>& values) {
  KnownBlock k{U16(d_bits), values};
  const std::vector<uint8_t> m = U16(m_bits);
  k.bytes.insert(k.bytes.end(), m.begin(), m.end());
  k.bytes.insert(k.bytes.end(), qs.begin(), qs.end());
  return k;
}

inline std::vector<KnownBlock> Q4_1KnownBlocks() {
  std::vector<KnownBlock> out;
  // The ramp: byte j = j | (15 − j) << 4, so nibble j in element j and 15 − j in element 16 + j.
  std::vector<uint8_t> ramp(16);
  for (int j = 0; j < 16; ++j) ramp[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  // (a) d = 1, m = −8: element j = j − 8, element 16 + j = 7 − j (nibbles 0 and 15 at both ends).
  std::vector<float> a(32);
  for (int j = 0; j < 16; ++j) a[j] = static_cast<float>(j - 8), a[16 + j] = static_cast<float>(7 - j);
  out.push_back(Q4_1Block(0x3C00, 0xC800, ramp, a));
  // (b) d = −0.25, m = 1 (a negative scale): 1 − n/4, so element 0 = 1, element 15 = −2.75,
  // element 16 = −2.75, element 31 = 1.
  std::vector<float> b(32);
  for (int j = 0; j < 16; ++j) b[j] = 1.0f - 0.25f * j, b[16 + j] = 1.0f - 0.25f * (15 - j);
  out.push_back(Q4_1Block(0xB400, 0x3C00, ramp, b));
  // (c) d = −0, m = −0: n·(−0) = −0 and −0 + −0 = −0 for every nibble.
  out.push_back(Q4_1Block(0x8000, 0x8000, ramp, std::vector<float>(32, -0.0f)));
  // (d) d = −0, m = +0: −0 + +0 = +0 for every nibble.
  out.push_back(Q4_1Block(0x8000, 0x0000, ramp, std::vector<float>(32, 0.0f)));
  // (e) the largest scale and min, d = 65504, m = −65504: byte 0 = 0xF0 (element 0: n = 0 ->
  // −65504; element 16: n = 15 -> 14·65504 = 917056), the other bytes 0x11 (n = 1 -> 0).
  std::vector<uint8_t> ends(16, 0x11);
  ends[0] = 0xF0;
  std::vector<float> e(32, 0.0f);
  e[0] = -65504.0f, e[16] = 917056.0f;
  out.push_back(Q4_1Block(0x7BFF, 0xFBFF, ends, e));
  // (f) the add rounds: d = 1024, m = 2^-24 (the smallest subnormal), every byte 0xF0: elements
  // 0..15 (n = 0) are 2^-24; elements 16..31 (n = 15) are 15360 + 2^-24, which rounds to 15360
  // (the f32 spacing at 15360 is 2^-10).
  std::vector<float> f(32);
  for (int j = 0; j < 16; ++j) f[j] = 0x1p-24f, f[16 + j] = 15360.0f;
  out.push_back(Q4_1Block(0x6400, 0x0001, std::vector<uint8_t>(16, 0xF0), f));
  // (g) the smallest subnormal scale d = 2^-24, m = −1, the ramp: n·2^-24 − 1 = −(2^24 − n)·2^-24,
  // exact in f32 (24 significant bits); element 15 (n = 15) = −0x1.ffffe2p-1.
  std::vector<float> g(32);
  for (int j = 0; j < 16; ++j) {
    g[j] = static_cast<float>((j - 16777216.0) * 0x1p-24);
    g[16 + j] = static_cast<float>((15 - j - 16777216.0) * 0x1p-24);
  }
  out.push_back(Q4_1Block(0x0001, 0xBC00, ramp, g));
  return out;
}

}  // namespace kvq::test
