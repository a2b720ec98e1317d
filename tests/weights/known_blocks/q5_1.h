// Known-answer Q5_1 blocks for the weight-type conformance suite: bytes built from chosen 5-bit
// values, values worked out from weight = d·n + m (exact unless a case says how it rounds).
#pragma once

#include <cstdint>
#include <vector>

#include "test_util/known_block.h"
#include "weights/known_blocks/q5_0.h"  // FiveBitBytes, FiveBitPermutation

namespace kvq::test {

inline KnownBlock Q5_1Block(uint16_t d_bits, uint16_t m_bits, const std::vector<int>& n,
                            const std::vector<float>& values) {
  KnownBlock k{U16(d_bits), values};
  const std::vector<uint8_t> m = U16(m_bits), rest = FiveBitBytes(n);
  k.bytes.insert(k.bytes.end(), m.begin(), m.end());
  k.bytes.insert(k.bytes.end(), rest.begin(), rest.end());
  return k;
}

inline std::vector<KnownBlock> Q5_1KnownBlocks() {
  std::vector<KnownBlock> out;
  const std::vector<int> n = FiveBitPermutation();  // qh = 0xCC673398, checked in Q5_0KnownBlocks
  // (a) d = 1, m = −16: element i = n_i − 16, element 0 = −16, element 9 = 15.
  std::vector<float> a(32);
  for (int i = 0; i < 32; ++i) a[i] = static_cast<float>(n[i] - 16);
  out.push_back(Q5_1Block(0x3C00, 0xCC00, n, a));
  // (b) d = −0.5, m = 3 (a negative scale): 3 − n_i/2, element 0 = 3, element 9 = −12.5.
  std::vector<float> b(32);
  for (int i = 0; i < 32; ++i) b[i] = 3.0f - 0.5f * static_cast<float>(n[i]);
  out.push_back(Q5_1Block(0xB800, 0x4200, n, b));
  // (c) d = −0, m = −0: every element −0.
  out.push_back(Q5_1Block(0x8000, 0x8000, n, std::vector<float>(32, -0.0f)));
  // (d) d = 65504, m = −65504: element 0 at n = 0 (−65504), element 31 at n = 31
  // (30·65504 = 1965120), the rest at n = 1 (0).
  std::vector<int> ends(32, 1);
  ends[0] = 0, ends[31] = 31;
  std::vector<float> e(32, 0.0f);
  e[0] = -65504.0f, e[31] = 1965120.0f;
  out.push_back(Q5_1Block(0x7BFF, 0xFBFF, ends, e));
  // (e) the add rounds: d = 1024, m = 2^-24, elements 0..15 at n = 0 (2^-24) and 16..31 at
  // n = 31 (31744 + 2^-24, which rounds to 31744: the f32 spacing there is 2^-9).
  std::vector<int> halves(32, 0);
  std::vector<float> f(32, 0x1p-24f);
  for (int i = 16; i < 32; ++i) halves[i] = 31, f[i] = 31744.0f;
  out.push_back(Q5_1Block(0x6400, 0x0001, halves, f));
  // (f) the smallest subnormal scale d = 2^-24, m = −1: n·2^-24 − 1 = −(2^24 − n)·2^-24, exact
  // in f32; element 9 (n = 31) = −0x1.ffffc2p-1.
  std::vector<float> g(32);
  for (int i = 0; i < 32; ++i) g[i] = static_cast<float>((n[i] - 16777216.0) * 0x1p-24);
  out.push_back(Q5_1Block(0x0001, 0xBC00, n, g));
  return out;
}

}  // namespace kvq::test
