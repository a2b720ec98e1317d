// Known-answer Q5_0 blocks for the weight-type conformance suite: bytes built from chosen codes,
// values worked out from weight = d·code (exact in f32).
#pragma once

#include <cstdint>
#include <vector>

#include "test_util/known_block.h"

namespace kvq::test {

// The 5-bit values n[32] of a Q5_0/Q5_1 block as ggml stores them: qh (little-endian uint32,
// bit i = bit 4 of n[i]), then qs (byte j = low 4 bits of n[j] | low 4 bits of n[j + 16] << 4).
inline std::vector<uint8_t> FiveBitBytes(const std::vector<int>& n) {
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>(n[i] >> 4 & 1) << i;
  std::vector<uint8_t> out(20);  // [qh: 4][qs: 16]
  for (int k = 0; k < 4; ++k) out[k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) out[4 + j] = static_cast<uint8_t>((n[j] & 0x0F) | (n[j + 16] & 0x0F) << 4);
  return out;
}

// n_i = 7·i mod 32: every 5-bit value once, in an order whose high bits (n ≥ 16 at i = 3, 4, 7,
// 8, 9, 12, 13, 16, 17, 18, 21, 22, 26, 27, 30, 31) are neither a half nor a run: qh = 0xCC673398,
// so a wrong qh bit order or half shows (tests/weights/q5_test.cc checks that qh). Element 0 has n = 0 and element 9 has n = 31.
inline std::vector<int> FiveBitPermutation() {
  std::vector<int> n(32);
  for (int i = 0; i < 32; ++i) n[i] = 7 * i % 32;
  return n;
}

inline KnownBlock Q5_0Block(uint16_t d_bits, const std::vector<int>& n, const std::vector<float>& values) {
  KnownBlock k{U16(d_bits), values};
  const std::vector<uint8_t> rest = FiveBitBytes(n);
  k.bytes.insert(k.bytes.end(), rest.begin(), rest.end());
  return k;
}

inline std::vector<KnownBlock> Q5_0KnownBlocks() {
  std::vector<KnownBlock> out;
  const std::vector<int> n = FiveBitPermutation();
  // (a) d = 1: element i = n_i − 16, so element 0 = −16 (code −16) and element 9 = 15.
  std::vector<float> a(32);
  for (int i = 0; i < 32; ++i) a[i] = static_cast<float>(n[i] - 16);
  out.push_back(Q5_0Block(0x3C00, n, a));
  // (b) d = −2: element i = −2·(n_i − 16), element 0 = 32, element 9 = −30.
  std::vector<float> b(32);
  for (int i = 0; i < 32; ++i) b[i] = -2.0f * static_cast<float>(n[i] - 16);
  out.push_back(Q5_0Block(0xC000, n, b));
  // (c) d = −0: −0·c is −0 for c ≥ 0 (n ≥ 16) and +0 for c < 0.
  std::vector<float> c(32);
  for (int i = 0; i < 32; ++i) c[i] = n[i] >= 16 ? -0.0f : 0.0f;
  out.push_back(Q5_0Block(0x8000, n, c));
  // (d) d = 65504 with element 0 at n = 0 (−16·65504 = −1048064), element 31 at n = 31
  // (15·65504 = 982560) and the rest at n = 16 (0).
  std::vector<int> ends(32, 16);
  ends[0] = 0, ends[31] = 31;
  std::vector<float> e(32, 0.0f);
  e[0] = -1048064.0f, e[31] = 982560.0f;
  out.push_back(Q5_0Block(0x7BFF, ends, e));
  // (e) the smallest subnormal scale 2^-24, same codes: −16·2^-24 = −2^-20 and 15·2^-24.
  std::vector<float> f(32, 0.0f);
  f[0] = -0x1p-20f, f[31] = 15.0f * 0x1p-24f;
  out.push_back(Q5_0Block(0x0001, ends, f));
  return out;
}

}  // namespace kvq::test
